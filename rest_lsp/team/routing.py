"""Serve's request router for a team's server: each workspace on one replica, new workspaces on the emptiest.

Serve's consistent-hash router keeps a workspace on its replica, but hashing a handful of workspaces over two
replicas often puts two on one while the other idles (it did in bench_serve). This one keeps Serve's routing loop
and its session header, and places a workspace it has not seen on the live replica holding the fewest (ties by a
rendezvous hash), where it stays while that replica lives: a dead replica's workspaces alone move, and a new
replica takes new workspaces. The table is this router's: the server runs one HTTP proxy (HeadOnly), so one table.
Replica side only (imports ray); the custom-router API is alpha, hence Ray's pinned version.
"""

from __future__ import annotations

from collections import Counter

from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter, _hash_bytes


class WorkspaceRouter(ConsistentHashRouter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._placed: dict[str, object] = {}  # workspace -> ReplicaID

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if not candidate_replicas:
            return []
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # a busy replica: wait for it, do not move
        key = self._routing_key(pending_request)
        if key is None:
            return [candidate_replicas]
        live = {r.replica_id: r for r in candidate_replicas}
        placed = self._placed.get(key)
        if placed not in live:
            held = Counter(p for p in self._placed.values() if p in live)
            placed = min(live, key=lambda rid: (held[rid], _hash_bytes(f"{key}:{rid.unique_id}".encode())))
            self._placed[key] = placed
        return [[live[placed]]]
