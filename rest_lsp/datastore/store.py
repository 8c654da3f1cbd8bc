"""The datastore: live segments, the document table, queries, and background merges.

Readers take `self._view` (one attribute read) and work on that immutable tuple of segments;
writers build new segments, then swap in a new view under the writer lock. A query therefore sees
every change entirely or not at all, and never waits for a writer or a merge.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..priority import lower_this_thread
from .gather import PYTHON_ROWS, Found, gather, gather_small
from .segment import MAX_TOKEN_ID, Hit, Segment, build_segment, new_segment_name

log = logging.getLogger(__name__)

# A failing background merge is retried after 1 s, then 2, 4, ... at most 5 minutes: never a spinning core.
MERGE_RETRY_S = 1.0
MERGE_RETRY_MAX_S = 300.0
_clock = time.monotonic

# Costly query results kept per view: ~60 KB each (1,024 occurrences), so ~4 MB at most.
FOUND_CACHE = 64

Continuation = tuple[tuple[int, ...], float]


class Source(enum.Enum):
    """Where a document comes from; nearer sources weigh more (docs/how-it-works.md, the sources)."""
    CURRENT_FILE = 0
    OPEN_BUFFER = 1
    ACCEPTED = 2
    WORKSPACE = 3

    @property
    def default_weight(self) -> float:
        return _DEFAULT_WEIGHTS[self]


_DEFAULT_WEIGHTS = {Source.CURRENT_FILE: 8.0, Source.OPEN_BUFFER: 3.0, Source.ACCEPTED: 3.0, Source.WORKSPACE: 1.0}


@dataclass(frozen=True)
class Lookup:
    match_length: int
    continuations: list[tuple[tuple[int, ...], float]]   # (tokens that followed, occurrences or weight), most first


@dataclass(frozen=True)
class _View:
    segments: tuple[Segment, ...] = ()
    # Results of the costly queries (many occurrences: a short, common suffix such as "):\n" recurs all the
    # time), keyed by the suffix array ranges they came from; they live and die with this view.
    found: dict = field(default_factory=dict, compare=False, repr=False)


class Datastore:
    """A token index of many documents that answers `continuations` and follows puts and removes."""

    def __init__(self, *, max_suffix: int = 16, max_matches: int = 256, continuation_length: int = 10,
                 max_continuations: int = 128, weights: Mapping[Source, float] | None = None, merge_factor: int = 4,
                 background_merges: bool = True):
        if max_suffix < 1 or max_matches < 1 or continuation_length < 1 or merge_factor < 2:
            raise ValueError("max_suffix, max_matches and continuation_length must be positive, merge_factor >= 2.")
        self.max_suffix = max_suffix
        self.max_matches = max_matches
        self.continuation_length = continuation_length
        # The decoder keeps ~16 tree nodes: an even sample of 256 occurrences ranks them as well as 1,024 did, and
        # keeps short matches' query time flat at millions of tokens (benchmarks/bench_datastore.py); building
        # thousands of tuples it will drop is not free.
        self.max_continuations = max_continuations
        self.merge_factor = merge_factor
        w = dict(_DEFAULT_WEIGHTS)
        w.update(weights or {})
        self._weights = np.array([w[s] for s in Source], dtype=np.float64)   # indexed by Source.value
        self._weight_list = self._weights.tolist()
        self._view = _View()
        self._docs: dict[str, tuple[str, int]] = {}    # doc id -> (segment name, doc index in it)
        self._lock = threading.RLock()                 # writers only
        self._found_lock = threading.Lock()            # readers filling the view's result cache
        self._merging: set[str] = set()                # segment names taken by a running merge
        self._background = background_merges
        self._merge_wanted = threading.Condition(self._lock)
        self._merges_running = 0
        self._closed = False
        self._merger: threading.Thread | None = None
        self._failures = 0                             # background merges failed in a row
        self._retry_at = 0.0                           # no background merge before this time (_clock)

    # --- writes ------------------------------------------------------------------------
    def put(self, doc_id: str, tokens: Sequence[int], source: Source = Source.WORKSPACE) -> None:
        """Add a document, or replace it (its old tokens are never returned again)."""
        self.apply([(doc_id, tokens, source)], ())

    def remove(self, doc_id: str) -> None:
        self.apply((), [doc_id])

    def apply(self, puts: Sequence[tuple[str, Sequence[int], Source]], removes: Iterable[str] = ()) -> None:
        """Puts and removes as one change: a query sees all of it or none of it."""
        prepared = [(doc_id, as_tokens(doc_id, toks), Source(src)) for doc_id, toks, src in puts]
        seen: dict[str, int] = {}
        for i, (doc_id, _, _) in enumerate(prepared):
            seen[doc_id] = i                      # the last put of an id in one batch wins
        prepared = [prepared[i] for i in sorted(seen.values())]
        segment = build_segment([(d, t, s.value) for d, t, s in prepared]) if prepared else None
        with self._lock:
            dead: dict[str, list[int]] = {}
            for doc_id in [*removes, *(d for d, _, _ in prepared)]:
                where = self._docs.pop(doc_id, None)
                if where is not None:
                    dead.setdefault(where[0], []).append(where[1])
            segments = [s.without(dead[s.name]) if s.name in dead else s for s in self._view.segments]
            if segment is not None:
                segments.append(segment)
                for i, doc_id in enumerate(segment.doc_ids):
                    self._docs[doc_id] = (segment.name, i)
            self._view = _View(tuple(s for s in segments if s.live_docs or s.name in self._merging))
            self._want_merge()

    def remove_oldest(self, prefix: str, keep: int) -> int:
        """Remove the documents whose id starts with `prefix`, all but the `keep` put last; returns how many.

        Bounds documents that keep coming (accepted completions) so the store does not grow for the whole run.
        """
        with self._lock:
            ids = [d for d in self._docs if d.startswith(prefix)]      # in the order they were (last) put
            old = ids[:max(0, len(ids) - keep)]
            if old:
                self.apply((), old)
            return len(old)

    def install(self, segments: Sequence[Segment]) -> list[Segment]:
        """Add segments loaded from disk; a document already present here keeps its current version.

        Returns the segments as installed: one whose name is taken already (the same file saved in two
        roots' folders) gets a new name, because tombstones, merges and the document table go by name.
        """
        with self._lock:
            added = []
            names = {s.name for s in self._view.segments} | self._merging
            for seg in segments:
                if seg.name in names:
                    seg = replace(seg, name=new_segment_name())
                names.add(seg.name)
                dead = [i for i, d in enumerate(seg.doc_ids) if seg.live[i] and d in self._docs]
                seg = seg.without(dead) if dead else seg
                for i, doc_id in enumerate(seg.doc_ids):
                    if seg.live[i]:
                        self._docs[doc_id] = (seg.name, i)
                if seg.live_docs:
                    added.append(seg)
            self._view = _View(self._view.segments + tuple(added))
            self._want_merge()
            return added

    # --- reads -------------------------------------------------------------------------
    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._docs

    def doc_ids(self) -> list[str]:
        with self._lock:
            return list(self._docs)

    def document_tokens(self, doc_id: str) -> np.ndarray | None:
        """The tokens the datastore holds for `doc_id` (a view: never write to it), or None."""
        with self._lock:
            where = self._docs.get(doc_id)
            segments = self._view.segments
        if where is None:
            return None
        for seg in segments:
            if seg.name == where[0]:
                return seg.doc_tokens(where[1])
        return None

    def segments(self) -> tuple[Segment, ...]:
        return self._view.segments

    def stats(self) -> dict:
        segs = self._view.segments
        tokens = sum(s.live_tokens for s in segs)
        nbytes = sum(s.nbytes for s in segs)
        return {
            "documents": sum(s.live_docs for s in segs),
            "tokens": tokens,
            "segments": len(segs),
            "stored_tokens": sum(s.n for s in segs),
            "bytes": nbytes,
            "bytes_per_token": nbytes / tokens if tokens else 0.0,
        }

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        """Continuations of the longest context suffix found, weighted by source, heaviest first."""
        found = self._query(context)
        if found is None:
            return []
        return found.top(by_weight=True, limit=self.max_continuations)

    def lookup(self, context: Sequence[int], limit: int | None = None, weighted: bool = False) -> Lookup:
        """The matched suffix length and what followed it (all, or the top `limit`): raw occurrence counts, or
        counts weighted by source when `weighted`."""
        found = self._query(context)
        if found is None:
            return Lookup(0, [])
        return Lookup(found.depth, found.top(by_weight=weighted, limit=limit))

    def _query(self, context: Sequence[int]) -> Found | None:
        rlist = _reversed_ids(context[-self.max_suffix:] if len(context) else [])
        if rlist is None:
            return None
        hits: list[Hit] = []
        view = self._view
        for seg in view.segments:
            hit = seg.match(rlist)
            if hit is not None:
                hits.append(hit)
        if not hits:
            return None
        depth = max(h.depth for h in hits)
        hits = [h for h in hits if h.depth == depth]
        total = sum(h.size for h in hits)
        if total > PYTHON_ROWS:
            key = (depth, *((id(h.segment), h.lo, h.hi) for h in hits))    # the view holds those segments
            found = view.found.get(key)
            if found is None:
                found = self._gather(depth, hits, total)
                with self._found_lock:
                    if len(view.found) >= FOUND_CACHE:
                        del view.found[next(iter(view.found))]           # the oldest
                    view.found[key] = found
            return found
        return self._gather(depth, hits, total)

    def _gather(self, depth: int, hits: list[Hit], total: int) -> Found:
        picked = [(h, h.picks(h.size)) for h in hits] if total <= self.max_matches else self._sample(hits)
        if sum(len(rows) for _, rows in picked) <= PYTHON_ROWS:
            return gather_small(depth, picked, self.continuation_length, self._weight_list)
        return gather(depth, picked, self.continuation_length, self._weights)

    def _sample(self, hits: list[Hit]) -> list[tuple[Hit, np.ndarray | range]]:
        """At most ~`max_matches` live occurrences, each hit's share in proportion to its live occurrences.

        Tombstones are skipped before sampling, not after: one live match among many dead ones is kept.
        A hit's live count is exact for a range short enough to read, else estimated from an even probe.
        """
        cap = self.max_matches
        probes: list[tuple[np.ndarray, int] | None] = []
        estimates: list[float] = []
        for i, h in enumerate(hits):
            if h.needs_live_check and h.size <= cap:
                hits[i] = h = h.listed()
            if not h.needs_live_check:
                probes.append(None)
                estimates.append(h.size)
                continue
            probe = h.probe(cap)
            if probe.shape[0] == 0:            # the range has live rows (see Segment.match), but too few to probe
                hits[i] = h = h.listed()
                probes.append(None)
                estimates.append(h.size)
                continue
            probes.append((probe, cap))
            estimates.append(h.size * probe.shape[0] / cap)
        live_total = sum(estimates)
        picked = []
        for h, probe, estimate in zip(hits, probes, estimates):
            if live_total <= cap:
                h = h.listed()
                picked.append((h, h.picks(h.size)))
                continue
            limit = max(1, round(cap * estimate / live_total))
            if probe is None:
                picked.append((h, h.picks(limit)))
            else:
                rows = h.live_picks(limit, *probe)
                picked.append((replace(h, rows=rows), rows))        # listed rows: no second live check
        return picked

    # --- merges ------------------------------------------------------------------------
    def merge_all(self) -> None:
        """Merge every segment into one now (drops dead documents); queries keep running meanwhile.

        After `close()` it does nothing.
        """
        self.wait_for_merges()
        with self._lock:
            if self._closed:
                return
            inputs = [s for s in self._view.segments if s.name not in self._merging]
            if len(inputs) < 2 and all(s.all_live for s in inputs):
                return
            self._merging.update(s.name for s in inputs)
            self._merges_running += 1
        self._run_merge(inputs)

    def wait_for_merges(self, timeout: float | None = None) -> bool:
        """Block until no merge is running or due; True if so within `timeout`.

        After `close()`, or while failed merges back off, no merge is due.
        """
        with self._lock:
            return self._merge_wanted.wait_for(
                lambda: self._merges_running == 0 and (not self._background or self._closed or self._backing_off()
                                                       or not self._pick_merge()), timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._merge_wanted.notify_all()
        if self._merger is not None:
            self._merger.join()

    def _tier(self, seg: Segment) -> int:
        # Segments within a factor `merge_factor` of each other share a tier (Lucene's tiered policy).
        return int(math.log(max(seg.live_tokens, 1) / 1024 + 1, self.merge_factor))

    def _pick_merge(self) -> list[Segment]:
        free = [s for s in self._view.segments if s.name not in self._merging]
        tiers: dict[int, list[Segment]] = {}
        for s in free:
            if s.live_tokens * 2 < s.n - s.doc_count - 1 and s.n > 4096:
                return [s]           # mostly tombstones: rewrite it alone
            tiers.setdefault(self._tier(s), []).append(s)
        for tier in sorted(tiers):
            if len(tiers[tier]) >= self.merge_factor:
                return tiers[tier][: self.merge_factor]
        return []

    def _want_merge(self) -> None:
        if not self._background or self._closed:
            return
        if self._merger is None:
            self._merger = threading.Thread(target=self._merge_loop, name="datastore-merge", daemon=True)
            self._merger.start()
        self._merge_wanted.notify_all()

    def _merge_loop(self) -> None:
        lower_this_thread()
        while (inputs := self._next_merge()) is not None:
            self._merge_or_back_off(inputs)     # empties `inputs`: nothing of them is kept while waiting

    def _next_merge(self) -> list[Segment] | None:
        """Wait for a merge to be due and take its inputs; None once closed."""
        with self._lock:
            while not self._closed:
                wait = self._retry_at - _clock()
                if wait > 0:
                    self._merge_wanted.wait(wait)      # backing off after a failure
                elif self._pick_merge():
                    break
                else:
                    self._merge_wanted.wait()
            if self._closed:
                return None
            inputs = self._pick_merge()
            self._merging.update(s.name for s in inputs)
            self._merges_running += 1
            return inputs

    def _merge_or_back_off(self, inputs: list[Segment]) -> None:
        try:
            self._run_merge(inputs)
            self._failures = 0
        except Exception:       # a failed merge loses nothing: its inputs stay in the view
            self._failures += 1
            delay = min(MERGE_RETRY_S * 2 ** (self._failures - 1), MERGE_RETRY_MAX_S)
            log.exception("Segment merge failed (%d in a row); next try in %.0f s.", self._failures, delay)
            with self._lock:
                self._retry_at = _clock() + delay
                self._merge_wanted.notify_all()

    def _backing_off(self) -> bool:
        return self._retry_at > _clock()

    def _run_merge(self, inputs: list[Segment]) -> None:
        """Merge `inputs` into one segment and swap it in. Empties `inputs` before the merge counts as done,
        so no reference to them (their arrays, memory maps of deleted files) outlives it."""
        names = {s.name for s in inputs}
        try:
            merged = _merged(inputs)
            with self._lock:
                segments = [s for s in self._view.segments if s.name not in names]
                if merged is not None:
                    # Documents replaced or removed while the merge ran stay dead in the result.
                    sources = {(s.name, i) for s in inputs for i in range(s.doc_count)}
                    dead = []
                    for i, doc_id in enumerate(merged.doc_ids):
                        where = self._docs.get(doc_id)
                        if where is not None and where in sources:
                            self._docs[doc_id] = (merged.name, i)
                        else:
                            dead.append(i)
                    if dead:
                        merged = merged.without(dead)
                    if merged.live_docs:
                        segments.append(merged)
                self._view = _View(tuple(segments))
        finally:
            inputs.clear()
            with self._lock:
                self._merging.difference_update(names)
                self._merges_running -= 1
                self._merge_wanted.notify_all()


def _merged(inputs: list[Segment]) -> Segment | None:
    docs = [(seg.doc_ids[i], seg.doc_tokens(i), int(seg.sources[i]))
            for seg in inputs for i in range(seg.doc_count) if seg.live[i]]
    return build_segment(docs) if docs else None


def _reversed_ids(context: Sequence[int]) -> list[int] | None:
    """The context's token ids last first, up to the first that is no token id (negative, or 2**32 - 1 and
    above: no document holds one, so nothing before it can match); None if nothing is left or the context
    holds anything but integers."""
    if type(context) is list or type(context) is tuple:
        # The editor's usual list of ints, checked without numpy's conversions.
        rlist = list(context[::-1])
        if rlist and all(type(t) is int for t in rlist):
            if min(rlist) < 0 or max(rlist) > MAX_TOKEN_ID:
                rlist = rlist[:next(i for i, t in enumerate(rlist) if t < 0 or t > MAX_TOKEN_ID)]
            return rlist or None
    arr = np.asarray(context)
    if arr.ndim != 1 or not arr.size or arr.dtype.kind not in "iu":
        return None
    rev = arr[::-1]
    bad = np.flatnonzero((rev < 0) | (rev > MAX_TOKEN_ID))
    if bad.size:
        rev = rev[:bad[0]]
    return rev.tolist() or None


def as_tokens(doc_id: str, tokens: Sequence[int]) -> np.ndarray:
    """The document's tokens as uint32, or ValueError in one sentence if they are not all token ids."""
    arr = np.asarray(tokens)
    if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() > MAX_TOKEN_ID)):
        raise ValueError(f"Document {doc_id!r} must be a flat sequence of token ids between 0 and {MAX_TOKEN_ID}.")
    return arr.astype(np.uint32, copy=False)
