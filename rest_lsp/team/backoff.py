"""How long the editor waits before it asks a server that said no again: doubling from the first wait up to a cap,
back to the first once an attempt succeeds."""

from __future__ import annotations


class Backoff:
    def __init__(self, first_s: float, most_s: float):
        self.first_s, self.most_s = first_s, most_s
        self._next = first_s

    def next(self) -> float:
        """The wait before the next attempt; each call doubles the one after it, up to the cap."""
        wait, self._next = self._next, min(self._next * 2, self.most_s)
        return wait

    def reset(self) -> None:
        self._next = self.first_s
