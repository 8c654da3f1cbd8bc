"""The contract between whatever proposes draft tokens and the decoder, and the simple sources.

A draft source sees token ids only. Given the tokens so far it returns the continuations it has seen after their
longest matching suffix, each with a weight (a count, or a count scaled by how close its source is to the user).
The decoder merges them into one draft tree; it never asks where they came from.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

import numpy as np

Continuation = tuple[tuple[int, ...], float]

MAX_SUFFIX = 16
CONTINUATION_LENGTH = 10
MAX_MATCHES = 2000

_SEP = -1  # between streams: equals no token, so a match or a continuation never crosses it


class DraftSource(Protocol):
    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        """Continuations of the longest suffix of `context` found, heaviest first."""
        ...


class NoDrafts:
    """Plain autoregressive decoding: every tree is empty."""

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        return []


def _longest_match_continuations(
    corpus: np.ndarray, candidates: np.ndarray, query: np.ndarray, max_suffix: int, length: int, max_matches: int
) -> list[Continuation]:
    """`candidates` are corpus positions holding query[-1]; keep those matching the longest suffix of `query`.

    Each survivor contributes the tokens after it, up to `length`, cut at a stream separator.
    """
    if candidates.size == 0:
        return []
    matched = np.ones(candidates.size, dtype=np.int64)
    alive = np.ones(candidates.size, dtype=bool)
    for k in range(1, min(max_suffix, len(query))):
        pos = candidates - k
        ok = alive & (pos >= 0)
        ok[ok] = corpus[pos[ok]] == query[-1 - k]
        if not ok.any():
            break
        matched[ok] += 1
        alive = ok
    best = matched.max()
    starts = candidates[matched == best][-max_matches:] + 1  # most recent occurrences when capped
    counts: dict[tuple[int, ...], float] = {}
    for s in starts.tolist():
        cont = corpus[s : s + length]
        cut = np.nonzero(cont == _SEP)[0]
        if cut.size:
            cont = cont[: cut[0]]
        if cont.size:
            key = tuple(cont.tolist())
            counts[key] = counts.get(key, 0.0) + 1.0
    return sorted(counts.items(), key=lambda kv: -kv[1])


class ContextLookup:
    """Prompt lookup over the context itself: the prompt plus everything generated so far."""

    def __init__(self, max_suffix: int = MAX_SUFFIX, length: int = CONTINUATION_LENGTH, max_matches: int = MAX_MATCHES):
        self.max_suffix, self.length, self.max_matches = max_suffix, length, max_matches

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        if len(context) < 2:
            return []
        ctx = np.asarray(context, dtype=np.int64)
        # the last position is the query itself, never its own match
        candidates = np.nonzero(ctx[:-1] == ctx[-1])[0]
        return _longest_match_continuations(ctx, candidates, ctx, self.max_suffix, self.length, self.max_matches)


class NgramDrafts:
    """An in-memory index of fixed token streams (the files of a folder, a prompt); streams never run together."""

    def __init__(
        self,
        streams: Iterable[Sequence[int]],
        max_suffix: int = MAX_SUFFIX,
        length: int = CONTINUATION_LENGTH,
        max_matches: int = MAX_MATCHES,
    ):
        parts: list[np.ndarray] = []
        for s in streams:
            parts.append(np.asarray(s, dtype=np.int64))
            parts.append(np.array([_SEP], dtype=np.int64))
        self.corpus = np.concatenate(parts) if parts else np.array([], dtype=np.int64)
        # positions grouped by token: one sort now, a binary search per query
        self._order = np.argsort(self.corpus, kind="stable")
        self._sorted = self.corpus[self._order]
        self.max_suffix, self.length, self.max_matches = max_suffix, length, max_matches

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        if not len(context):
            return []
        last = context[-1]
        lo, hi = np.searchsorted(self._sorted, [last, last + 1])
        candidates = self._order[lo:hi]  # ascending: the sort was stable
        query = np.asarray(context[-self.max_suffix :], dtype=np.int64)
        return _longest_match_continuations(
            self.corpus, candidates, query, self.max_suffix, self.length, self.max_matches
        )


class MixedDrafts:
    """Several sources in one tree. Each source's weights are scaled to sum to its own weight, so a big, distant
    corpus with thousands of matches cannot drown the few, more relevant matches of the current file."""

    def __init__(self, sources: Sequence[tuple[DraftSource, float]]):
        self.sources = list(sources)

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        merged: dict[tuple[int, ...], float] = {}
        for source, weight in self.sources:
            found = source.continuations(context)
            total = sum(w for _, w in found)
            if total <= 0:
                continue
            for tokens, w in found:
                merged[tokens] = merged.get(tokens, 0.0) + weight * w / total
        return sorted(merged.items(), key=lambda kv: -kv[1])


# The context (prompt + generated text) is the closest source to what comes next; the workspace adds what the
# context has never seen. measurements.md: global counts alone do worse than the prompt alone.
CONTEXT_WEIGHT = 2.0
WORKSPACE_WEIGHT = 1.0


def context_and_workspace(workspace: DraftSource) -> MixedDrafts:
    """The drafts REST uses everywhere: the context itself, then the workspace datastore."""
    return MixedDrafts([(ContextLookup(), CONTEXT_WEIGHT), (workspace, WORKSPACE_WEIGHT)])
