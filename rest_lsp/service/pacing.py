"""How long a request may take and how long to wait before starting it.

  - `LineBudget`: once a request has run for the time budget, its completion keeps the whole lines it has and stops,
    or ends at the first line end when none is whole yet (llama-server's `t_max_predict_ms`: past the time, stop
    once a line end has been generated; Continue stops after the first line once its budget has passed). A person
    reads whole lines; a half line is worth less than the time it costs. It also stops at a line end when the
    next line, taking as long as the last one did, would end past the deadline: the budget would cut back to that
    line end anyway, and the person would wait for tokens that are thrown away. The
    deadline can only move closer (`by`): work computed ahead gets the long budget, and once a person waits for
    it, the short one counts from their request (llama.vim's two `t_max_predict_ms` values do the same).
  - `TypingPace`: the debounce follows the typing speed (Tabby adapts its debounce the same way). A fast typist's
    next keystroke comes soon, so the decode it would cancel is not worth starting; a slow typist's pause is short.
    The wait is the median gap between the user's recent changes, clamped between the configured debounce and a
    ceiling. Gaps longer than the ceiling are pauses, not typing, and are left out; so are gaps in which the person
    was given a suggestion: that gap is the server's latency plus the person's reading, not their typing (counted,
    a server that answers fast would look like a fast typist and wait longer before its next answer).
    The debounce counts from the last change or answer (`wait_s`): work that starts later, such as the suggestion
    computed at an edit once its prompt is warm, or a request an editor sends after its own debounce, waits only
    what is left of it: a person who has paused that long already is not typing.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Callable

PACE_WINDOW = 10  # recent gaps between changes that set the pace
PAUSE_S = 10.0  # a gap this long is never typing, whatever the ceiling


class LineBudget:
    """Stop rule of one request: once `budget_s` since `start` has passed, keep the whole lines shown so far and
    stop (llama-server's `t_max_predict_ms` rule); with no whole line yet, end at the first line end."""

    def __init__(self, start: float, budget_s: float, clock: Callable[[], float] = time.perf_counter):
        self._deadline = start + budget_s if budget_s > 0 else None
        self._clock = clock
        self.cut_at: int | None = None  # where the completion ends, once the budget ran out and a line end is shown
        self._line_ends = 0  # line ends shown so far
        # when the line in progress began: the last line end seen, or the first check (the first step's tokens; not
        # `start`, which the debounce and the prompt's prefill come after)
        self._line_began: float | None = None

    def stop(self, shown: str) -> bool:
        """Whether decoding can stop, given the text shown so far (stop rules applied, trailing space stripped:
        a line end shows once the next line has text)."""
        if self.cut_at is not None:
            return True
        if self._deadline is None:
            return False
        now = self._clock()
        if self._line_began is None:
            self._line_began = now
        nl = shown.rfind("\n")  # the line in progress is dropped: a person waits, the lines before it are whole
        whole = nl >= 0 and bool(shown[:nl].strip())  # a whole line with text (a completion may begin with a break)
        if now >= self._deadline:
            if not whole:
                return False
            self.cut_at = nl
            return True
        ends = shown.count("\n")
        if whole and ends > self._line_ends:  # line ends just shown: would one more line still fit?
            per_line = (now - self._line_began) / (ends - self._line_ends)
            self._line_ends, self._line_began = ends, now
            if now + per_line > self._deadline:
                self.cut_at = nl
                return True
        return False

    def by(self, deadline: float) -> None:
        """Run out no later than `deadline` (an earlier deadline stays)."""
        if self._deadline is None or deadline < self._deadline:
            self._deadline = deadline

    def cut(self, text: str) -> str:
        """The final text up to the line end where the budget stopped decoding."""
        return text if self.cut_at is None else text[: self.cut_at].rstrip()


class TypingPace:
    """The recent gaps between changes, and the debounce they call for (the caller serializes access)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._gaps: deque[float] = deque(maxlen=PACE_WINDOW)
        self._last: float | None = None
        self._answered = False  # a suggestion went out since the last change
        self._quiet_from: float | None = None  # the last change or answer

    def changed(self) -> None:
        now = self._clock()
        if self._last is not None and 0 <= now - self._last < PAUSE_S and not self._answered:
            self._gaps.append(now - self._last)
        self._last, self._answered, self._quiet_from = now, False, now

    def answered(self) -> None:
        """A request was answered: the gap up to the next change is the person reading, not typing."""
        self._answered = True
        self._quiet_from = self._clock()

    def debounce_s(self, floor_s: float, ceiling_s: float) -> float:
        """The median typing gap, between `floor_s` and `ceiling_s`; `floor_s` when there is no typing to go by or
        the ceiling is not above the floor."""
        typing = [g for g in self._gaps if g <= ceiling_s]
        if ceiling_s <= floor_s or not typing:
            return floor_s
        return min(ceiling_s, max(floor_s, statistics.median(typing)))

    def wait_s(self, floor_s: float, ceiling_s: float) -> float:
        """What is left of the debounce since the last change or answer (all of it when there was neither)."""
        debounce = self.debounce_s(floor_s, ceiling_s)
        if self._quiet_from is None:
            return debounce
        return max(0.0, debounce - (self._clock() - self._quiet_from))
