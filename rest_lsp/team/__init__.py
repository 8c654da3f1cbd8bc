"""A team's decoding service: editors keep their files and send token deltas; replicas hold each workspace's state.

protocol.py: the wire format. workspaces.py: a replica's per-workspace state (own datastore, outputs, caches) and
its LRU. app.py: the FastAPI app a replica serves. token.py: the bearer token. remote.py, mirror.py, http.py: the
editor's side, the service interface server.py calls, over HTTP; with identity.py (a workspace's id and key),
upload_client.py (snapshots in compressed chunks), advice.py (what a refusal or a TLS failure is said as) and
backoff.py. routing.py, deployment.py: Ray Serve (replica side only: the editor's modules never import ray).

Knows: workspaces as token ids, documents as text, HTTP, the completion service, the engine's model loading.
Never imports: `rest_lsp.commands`, `rest_lsp.server`, `rest_lsp.cli`, `lsprotocol`, `pygls`.
"""
