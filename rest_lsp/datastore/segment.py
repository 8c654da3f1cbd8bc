"""An immutable segment: the tokens of many documents and a suffix array over them, reversed.

Layout of `tokens` (uint32, so any vocabulary fits):  SEP d0 SEP d1 SEP ... SEP d_last SEP.
SEP is the largest uint32; no token id may take it, so no query ever matches across a document
boundary and every continuation stops at the end of its document.

The suffix array is built over the *reversed* token array. A query asks for the longest suffix of
its context; reversed, that is the longest prefix of the reversed context, which one left-to-right
narrowing of the suffix array finds in a single pass (no retry per suffix length).

Deleted documents are tombstones in `live`. A segment never changes: deleting makes a new
Segment object that shares every array except `live` (so a reader holding the old one is unaffected).
"""

from __future__ import annotations

import uuid
from bisect import bisect_left
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Sequence

import numpy as np
from pydivsufsort import divsufsort

SEP = np.uint32(0xFFFFFFFF)
MAX_TOKEN_ID = int(SEP) - 1
# Below this many candidate rows, one vectorised comparison beats further binary searches.
VECTOR_ROWS = 64


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

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.rsa.nbytes + self.doc_starts.nbytes + self.sources.nbytes
                   + self.bucket_tokens.nbytes + self.bucket_starts.nbytes + self.live.nbytes)

    def doc_tokens(self, i: int) -> np.ndarray:
        return self.tokens[self.doc_starts[i]: self.doc_starts[i + 1] - 1]

    def without(self, doc_indices: Sequence[int]) -> "Segment":
        live = self.live.copy()
        live[list(doc_indices)] = False
        return replace(self, live=live)

    def docs_of(self, forward_positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.doc_starts, forward_positions, side="right") - 1

    # --- search --------------------------------------------------------------------------
    def match(self, rpattern: np.ndarray, rlist: list[int]) -> "Hit | None":
        """Longest prefix of the reversed context `rpattern` that occurs in a live document.

        `rpattern[0]` is the last context token, so that prefix is the longest context suffix. Returns the depth reached and the rows of the
        suffix array (a range, or explicit rows) whose occurrences have that depth, or None.
        """
        d_max = len(rlist)
        k = int(np.searchsorted(self.bucket_tokens, rpattern[0]))
        if k == self.bucket_tokens.shape[0] or self.bucket_tokens[k] != rpattern[0]:
            return None
        lo, hi = int(self.bucket_starts[k]), int(self.bucket_starts[k + 1])
        ranges = [(lo, hi)]              # ranges[d - 1]: rsa rows whose first d reversed tokens match
        tmv = _ints(self.tokens)
        smv = _ints(self.rsa)
        last = self.n - 1
        d = 1
        while d < d_max and hi - lo > VECTOR_ROWS:
            # Within [lo, hi) the suffixes share d tokens, so they are sorted by their (d+1)-th.
            m = last - d
            t = rlist[d]
            key = lambda r: tmv[m - r]  # noqa: E731 - the reversed token at depth d
            nlo = bisect_left(smv, t, lo, hi, key=key)
            nhi = bisect_left(smv, t + 1, nlo, hi, key=key)
            if nlo == nhi:
                break
            lo, hi = nlo, nhi
            ranges.append((lo, hi))
            d += 1
        if d < d_max and hi - lo <= VECTOR_ROWS:
            hit = self._finish_vectorised(lo, hi, d, rpattern)
            if hit is not None:
                return hit
        # Walk back from the deepest range until one holds a live occurrence.
        for depth in range(len(ranges), 0, -1):
            lo, hi = ranges[depth - 1]
            if self.all_live or self._range_has_live(lo, hi):
                return Hit(self, depth, lo, hi, None)
        return None

    def _finish_vectorised(self, lo: int, hi: int, d: int, rpattern: np.ndarray) -> "Hit | None":
        rows = np.arange(lo, hi)
        starts = (self.n - 1) - self.rsa[lo:hi].astype(np.int64)       # [rows] forward pos of last ctx token
        cols = np.arange(d, len(rpattern))
        idx = np.maximum(starts[:, None] - cols[None, :], 0)           # [rows, cols]; tokens[0] is SEP
        eq = self.tokens[idx] == rpattern[None, d:]
        lcp = d + np.cumprod(eq, axis=1, dtype=np.int8).sum(axis=1, dtype=np.int64)  # [rows]
        if not self.all_live:
            alive = self.live[self.docs_of(starts)]
            lcp = np.where(alive, lcp, 0)
        best = int(lcp.max())
        if best == 0:
            return None
        return Hit(self, best, lo, hi, rows[lcp >= best])

    def _range_has_live(self, lo: int, hi: int) -> bool:
        chunk = 4096
        for a in range(lo, hi, chunk):
            pos = (self.n - 1) - self.rsa[a: min(hi, a + chunk)].astype(np.int64)
            if self.live[self.docs_of(pos)].any():
                return True
        return False


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

    def sample(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward start positions of the continuations (at most `limit`, evenly spread) and their docs."""
        seg = self.segment
        size = self.size
        picks = np.linspace(0, size - 1, limit).astype(np.int64) if size > limit else np.arange(size)
        rows = self.rows[picks] if self.rows is not None else self.lo + picks
        last_ctx = (seg.n - 1) - seg.rsa[rows].astype(np.int64)
        docs = seg.docs_of(last_ctx)
        if self.rows is None and not seg.all_live:
            keep = seg.live[docs]
            last_ctx, docs = last_ctx[keep], docs[keep]
        return last_ctx + 1, docs


def _ints(arr: np.ndarray) -> memoryview:
    # memoryview indexing yields plain ints ~3x faster than numpy scalar indexing in the bisect loop.
    return memoryview(arr).cast("B").cast({1: "B", 2: "H", 4: "I" if arr.dtype.kind == "u" else "i", 8: "q"}[arr.itemsize])


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
    rsa, bucket_tokens, bucket_starts = _suffix_array_of_reversed(tokens)
    return Segment(
        name=name or new_segment_name(),
        tokens=tokens,
        rsa=rsa,
        doc_starts=doc_starts,
        doc_ids=tuple(d for d, _, _ in docs),
        sources=np.fromiter((s for _, _, s in docs), dtype=np.uint8, count=len(docs)),
        bucket_tokens=bucket_tokens,
        bucket_starts=bucket_starts,
        live=np.ones(len(docs), dtype=bool),
    )


def _suffix_array_of_reversed(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Dense ranks keep the order of token ids but let divsufsort sort 2 bytes per token, not 4.
    distinct, ranks = np.unique(tokens, return_inverse=True)
    dense = ranks.astype(np.uint16 if distinct.shape[0] <= 1 << 16 else np.uint32)[::-1]
    if dense.shape[0] == 1:
        rsa = np.zeros(1, dtype=np.int32)
    else:
        rsa = divsufsort(np.ascontiguousarray(dense))
    if rsa.dtype != np.int32 and tokens.shape[0] < 1 << 31:
        rsa = rsa.astype(np.int32)
    counts = np.bincount(ranks.ravel(), minlength=distinct.shape[0])
    bucket_starts = np.zeros(distinct.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=bucket_starts[1:])
    return rsa, distinct.astype(np.uint32), bucket_starts
