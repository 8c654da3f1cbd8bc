"""How many threads a decoding step runs on, learned from the steps the decoder times.

torch starts with a thread per core, which is right on an idle machine. Where another process holds a core, the
step's thread that shares it falls behind, and every kernel call and every step then waits on it: on 2 cores beside
one busy process, bench_replay's plain server decoded at about half the speed on 2 threads that it reached on 1
(docs/LOG.md, 2026-12-06). So the decoder times its steps per thread count and runs on the count whose recent
steps were fastest, trying another count now and then (a probe) so that a load that comes or goes is seen.

Rules:
- The counts tried: the cores torch started with, one fewer, half of them, one (`counts`).
- Steps are compared as plain steps (one row, no prompt tail): a tree step counts as its time over its cost ratio
  on the step-cost curve of the count it ran on (step_cost.py), the plain steps it is worth. A REST server runs few
  plain steps, and a probe counted on them alone could run for minutes on the slow count (docs/LOG.md, 2026-12-06,
  evening). A step over a prompt tail is not counted (its time is mostly the tail's, the part of the curve known
  least). A thread count changes no value any kernel of the gguf mode computes, so REST stays plain decoding.
- A count's time is the median of its last WINDOW steps (as plain steps; below, "plain steps" are those counted).
  A probe runs PROBE_STEPS plain steps on the next count below or above; then the faster by medians is kept (a
  switch needs the other to be faster by MARGIN).
- Down: only while the process is starved, i.e. its CPU time over a step's wall time (the cores it got; the median of
  the last WINDOW plain steps) is below the count by STARVED: an idle machine never pays for a probe down. Up: every
  `interval` plain steps, since a count below the cores cannot see whether more would now be had.
- A probe that did not switch doubles the wait before the next one its way, up to PROBE_MAX (a count about as fast
  as the current one is no reason to keep probing); a switch resets both waits. But once the current count's
  median has slowed by a quarter (SLOWED) since a probe lost, and is slower than that probe's by a switch's margin,
  that probe runs again at once (after WINDOW plain steps), starved or not (the process's CPU time also counts its
  other threads' work): the load changed since it lost. A count never probed is not tried on that evidence, so a
  machine never starved never probes down.
- A count left by a switch down is probed again as soon as a fresh window (WINDOW plain steps) on the new count is
  slower than the usual time of the count left (the median of its last USUAL plain steps, the slow ones that made
  the switch among them) by SLOWED: a moment's slow steps (the host's, not a load that stays) would otherwise hold a
  quiet machine on fewer threads until the back-off's wait runs out. Once a switch: then the usual waits.
- While a probe runs, `probing` is True: the step-cost learner takes no step then (its ratios are to plain steps on
  one count).
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Callable

WINDOW = 5  # plain steps a count's time (and the cores it got) is the median of
PROBE_STEPS = 5  # plain steps a probe runs on another count
PROBE_EVERY = 64  # plain steps between probes up, at first and after a switch
PROBE_MAX = 2048  # the most plain steps between probes, after probes that did not switch again and again
STARVED = 0.35  # the cores a step got below its thread count that make a probe down worth its steps
MARGIN = 0.9  # another count is taken when its median is below this fraction of the current one's
# a count whose probe lost is probed again at once when the current count's median has grown past its median then
# over this (a change of load, not the noise of a median of WINDOW steps)
SLOWED = 0.8
USUAL = 25  # plain steps a count's usual time is the median of (longer than a moment's slow steps)


def counts(cores: int) -> list[int]:
    """The thread counts tried for `cores` threads at start, most first."""
    return sorted({c for c in (cores, cores - 1, cores // 2, 1) if c >= 1}, reverse=True)


class StepThreads:
    """The thread count steps run on (`current`), chosen from the steps' times (`record`); `apply` sets it
    through `set_threads` (torch.set_num_threads) before a step."""

    def __init__(self, cores: int, set_threads: Callable[[int], None], get_threads: Callable[[], int] | None = None):
        self.counts = counts(max(1, cores))
        self.current = self.counts[0]
        self.set_threads = set_threads
        self.get_threads = get_threads  # the count in force (another decoder of the process may have set its own)
        self.applied: int | None = None
        self.times: dict[int, deque[float]] = {c: deque(maxlen=WINDOW) for c in self.counts}
        self.usual: dict[int, deque[float]] = {c: deque(maxlen=USUAL) for c in self.counts}
        self.left: int | None = None  # the count a switch down left, until it is probed again
        self.got: dict[int, deque[float]] = {c: deque(maxlen=WINDOW) for c in self.counts}  # cores a step got
        self.wait = {"down": WINDOW, "up": PROBE_EVERY}  # plain steps before a probe that way may start
        self.since = 0  # plain steps since the last probe ended (or since the start)
        self.probe: int | None = None  # the count a probe runs on
        self.probe_left = 0
        self.switches = 0
        self.probes = 0
        self.beaten: dict[int, float] = {}  # per count whose last probe lost: the current count's median then (s)

    @property
    def probing(self) -> bool:
        return self.probe is not None

    @property
    def running(self) -> int:
        """The count the next step runs on."""
        return self.probe if self.probe is not None else self.current

    def apply(self) -> None:
        """Set the thread count the next step runs on (only when it changes)."""
        if self.get_threads is not None:
            self.applied = self.get_threads()
        if self.running != self.applied:
            self.set_threads(self.running)
            self.applied = self.running

    def record(self, seconds: float, cpu_seconds: float | None = None) -> None:
        """A step's wall time and the process's CPU time in it (a tree step's: over its cost ratio), on the count it
        ran on; may start or end a probe."""
        self.times[self.running].append(seconds)
        self.usual[self.running].append(seconds)
        if cpu_seconds is not None and seconds > 0:
            self.got[self.running].append(cpu_seconds / seconds)
        if self.probe is not None:
            self.probe_left -= 1
            if self.probe_left <= 0:
                self._decide()
            return
        self.since += 1
        target = self._next_probe()
        if target is not None:
            self.probe, self.probe_left = target, PROBE_STEPS
            self.times[target].clear()  # what a probe measures is now, not what an earlier one did
            self.probes += 1

    def _next_probe(self) -> int | None:
        i = self.counts.index(self.current)
        below = self.counts[i + 1] if i + 1 < len(self.counts) else None
        above = self.counts[i - 1] if i > 0 else None
        got = self.got[self.current]
        starved = len(got) == WINDOW and statistics.median(got) < self.current - STARVED
        if below is not None and ((starved and self.since >= self.wait["down"]) or self._looks_faster(below)):
            return below
        if above is not None and (self.since >= self.wait["up"] or self._looks_faster(above)
                                  or self._was_faster(above)):
            return above
        return None

    def _was_faster(self, other: int) -> bool:
        """`other` is the count a switch down left, and a fresh window on the current count is slower than `other`'s
        usual time (its slow steps that made the switch among them) by SLOWED: probe it once more now."""
        mine = self.times[self.current]
        if other != self.left or len(mine) < WINDOW or self.since < WINDOW:  # `left` ran steps: it has a usual time
            return False
        return SLOWED * statistics.median(mine) > statistics.median(self.usual[other])

    def _looks_faster(self, other: int) -> bool:
        """Since `other`'s last probe lost, the current count's plain steps have slowed by a quarter (SLOWED) and are
        now slower than that probe's by a switch's margin: the load changed, and waiting out the probe's back-off
        would keep the slower count. Checked once a fresh window (WINDOW plain steps, all run since the probe): a
        median of a few noisy steps checked at every step would find such a rise by chance."""
        mine, theirs, then = self.times[self.current], self.times[other], self.beaten.get(other)
        if then is None or not theirs or len(mine) < WINDOW or self.since < WINDOW or self.since % WINDOW:
            return False
        now = statistics.median(mine)
        return SLOWED * now > then and MARGIN * now > statistics.median(theirs)

    def _decide(self) -> None:
        probe, self.probe, self.since = self.probe, None, 0
        way = "down" if probe < self.current else "up"
        mine, theirs = self.times[self.current], self.times[probe]
        if not mine or not theirs:
            return
        now, other = statistics.median(mine), statistics.median(theirs)
        self.left = None
        if other < MARGIN * now:
            self.left = self.current if probe < self.current else None
            self.current = probe
            self.switches += 1
            self.wait = {"down": WINDOW, "up": PROBE_EVERY}
            self.got[probe].clear()
            self.beaten.clear()
        else:  # lost, or too close to be worth a switch: that way is tried half as often
            self.wait[way] = min(PROBE_MAX, self.wait[way] * 2)
            self.beaten[probe] = now

    def describe(self) -> dict:
        """JSON for a stats reply: the count steps run on, the probes and switches, and per count timed the median
        of its last plain steps (ms)."""
        return {"threads": self.current, "probes": self.probes, "switches": self.switches,
                "plain_step_ms": {str(c): round(statistics.median(t) * 1e3, 2) for c, t in self.times.items() if t}}
