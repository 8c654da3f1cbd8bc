"""Serve's request router for a team's server: each workspace on one replica, new workspaces on the emptiest.

Serve's consistent-hash router keeps a workspace on its replica, but hashing a handful of workspaces over two
replicas often puts two on one while the other idles (it did in bench_serve). This one keeps Serve's routing loop
and its session header, and places a workspace it has not seen on the live replica holding the fewest (ties by a
rendezvous hash), where it stays while that replica lives: a dead replica's workspaces alone move, and a new
replica takes new workspaces. The table is this router's: the server runs one HTTP proxy (HeadOnly), so one table.
It forgets a workspace once its editor closes it (the last request's session header ends in protocol.CLOSING:
routed as the workspace's, then forgotten, so closed workspaces never count when new ones are placed), one not seen
for IDLE_S, the least recently seen beyond MOST_PLACED, and those of a replica
gone (every editor start is a new workspace id): one that comes back is placed again, and sends its snapshot to
its new replica if that is another.
Replica side only (imports ray); the custom-router API is alpha, hence Ray's pinned version.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from typing import Callable, Iterable

from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter, _hash_bytes

from rest_lsp.team.protocol import CLOSING

IDLE_S = 12 * 3600  # a workspace unseen this long (an editor closed, a night) is forgotten
MOST_PLACED = 10_000  # workspaces remembered at most; the least recently seen go first


class Placements:
    """workspace -> replica id, least recently seen first, bounded by `idle_s` and `most`."""

    def __init__(self, idle_s: float = IDLE_S, most: int = MOST_PLACED, clock: Callable[[], float] = time.monotonic):
        self.idle_s, self.most, self._clock = idle_s, most, clock
        self._placed: OrderedDict[str, tuple[object, float]] = OrderedDict()  # workspace -> (replica, last seen)

    def __len__(self) -> int:
        return len(self._placed)

    def place(self, key: str, live: Iterable) -> object:
        """The replica of workspace `key` among the `live` replica ids: its own while that lives, else the one
        holding the fewest workspaces (ties by a rendezvous hash of the two)."""
        live = list(live)
        now = self._clock()
        self._forget_idle(now)
        if key.endswith(CLOSING):  # the workspace's last request: to its replica, then forgotten
            base = key[: -len(CLOSING)]
            found = self._placed.pop(base, None)
            return found[0] if found is not None and found[0] in live else self._emptiest(base, live)
        found = self._placed.pop(key, None)
        placed = found[0] if found is not None else None
        if placed not in live:
            placed = self._emptiest(key, live)
        self._placed[key] = (placed, now)  # the most recently seen last
        while len(self._placed) > self.most:
            self._placed.popitem(last=False)
        return placed

    def _emptiest(self, key: str, live: list) -> object:
        held = Counter(p for p, _ in self._placed.values())
        return min(live, key=lambda rid: (held[rid], _hash_bytes(f"{key}:{_unique(rid)}".encode())))

    def keep_only(self, replicas: Iterable) -> None:
        """Forget the workspaces of replicas no longer among `replicas` (they died or were scaled away)."""
        alive = set(replicas)
        for key in [k for k, (rid, _) in self._placed.items() if rid not in alive]:
            del self._placed[key]

    def _forget_idle(self, now: float) -> None:
        while self._placed:
            key, (_, seen) = next(iter(self._placed.items()))
            if now - seen <= self.idle_s:
                return
            del self._placed[key]


def _unique(replica_id) -> str:
    return getattr(replica_id, "unique_id", str(replica_id))


class WorkspaceRouter(ConsistentHashRouter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._placements = Placements()

    def update_replicas(self, replicas) -> None:
        super().update_replicas(replicas)
        self._placements.keep_only(self._replica_id_set)

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if not candidate_replicas:
            return []
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # a busy replica: wait for it, do not move
        key = self._routing_key(pending_request)
        if key is None:
            return [candidate_replicas]
        live = {r.replica_id: r for r in candidate_replicas}
        return [[live[self._placements.place(key, live)]]]
