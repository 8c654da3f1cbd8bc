"""What followed the matched suffix: its occurrences' continuations, grouped, counted and weighted.

Two ways to the same result. A handful of occurrences (the usual case for a long match) is read
with plain Python over memoryviews, where numpy's fixed cost per call would dominate; many (a short,
common match: up to `max_matches`) are gathered and grouped as arrays. Both order equal weights (or
counts) by the same 64-bit hash of the continuation, so either one gives the same list in the same order.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from functools import lru_cache
from operator import mul
from typing import Callable, Sequence

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
    weights_rank_like_counts: bool = False
    _tops: dict = field(default_factory=dict, compare=False, repr=False)   # top's answers, if asked again

    def top(self, *, by_weight: bool, limit: int | None) -> list[tuple[tuple[int, ...], float | int]]:
        """(continuation, weight or count), largest first; ties keep the hash order."""
        answer = self._tops.get((by_weight, limit))
        if answer is None:
            answer = self._tops[by_weight, limit] = self._top(by_weight, limit)
        return list(answer)

    def _top(self, by_weight: bool, limit: int | None) -> list[tuple[tuple[int, ...], float | int]]:
        values = self.weights if by_weight else self.counts
        if self.rows is None:
            order = sorted(range(len(values)), key=values.__getitem__, reverse=True)   # stable, reversed too
            return [(self.tokens[i], values[i]) for i in order[:limit]]
        order = _ranking(self.counts if self.weights_rank_like_counts or not by_weight else values)[:limit]
        chosen = self.rows[order]
        lengths = np.count_nonzero(chosen, axis=1).tolist()
        return [(tuple(r[:k]), v) for r, k, v in zip((chosen - np.uint32(1)).tolist(), lengths, values[order].tolist())]


def _ranking(values: np.ndarray) -> np.ndarray:
    """np.argsort(-values, kind="stable"); small counts take numpy's radix sort (int16)."""
    if values.dtype.kind == "i" and values.shape[0] and values.max() < 1 << 15:
        return np.argsort(-values.astype(np.int16), kind="stable")
    return np.argsort(-values, kind="stable")


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
    offsets = np.arange(length)
    blocks, block_weights = [], []
    for hit, rows in picked:
        seg = hit.segment
        rsa = seg.rsa[rows.start:rows.stop] if isinstance(rows, range) else seg.rsa[rows]
        single = seg.single_source
        if hit.needs_live_check or single is None:
            docs = np.searchsorted(seg.doc_starts, (seg.n - 1) - rsa.astype(np.int64), side="right") - 1
            if hit.needs_live_check:
                alive = seg.live[docs]
                rsa, docs = rsa[alive], docs[alive]
        # Occurrence i continues at forward position n - rsa[i]; clipping lands on the final SEP.
        idx = (seg.n + offsets) - rsa[:, None].astype(np.int64)                # [occ, L]
        blocks.append(np.take(seg.tokens, idx, mode="clip"))
        block_weights.append(weight_of_source[single] if single is not None else weight_of_source[seg.sources[docs]])
    toks = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    rows = toks + np.uint32(1)                   # token + 1; SEP wraps to 0 ...
    rows *= np.logical_and.accumulate(rows, axis=1)   # ... and so does all that follows it (the next document)
    keep = rows[:, 0] != 0                      # a match at the very end of a document continues with nothing
    all_kept = bool(keep.all())
    if not all_kept:
        rows = rows[keep]
    if rows.shape[0] == 0:
        return Found(depth, [], [], tokens=[])
    uniq, counts, inverse = _group_rows(rows)
    shared = {float(w) if np.ndim(w) == 0 else None for w in block_weights}
    if len(shared) == 1 and (w := shared.pop()) is not None and w.is_integer() and w > 0:
        # One positive whole-number weight for all: a sum of `count` copies is exact, so the product is the
        # same bits, and the weights rank like the counts.
        return Found(depth, counts, counts * w, rows=uniq, weights_rank_like_counts=True)
    w = np.concatenate([np.broadcast_to(np.asarray(w, dtype=np.float64), (b.shape[0],))
                        for w, b in zip(block_weights, blocks)])
    weights = np.bincount(inverse(), weights=w if all_kept else w[keep], minlength=uniq.shape[0])
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


def _group_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, Callable[[], np.ndarray]]:
    """Distinct rows in hash order, their counts, and (on demand) each row's group.

    Hashing first avoids np.unique(axis=0)'s lexicographic sort of whole rows.
    """
    h = rows.astype(np.uint64) @ _hash_power_array(rows.shape[1])       # [rows] wraps modulo 2**64
    order = np.argsort(h)
    hs = h[order]
    same = hs[1:] == hs[:-1]                   # [rows - 1] same hash as the row before, in hash order
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    sorted_rows = rows[order]
    if same.any() and not np.array_equal(sorted_rows[1:][same], sorted_rows[:-1][same]):
        # A 64-bit collision: group exactly instead.
        uniq, inverse, counts = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
        return uniq, counts, lambda: inverse.ravel()

    def inverse() -> np.ndarray:
        groups = np.empty_like(order)
        groups[order] = np.cumsum(np.concatenate(([0], ~same)))
        return groups

    return sorted_rows[starts], np.diff(starts, append=rows.shape[0]), inverse
