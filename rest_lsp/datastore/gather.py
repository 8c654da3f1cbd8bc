"""What followed the matched suffix: its occurrences' continuations, grouped, counted and weighted.

Two ways to the same result. A handful of occurrences (the usual case for a long match) is read
with plain Python over memoryviews, where numpy's fixed cost per call would dominate; many (a short,
common match: up to `max_matches`) are gathered and grouped as arrays. Both order equal weights (or
counts) by the same 64-bit hash of the continuation, so either one gives the same list in the same order.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from operator import mul
from typing import Sequence

import numpy as np

from .segment import SEP_ID, Hit

# At most this many occurrences are read by the Python loop; more go to numpy (crossover measured ~40).
PYTHON_ROWS = 32
_HASH_BASE = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1

Picked = Sequence[tuple[Hit, "np.ndarray | range"]]    # each hit with the rows it contributes


@dataclass(frozen=True)
class Found:
    """The distinct continuations of one query, in ascending order of their hash.

    From the Python path they are tuples in `tokens`; from numpy, rows of token + 1 (0 past the end) in `rows`,
    turned into tuples only for the ones `top` returns.
    """
    depth: int
    counts: list[int] | np.ndarray
    weights: list[float] | np.ndarray
    tokens: list[tuple[int, ...]] | None = None
    rows: np.ndarray | None = None           # [distinct, L] uint32

    def top(self, *, by_weight: bool, limit: int | None) -> list[tuple[tuple[int, ...], float | int]]:
        """(continuation, weight or count), largest first; ties keep the hash order."""
        values = self.weights if by_weight else self.counts
        if self.rows is None:
            order = sorted(range(len(values)), key=values.__getitem__, reverse=True)   # stable, reversed too
            return [(self.tokens[i], values[i]) for i in order[:limit]]
        order = np.argsort(-values, kind="stable")[:limit]
        chosen = self.rows[order]
        lengths = np.count_nonzero(chosen, axis=1).tolist()
        return [(tuple(r[:k]), v) for r, k, v in zip((chosen - np.uint32(1)).tolist(), lengths, values[order].tolist())]


def gather_small(depth: int, picked: Picked, length: int, weight_of_source: list[float]) -> Found:
    """Group the continuations of a few occurrences in plain Python."""
    groups: dict[tuple[int, ...], list] = {}
    for hit, rows in picked:
        seg = hit.segment
        tmv, smv, dsmv = seg.tmv, seg.smv, seg.dsmv
        check_live = hit.needs_live_check
        single = seg.single_source
        need_doc = check_live or single is None
        live, sources = (seg.live_list, seg.source_list) if need_doc else (None, None)
        w = weight_of_source[single] if single is not None else 0.0
        last = seg.n - 1
        for r in (rows.tolist() if isinstance(rows, np.ndarray) else rows):
            p = last - smv[r]                       # forward position of the last context token
            if need_doc:
                doc = bisect_right(dsmv, p) - 1
                if check_live and not live[doc]:
                    continue
                if single is None:
                    w = weight_of_source[sources[doc]]
            cont = tmv[p + 1: p + 1 + length].tolist()
            if SEP_ID in cont:                      # the document ends here
                cont = cont[:cont.index(SEP_ID)]
            if not cont:
                continue
            key = tuple(cont)
            g = groups.get(key)
            if g is None:
                groups[key] = [1, w]
            else:
                g[0] += 1
                g[1] += w
    powers, prefix = _hash_powers(length)
    hashed = sorted(((sum(map(mul, k, powers)) + prefix[len(k)]) & _MASK, k, g) for k, g in groups.items())
    return Found(depth, [g[0] for _, _, g in hashed], [g[1] for _, _, g in hashed], tokens=[k for _, k, _ in hashed])


def gather(depth: int, picked: Picked, length: int, weight_of_source: np.ndarray) -> Found:
    """Group the continuations of many occurrences with numpy."""
    steps = np.arange(1, length + 1)
    blocks, block_weights = [], []
    for hit, rows in picked:
        seg = hit.segment
        rsa = seg.rsa[rows.start:rows.stop] if isinstance(rows, range) else seg.rsa[rows]
        last = (seg.n - 1) - rsa.astype(np.int64)                      # [occ] forward pos of last ctx token
        docs = np.searchsorted(seg.doc_starts, last, side="right") - 1
        if hit.needs_live_check:
            alive = seg.live[docs]
            last, docs = last[alive], docs[alive]
        ends = seg.doc_starts[docs + 1] - 1                           # [occ] the SEP after each document
        keep = last + 1 < ends                   # a match at the very end of a document continues with nothing
        if not keep.all():
            last, docs, ends = last[keep], docs[keep], ends[keep]
        idx = last[:, None] + steps                                    # [occ, L]
        np.minimum(idx, ends[:, None], out=idx)
        blocks.append(seg.tokens[idx])                                 # [occ, L], SEP from the end of the doc on
        single = seg.single_source
        block_weights.append(np.full(docs.shape[0], weight_of_source[single]) if single is not None
                             else weight_of_source[seg.sources[docs]])
    toks = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    if toks.shape[0] == 0:
        return Found(depth, [], [], tokens=[])
    rows = toks + np.uint32(1)               # token + 1, and 0 past the end of the document (SEP wraps)
    uniq, inverse, counts = _group_rows(rows)
    weights = np.bincount(inverse, weights=block_weights[0] if len(blocks) == 1 else np.concatenate(block_weights),
                          minlength=uniq.shape[0])
    return Found(depth, counts, weights, rows=uniq)


@lru_cache(maxsize=8)
def _hash_powers(length: int) -> tuple[list[int], list[int]]:
    # Row j of a continuation holds token + 1 (0 past its end) and weighs BASE ** (length - j).
    powers = [pow(_HASH_BASE, length - j, 1 << 64) for j in range(length)]
    prefix = [0]
    for p in powers:
        prefix.append(prefix[-1] + p)
    return powers, prefix


@lru_cache(maxsize=8)
def _hash_power_array(length: int) -> np.ndarray:
    return np.array(_hash_powers(length)[0], dtype=np.uint64)


def _group_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct rows in hash order, each row's group, group sizes (hashing first: ~5x faster than np.unique)."""
    powers = _hash_power_array(rows.shape[1])
    with np.errstate(over="ignore"):
        h = (rows * powers).sum(axis=1, dtype=np.uint64)          # wraps modulo 2**64
    order = np.argsort(h)
    hs = h[order]
    new_group = np.empty(hs.shape[0], dtype=bool)
    new_group[0] = True
    np.not_equal(hs[1:], hs[:-1], out=new_group[1:])
    group_starts = np.flatnonzero(new_group)
    counts = np.diff(np.append(group_starts, hs.shape[0]))
    inverse = np.empty_like(order)
    inverse[order] = np.cumsum(new_group) - 1
    uniq = rows[order[group_starts]]
    if not np.array_equal(uniq[inverse], rows):       # a 64-bit collision: group exactly instead
        uniq, inverse, counts = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
    return uniq, inverse.ravel(), counts
