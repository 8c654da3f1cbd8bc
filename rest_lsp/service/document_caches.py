"""A KV cache per document: switching back to a file pays only for what changed in it since.

The decoder holds one cache, its last sequence. When a request (or a pre-warm) is for another document than the
one that cache belongs to, the cache is detached and kept here under its document, and the new document's own
cache, if one is kept, goes back into the decoder; the decoder's prefill then reuses its longest common prefix as
always. Kept caches are bounded by memory: the least recently used go first. A cache only ever holds the KV of
the tokens it names, so reusing one changes no answer.

Only the decoding thread switches (`use`); `forget` may come from any thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

CLOSED_NOTED = 256  # closed documents remembered as closed (work for one may still come after its close)


class DocumentCaches:
    def __init__(self):
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, object] = OrderedDict()  # doc id -> decoding.CacheState, oldest first
        self._limit = 0
        self._current: str | None = None  # the document whose cache the decoder holds
        # documents closed and not opened since (the most recent CLOSED_NOTED): their caches are never kept
        self._closed: OrderedDict[str, None] = OrderedDict()
        self.switches = 0
        self.restored = 0  # switches that found the document's cache kept

    def use(self, decoder, doc_id: str, limit_bytes: int) -> None:
        """Make the decoder hold `doc_id`'s cache (or the one it holds, when none is kept) before working on it,
        keeping at most `limit_bytes` of other documents' caches. Decoding thread only."""
        with self._lock:
            self._limit = limit_bytes
            self._evict()
            if doc_id == self._current:
                return
            self.switches += 1
            keep = (self._current is not None and self._current not in self._closed
                    and 0 < decoder.cache_bytes() <= self._limit)
            state = self._kept.pop(doc_id, None)
            if keep:
                self._kept[self._current] = decoder.detach_cache()
            self._current = doc_id
            self._evict()
        if state is not None:
            self.restored += 1
            decoder.attach_cache(state)
        # else the decoder goes on from the cache it holds (or an empty one): its common prefix still counts

    def forget(self, doc_id: str) -> None:
        """The document closed: its kept cache goes, and none is kept for it until it is `opened` again (work for it
        still under way may use the decoder's cache: it serves as a common prefix, as any cache does)."""
        with self._lock:
            self._kept.pop(doc_id, None)
            self._closed[doc_id] = None
            self._closed.move_to_end(doc_id)
            while len(self._closed) > CLOSED_NOTED:
                self._closed.popitem(last=False)

    def opened(self, doc_id: str) -> None:
        """The document is asked for or edited: open (again)."""
        if doc_id in self._closed:
            with self._lock:
                self._closed.pop(doc_id, None)

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(state.nbytes for state in self._kept.values())

    def kept(self) -> list[str]:
        with self._lock:
            return list(self._kept)

    def _evict(self) -> None:
        total = sum(state.nbytes for state in self._kept.values())
        while self._kept and total > self._limit:
            _, state = self._kept.popitem(last=False)
            total -= state.nbytes
