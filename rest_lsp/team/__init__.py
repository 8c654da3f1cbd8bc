"""A team's decoding service: editors keep their files and send token deltas; replicas hold each workspace's state.

protocol.py: the wire format. workspaces.py: a replica's per-workspace state (own datastore, outputs, caches) and
its LRU; edge.py, limits.py, uploads.py: what a body may be, the server's limits, snapshots in chunks. app.py: the
FastAPI app a replica serves (its bearer token: rest_lsp/auth.py). remote.py, mirror.py, http.py: the editor's
side, the service interface the language server calls, over HTTP; with identity.py (a workspace's id and key),
upload_client.py (snapshots in compressed chunks), advice.py (what a refusal or a TLS failure is said as) and
backoff.py. routing.py, deployment.py, ray_local.py: Ray Serve (replica side only: the editor's modules never
import ray).

Knows: workspaces as token ids, documents as text, HTTP, the completion service, the engine's model loading.
Never imports: `rest_lsp.commands`, `rest_lsp.lsp`, `rest_lsp.cli`, `lsprotocol`, `pygls`.
"""
