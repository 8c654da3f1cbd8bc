"""The contract between whatever proposes draft tokens and the decoder.

A draft source sees token ids only. Given the tokens so far it returns the
continuations it has seen after their longest matching suffix, each with a
weight (a count, or a count scaled by how close its source is to the user).
The decoder merges them into one draft tree; it never asks where they came from.
"""

from __future__ import annotations

from typing import Protocol, Sequence

Continuation = tuple[tuple[int, ...], float]


class DraftSource(Protocol):
    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        """Continuations of the longest suffix of `context` found, heaviest first."""
        ...


class NoDrafts:
    """Plain autoregressive decoding: every tree is empty."""

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        return []
