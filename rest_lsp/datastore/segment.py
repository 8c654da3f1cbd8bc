"""An immutable segment: the tokens of many documents and a suffix array over them, reversed.

Layout of `tokens` (uint32, so any vocabulary fits):  SEP d0 SEP d1 SEP ... SEP d_last SEP.
SEP is the largest uint32; no token id may take it, so no query ever matches across a document
boundary and every continuation stops at the end of its document.

The suffix array is built over the *reversed* token array. A query asks for the longest suffix of
its context; reversed, that is the longest prefix of the reversed context, which one left-to-right
narrowing of the suffix array finds in a single pass (no retry per suffix length).

Two tables jump the first two steps of that narrowing: `bucket_*` gives the rows of the suffixes
that start with a token, `pair_*` the rows of those that start with two given tokens (the last two
context tokens). They cost ~0.5 byte per token and replace the widest binary searches.

Deleted documents are tombstones in `live`. A segment never changes: deleting makes a new
Segment object that shares every array except `live` (so a reader holding the old one is unaffected).
"""

from __future__ import annotations

import math
import uuid
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Sequence

import numpy as np
from pydivsufsort import divsufsort

from ..priority import one_openmp_thread

SEP = np.uint32(0xFFFFFFFF)
SEP_ID = int(SEP)
MAX_TOKEN_ID = SEP_ID - 1
# A tombstoned segment's final range of at most this many rows is filtered to its live rows at once.
LIVE_FILTER_ROWS = 64


def new_segment_name() -> str:
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True, eq=False)
class Segment:
    name: str                 # unique; also the file stem when persisted
    tokens: np.ndarray        # [n] uint32, layout above
    rsa: np.ndarray           # [n] int32/int64, suffix array of tokens[::-1]
    doc_starts: np.ndarray    # [docs + 1] int64: doc i is tokens[doc_starts[i] : doc_starts[i+1] - 1]
    doc_ids: tuple[str, ...]
    sources: np.ndarray       # [docs] uint8, Source codes
    bucket_tokens: np.ndarray  # [k] uint32, distinct tokens in ascending order
    bucket_starts: np.ndarray  # [k + 1] int64, rsa range of suffixes starting with each
    bucket_pairs: np.ndarray   # [k + 1] int64, range of pair entries (below) of each bucket
    pair_tokens: np.ndarray    # [m] uint32, the second reversed token of each distinct leading pair
    pair_starts: np.ndarray    # [m + 1] rsa dtype, rsa range of suffixes starting with each pair
    live: np.ndarray          # [docs] bool

    # --- sizes ---------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def doc_count(self) -> int:
        return len(self.doc_ids)

    @property
    def doc_lengths(self) -> np.ndarray:
        return np.diff(self.doc_starts) - 1

    @property
    def live_docs(self) -> int:
        return int(self.live.sum())

    @property
    def live_tokens(self) -> int:
        return int(self.doc_lengths[self.live].sum())

    @cached_property
    def all_live(self) -> bool:
        return bool(self.live.all())

    @cached_property
    def single_source(self) -> int | None:
        """The Source code shared by every document, if they all share one."""
        if self.sources.shape[0] and (self.sources == self.sources[0]).all():
            return int(self.sources[0])
        return None

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.tokens, self.rsa, self.doc_starts, self.sources, self.bucket_tokens,
                                          self.bucket_starts, self.bucket_pairs, self.pair_tokens, self.pair_starts,
                                          self.live)))

    def doc_tokens(self, i: int) -> np.ndarray:
        return self.tokens[self.doc_starts[i]: self.doc_starts[i + 1] - 1]

    def without(self, doc_indices: Sequence[int]) -> "Segment":
        live = self.live.copy()
        live[list(doc_indices)] = False
        return replace(self, live=live)

    def docs_of(self, forward_positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.doc_starts, forward_positions, side="right") - 1

    # --- plain-int views for the query's Python loops ------------------------------------
    # Indexing a memoryview yields Python ints faster than numpy scalar indexing, and bisect over one runs in C;
    # numpy's per-call overhead would dominate a query of ~50 steps.
    @cached_property
    def tmv(self) -> memoryview:
        return _ints(self.tokens)

    @cached_property
    def smv(self) -> memoryview:
        return _ints(self.rsa)

    @cached_property
    def _tables(self) -> tuple[memoryview, ...]:
        return (_ints(self.bucket_tokens), _ints(self.bucket_starts), _ints(self.bucket_pairs),
                _ints(self.pair_tokens), _ints(self.pair_starts))

    @cached_property
    def dsmv(self) -> memoryview:
        return _ints(self.doc_starts)

    @cached_property
    def live_list(self) -> list[bool]:
        return self.live.tolist()

    @cached_property
    def source_list(self) -> list[int]:
        return self.sources.tolist()

    # --- search --------------------------------------------------------------------------
    def match(self, rlist: list[int]) -> "Hit | None":
        """Longest prefix of the reversed context `rlist` that occurs in a live document.

        `rlist[0]` is the last context token, so that prefix is the longest context suffix. Returns the
        depth reached and the suffix array rows (a range, or explicit live rows) whose occurrences have it.
        """
        btok, bstart, bpair, ptok, pstart = self._tables
        t = rlist[0]
        k = bisect_left(btok, t)
        if k == len(btok) or btok[k] != t:
            return None
        lo, hi = bstart[k], bstart[k + 1]
        ranges = [(lo, hi)]              # ranges[d - 1]: rsa rows whose first d reversed tokens match
        d_max = len(rlist)
        if d_max > 1:
            a, b = bpair[k], bpair[k + 1]
            t = rlist[1]
            j = bisect_left(ptok, t, a, b)
            if j < b and ptok[j] == t:
                lo, hi = pstart[j], pstart[j + 1]
                ranges.append((lo, hi))
                self._narrow(rlist, ranges)
        # Walk back from the deepest range until one holds a live occurrence.
        for depth in range(len(ranges), 0, -1):
            lo, hi = ranges[depth - 1]
            if self.all_live:
                return Hit(self, depth, lo, hi, None)
            if hi - lo <= LIVE_FILTER_ROWS:
                rows = self._live_rows(lo, hi)
                if rows.shape[0]:
                    return Hit(self, depth, lo, hi, rows)
            elif self._range_has_live(lo, hi):
                return Hit(self, depth, lo, hi, None)
        return None

    def _narrow(self, rlist: list[int], ranges: list[tuple[int, int]]) -> None:
        """Extend `ranges` depth by depth while some suffix still matches `rlist` (at most to its length)."""
        tmv, smv = self.tmv, self.smv
        last = self.n - 1
        d_max = len(rlist)
        d = len(ranges)
        lo, hi = ranges[-1]
        while d < d_max:
            # Within [lo, hi) the suffixes share d tokens, so they are sorted by their (d+1)-th.
            # The first and the last row bound the rest: where both still match, every row does.
            a = _reach(tmv, last - smv[lo], rlist, d)
            b = _reach(tmv, last - smv[hi - 1], rlist, d) if hi - lo > 1 else a
            if a > d and b > d:
                reach = min(a, b)
                ranges.extend([(lo, hi)] * (reach - d))
                d = reach
                continue
            m = last - d
            t = rlist[d]
            key = lambda r: tmv[m - r]  # noqa: E731 - the reversed token at depth d
            nlo = lo if a > d else bisect_left(smv, t, lo, hi, key=key)
            nhi = hi if b > d else bisect_right(smv, t, nlo, hi, key=key)
            if nlo == nhi:
                return
            lo, hi = nlo, nhi
            ranges.append((lo, hi))
            d += 1

    def _live_rows(self, lo: int, hi: int) -> np.ndarray:
        return self.live_among(np.arange(lo, hi))

    def live_among(self, rows: np.ndarray) -> np.ndarray:
        """The rows (of the suffix array) among `rows` whose occurrence lies in a live document."""
        pos = (self.n - 1) - self.rsa[rows].astype(np.int64)
        return rows[self.live[self.docs_of(pos)]]

    def _range_has_live(self, lo: int, hi: int) -> bool:
        chunk = 4096
        for a in range(lo, hi, chunk):
            pos = (self.n - 1) - self.rsa[a: min(hi, a + chunk)].astype(np.int64)
            if self.live[self.docs_of(pos)].any():
                return True
        return False


def _reach(tmv: memoryview, p: int, rlist: list[int], d: int) -> int:
    """How deep the reversed suffix whose first token sits at forward position `p` matches `rlist`.

    Its first `d` tokens are known to match already.
    """
    d_max = len(rlist)
    # tokens[0] is SEP, which no pattern token equals, so p - d never goes below 0.
    while d < d_max and tmv[p - d] == rlist[d]:
        d += 1
    return d


@dataclass(frozen=True, eq=False)
class Hit:
    """Occurrences of the reversed pattern's first `depth` tokens in one segment."""
    segment: Segment
    depth: int
    lo: int
    hi: int
    rows: np.ndarray | None   # explicit rsa rows (already live-filtered), or None for all of [lo, hi)

    @property
    def size(self) -> int:
        return int(self.rows.shape[0]) if self.rows is not None else self.hi - self.lo

    def picks(self, limit: int) -> np.ndarray | range:
        """Rows of at most `limit` occurrences, evenly spread; only live ones, unless `needs_live_check`."""
        size = self.size
        if size > limit:
            picks = spread(size, limit)
            return self.rows[picks] if self.rows is not None else self.lo + picks
        return self.rows if self.rows is not None else range(self.lo, self.hi)

    @property
    def needs_live_check(self) -> bool:
        return self.rows is None and not self.segment.all_live

    def listed(self) -> "Hit":
        """The same occurrences with their live rows listed (reads the whole range)."""
        if not self.needs_live_check:
            return self
        return Hit(self.segment, self.depth, self.lo, self.hi, self.segment._live_rows(self.lo, self.hi))

    def probe(self, count: int) -> np.ndarray:
        """The live rows among `count` rows evenly spread over a range that holds tombstones."""
        return self.segment.live_among(self.lo + spread(self.size, min(count, self.size)))

    def live_picks(self, limit: int, probe: np.ndarray, probed: int) -> np.ndarray:
        """Rows of `limit` live occurrences evenly spread over the live ones of a range with tombstones.

        `probe` holds the live rows among `probed` evenly spread rows. Dead rows must not take the places of
        live ones, so the spread gets denser until `limit` live rows are found or the whole range is read.
        """
        found, count, size = probe, probed, self.size
        while found.shape[0] < limit and count < size:
            wanted = math.ceil(count * limit / max(found.shape[0], 1) * 1.25)
            count = min(size, max(2 * count, wanted))
            found = self.probe(count)
        if found.shape[0] > limit:
            found = found[spread(found.shape[0], limit)]
        return found


def spread(size: int, limit: int) -> np.ndarray:
    """np.linspace(0, size - 1, limit).astype(np.int64), bit for bit, without its Python overhead."""
    picks = (np.arange(limit, dtype=np.float64) * ((size - 1) / (limit - 1)) if limit > 1
             else np.zeros(1)).astype(np.int64)
    picks[-1] = size - 1 if limit > 1 else 0
    return picks


def _ints(arr: np.ndarray) -> memoryview:
    # memoryview indexing yields plain ints faster than numpy scalar indexing in the bisect loop.
    code = {1: "B", 2: "H", 4: "I", 8: "Q"}[arr.itemsize]
    return memoryview(np.ascontiguousarray(arr)).cast("B").cast(code if arr.dtype.kind == "u" else code.lower())


def build_segment(docs: Sequence[tuple[str, np.ndarray, int]], name: str | None = None) -> Segment:
    """One segment from (doc_id, uint32 tokens, source code) triples."""
    lengths = np.fromiter((len(t) for _, t, _ in docs), dtype=np.int64, count=len(docs))
    n = int(lengths.sum()) + len(docs) + 1
    tokens = np.empty(n, dtype=np.uint32)
    doc_starts = np.empty(len(docs) + 1, dtype=np.int64)
    pos = 0
    for i, (_, toks, _) in enumerate(docs):
        tokens[pos] = SEP
        doc_starts[i] = pos + 1
        tokens[pos + 1: pos + 1 + len(toks)] = toks
        pos += 1 + len(toks)
    tokens[pos] = SEP
    doc_starts[len(docs)] = pos + 1
    rsa, buckets = _suffix_array_of_reversed(tokens)
    return Segment(
        name=name or new_segment_name(),
        tokens=tokens,
        rsa=rsa,
        doc_starts=doc_starts,
        doc_ids=tuple(d for d, _, _ in docs),
        sources=np.fromiter((s for _, _, s in docs), dtype=np.uint8, count=len(docs)),
        **buckets,
        live=np.ones(len(docs), dtype=bool),
    )


def _suffix_array_of_reversed(tokens: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    # Dense ranks keep the order of token ids but let divsufsort sort 2 bytes per token, not 4.
    distinct, ranks = np.unique(tokens, return_inverse=True)
    dense = ranks.astype(np.uint16 if distinct.shape[0] <= 1 << 16 else np.uint32)[::-1]
    n = dense.shape[0]
    if n == 1:
        rsa = np.zeros(1, dtype=np.int32)
    else:
        with one_openmp_thread():  # a team of OpenMP workers kept by this thread would slow the decoder down
            rsa = divsufsort(np.ascontiguousarray(dense))
    if rsa.dtype != np.int32 and n < 1 << 31:
        rsa = rsa.astype(np.int32)
    counts = np.bincount(ranks.ravel(), minlength=distinct.shape[0])
    bucket_starts = np.zeros(distinct.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=bucket_starts[1:])
    return rsa, dict(bucket_tokens=distinct.astype(np.uint32), bucket_starts=bucket_starts,
                     **_pair_table(dense, rsa, bucket_starts, distinct))


def _pair_table(dense: np.ndarray, rsa: np.ndarray, bucket_starts: np.ndarray,
                distinct: np.ndarray) -> dict[str, np.ndarray]:
    """Rows of the suffixes that start with each pair of tokens present (sorted, so each pair is a run)."""
    n = rsa.shape[0]
    # The second token of each suffix; the one-token suffix [SEP] (reversed position n - 1) has none and
    # stands first in the last bucket (SEP's), so it starts a run of its own below.
    padded = np.empty(n + 1, dtype=dense.dtype)
    padded[:n] = dense
    padded[n] = 0
    second = padded[rsa + 1]                      # rsa is int32 only below 2**31 - 1 rows, so + 1 fits
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(second[1:], second[:-1], out=new[1:])
    new[bucket_starts[:-1]] = True
    lone = int(bucket_starts[-2])                 # the [SEP] suffix
    if lone + 1 < n:
        new[lone + 1] = True
    starts = np.flatnonzero(new)
    pair_starts = np.empty(starts.shape[0] + 1, dtype=rsa.dtype)
    pair_starts[:-1] = starts
    pair_starts[-1] = n
    pair_tokens = distinct[second[starts]].astype(np.uint32)
    pair_tokens[starts == lone] = 0
    bucket_pairs = np.searchsorted(starts, bucket_starts).astype(np.int64)
    return dict(bucket_pairs=bucket_pairs, pair_tokens=pair_tokens, pair_starts=pair_starts)
