"""What a verification step costs on this machine now, learned from the steps the decoder runs.

Tree sizing (`draft_tree.fit_to_cost`) needs cost(k): the time of a step verifying k tokens over the time of a plain
(1-token) step. A curve measured once (calibration, the mode choice's 1- and 8-token steps) is only a seed: the
machine's load, the context length and the kernel's tile shapes change it, and a curve taken on another CPU says
nothing about this one. So every step's wall time is recorded by its row count, as acceptance is learned from every
walk, and the curve tree sizing reads is the seed corrected by what the steps cost.

Rules:
- A step's cost is a RATIO: its time over the mean of the plain steps just before and just after it (within
  REFERENCE_AGE steps), so load from other processes that slows every step alike leaves ratios, and so tree sizes,
  unchanged; where those two plain steps differ by more than STABLE the load changed between them, and the tree
  steps between teach nothing. After REFERENCE_AGE steps without a plain one the next step is plain (a reference
  probe; steps without drafts, where nothing matches, usually come sooner).
- Ratios are kept per bucket of row counts (KNOTS) as corrections of the seed (ratio / seed(rows)); a bucket's
  correction is the median of its last WINDOW corrections; until `weight` + 1 are seen, blended with what it was
  assumed to cost (what the other buckets say, else the seed); what a step taught is forgotten after EXPIRE steps. Between buckets seen the curve
  runs straight; above the largest seen it runs on straight from (1 row, 1) through it: rows nobody timed are
  assumed to cost what the timed ones did each, not what the seed said (a flat seed on a steep CPU would otherwise
  let big trees through again and again).
- Trees shrink when they do not pay, down to plain steps; every PROBE_EVERY drafted trees one step verifies the tree up to
  the next bucket above the size that pays (a growth probe), so a curve that flattens again is seen; drafts that
  would not pay even where rows are cheapest, or hold less than PROBE_GAIN expected tokens (a source
  always wrong), are never probed.
- A request's first pass often computes an uncached prompt tail under its tree (decoding.py's chain): it is
  recorded by all its rows (a pass of k rows costs what k rows cost, tail or tree), and its drafts pay for what they
  add to it, cost(tail + rows) - cost(tail + 1), not cost(rows) - 1: on a CPU whose rows cost more each the more a
  pass holds, a tree that pays alone may not on a tail.
- Nothing measured here: the seed is CONSERVATIVE (trees start small and grow as steps prove cheap), never another
  machine's curve. What the steps taught is kept (`learned_json`) by whoever owns the decoder and seeds the next
  start on the same machine, model, mode and kernel (`from_learned_json`), as a curve measured here does.
- One curve per thread count: a decoder whose steps move to fewer threads (step_threads.py) keeps one StepCosts a
  count, the new one seeded with the curve of the count before it (GUESSED_WEIGHT); the count left is paused (its
  plain-step reference dropped) until steps come back to it.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from rest_lsp.drafting.draft_tree import DraftTree, cost_at, fit_to_cost
from rest_lsp.engine.runmode import cost_curve

# Row-count buckets, by their largest row count: a step of k rows is learned in the first knot >= k.
KNOTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
WINDOW = 12  # corrections kept per bucket: the last few dozen steps decide
REFERENCE_KEPT = 8  # plain step times the reference is the median of
REFERENCE_AGE = 24  # steps: a plain step older than this is no reference (the load may have changed since)
STABLE = 1.5  # two plain steps further apart than this bracket a change of load: the tree steps between are dropped
# drafted trees between growth probes (not steps: where the draft gate keeps steps plain, a probe every PROBE_EVERY
# steps would make nearly every drafted step one)
PROBE_EVERY = 24
# steps after which what a step taught is forgotten: a bucket fed only by growth probes (trees shrunk below it) keeps
# its last few, so that a few probes after the load has gone outvote what it taught
EXPIRE = 5 * PROBE_EVERY
# The curve a CPU starts from when nothing was measured on it: about the steepest seen on a CPU (an AVX2-only Zen 1
# EPYC, whose 256-bit integer multiplies issue as two halves on one port; benchmarks/RESULTS.md, bench_replay), so a
# first tree must be sure to pay; the steps run correct it within a few dozen, and rows proved cheap extend the curve
# flat beyond them.
CONSERVATIVE = cost_curve({1: 1.0, 2: 1.5, 4: 2.6, 8: 4.3, 16: 7.8, 32: 15.0, 64: 29.0})
MEASURED_WEIGHT = 3  # pseudo-corrections behind a seed measured here
GUESSED_WEIGHT = 1  # behind the conservative seed: the first real steps outvote it
MIN_DRAFT_COST = 0.05  # a step with drafts costs at least this much more than a plain one (calibration's rule)
# rows about as cheap as they get on a CPU: drafts that would not pay even on it are not worth a growth probe
CHEAP = cost_curve({1: 1.0, 2: 1.1, 16: 1.2, 64: 1.6})
PROBE_GAIN = 0.5  # expected accepted drafts a growth probe's added nodes must hold at least


def seed_from_two(one_ms: float, rows: int, rows_ms: float, largest: int = 64) -> list[float]:
    """A curve from a plain step and a step of `rows` tokens timed together (the mode choice's), straight through
    both and on past them: the steps learned from then bend it."""
    slope = max(MIN_DRAFT_COST, rows_ms / one_ms - 1.0) / (rows - 1)
    return cost_curve({1: 1.0, largest: 1.0 + slope * (largest - 1)})


def _knot(rows: int) -> int:
    """Index of the bucket a step of `rows` rows is learned in."""
    return min(bisect.bisect_left(KNOTS, rows), len(KNOTS) - 1)


@dataclass(frozen=True)
class Seed:
    curve: list[float]  # curve[k]: cost of k rows over one (curve[0] unused); never changed
    source: str  # "measured" | "learned here" | "mode choice" | "conservative" | "flat" | "other thread count"
    weight: int  # pseudo-corrections of 1 behind it

    def at(self, k: int) -> float:
        return cost_at(self.curve, k)


class StepCosts:
    """The step-cost curve of one decoder: seeded, then learned from its steps' wall times.

    `choose(tree)` cuts a drafted tree to what pays (or to a probe); `record(rows, seconds)` after each step. Used from
    the decoding thread; `seed` may come from a calibrating thread (it replaces one reference).
    """

    def __init__(self, curve: Sequence[float] | None = None, source: str = "conservative",
                 weight: int | None = None, learn: bool = True) -> None:
        self.learn = learn  # False: the seed is the curve, whatever the steps cost (no probes either)
        self._windows: list[deque[tuple[int, float]]] = [deque(maxlen=WINDOW) for _ in KNOTS]  # (step, correction)
        self._plain: deque[tuple[int, float]] = deque(maxlen=REFERENCE_KEPT)  # (step number, seconds)
        self._pending: list[tuple[int, int, float]] = []  # tree steps since the last plain one: (step, rows, seconds)
        self.steps = 0  # steps recorded
        self.trees = 0  # drafted trees chosen
        self._probed = 0  # `trees` at the last growth probe
        self.probes = 0  # growth probes run
        self.references = 0  # reference probes run
        self.probing = False  # the last tree chosen is a probe (growth or reference), not the size that pays
        self._seed = Seed(CONSERVATIVE, "conservative", GUESSED_WEIGHT)
        self._learned: list[float] | None = None  # curve() until the next seed or tree step
        if curve is not None:
            self.seed(curve, source, weight)

    # -- the seed --------------------------------------------------------------------------------------------------
    def seed(self, curve: Sequence[float], source: str, weight: int | None = None) -> None:
        """Start from `curve` (measured here: calibration or the mode choice); what the steps taught stays, as
        corrections of the new seed."""
        if weight is None:
            weight = GUESSED_WEIGHT if source == "conservative" else MEASURED_WEIGHT
        self._seed = Seed(list(curve) if not isinstance(curve, list) else curve, source, weight)
        self._learned = None

    @property
    def source(self) -> str:
        return self._seed.source

    # -- learning --------------------------------------------------------------------------------------------------
    def reference_s(self) -> float | None:
        """The median of the plain steps timed in the last REFERENCE_AGE steps (seconds), else None."""
        fresh = [s for step, s in self._plain if self.steps - step < REFERENCE_AGE]
        return statistics.median(fresh) if fresh else None

    def pause(self) -> None:
        """Steps stop coming here for a while (another thread count runs them): the plain steps timed so far are no
        reference for the tree steps after the return, which wait for a fresh plain step; the ratios learned stay."""
        self._plain.clear()
        self._pending = []

    def record(self, rows: int, seconds: float) -> None:
        """A step of `rows` rows (root and drafts) took `seconds` of wall time."""
        if not self.learn:
            return
        self.steps += 1
        for window in self._windows:
            while window and self.steps - window[0][0] > EXPIRE:
                window.popleft()
                self._learned = None
        if seconds <= 0 or rows < 1:
            return
        if rows > 1:
            if self._plain and self.steps - self._plain[-1][0] < REFERENCE_AGE:
                self._pending.append((self.steps, rows, seconds))  # judged at the next plain step
            return
        before = self._plain[-1][1] if self._plain else None
        self._plain.append((self.steps, seconds))
        pending, self._pending = self._pending, []
        if before is None or max(before, seconds) > STABLE * min(before, seconds):
            return  # the load changed between the two plain steps: the tree steps between them say nothing
        ref = (before + seconds) / 2
        for step, k, t in pending:
            ratio = max(1.0 + MIN_DRAFT_COST, t / ref)
            self._windows[_knot(k)].append((step, ratio / self._seed.at(k)))
            self._learned = None

    def _corrections(self) -> list[float | None]:
        """Per bucket (KNOTS), the factor its seed is multiplied by; None where no step of its size was seen.

        A bucket with few steps blends them with what it was assumed to cost before: what the buckets with enough
        steps say (straight between and past them), else the seed; that word fades, gone after weight + 1 steps.
        """
        weight = self._seed.weight
        settled: list[float | None] = [None] * len(KNOTS)
        for i, seen in enumerate(self._windows):
            if len(seen) > weight:
                settled[i] = statistics.median(c for _, c in seen)
        out = list(settled)
        anchors = self._anchors(settled)
        for i, seen in enumerate(self._windows):
            if seen and settled[i] is None:
                prior = self._at(KNOTS[i], settled, anchors) / self._seed.at(KNOTS[i]) if len(anchors) > 1 else 1.0
                out[i] = statistics.median([c for _, c in seen] + [prior] * (weight + 1 - len(seen)))
        return out

    def _anchors(self, fix: list[float | None]) -> dict[int, float]:
        """The learned cost at each bucket's knot where `fix` has a correction (1 row: 1.0)."""
        out = {1: 1.0}
        for i, k in enumerate(KNOTS[1:], start=1):
            if fix[i] is not None:
                out[k] = max(1.0 + MIN_DRAFT_COST, self._seed.at(k) * fix[i])
        return out

    def _at(self, k: int, fix: list[float | None], anchors: dict[int, float]) -> float:
        """cost(k): in a bucket seen, the seed times its correction; between seen buckets, straight between their
        knots; above the largest seen, straight on from 1 row through it (rows past what was seen are assumed to
        cost what the seen ones did each, whatever the seed said)."""
        i = _knot(k)
        if i and fix[i] is not None:
            return max(1.0 + MIN_DRAFT_COST, self._seed.at(k) * fix[i])
        lo = max(s for s in anchors if s <= k)
        hi = min((s for s in anchors if s >= k), default=None)
        if hi is None:
            return 1.0 + (anchors[lo] - 1.0) * (k - 1) / (lo - 1) if lo > 1 else self._seed.at(k)
        if hi == lo:
            return anchors[lo]
        return anchors[lo] + (anchors[hi] - anchors[lo]) * (k - lo) / (hi - lo)

    def curve(self) -> list[float]:
        """cost[k] over the seed's sizes and at least KNOTS (cost[0] unused, cost[1] == 1; fit_to_cost extends its
        last segment): the seed itself while no tree step was seen, else what the steps taught. One list until it
        changes."""
        if not any(self._windows):
            return self._seed.curve
        if self._learned is None:
            fix = self._corrections()
            anchors = self._anchors(fix)
            self._learned = [0.0, 1.0] + [max(1.0 + MIN_DRAFT_COST, self._at(k, fix, anchors))
                                          for k in range(2, max(len(self._seed.curve), KNOTS[-1] + 1))]
        return self._learned

    def cost(self, k: int) -> float:
        """cost(k) on the learned curve (its last segment extended past it)."""
        return cost_at(self.curve(), k)

    def seen(self) -> dict[int, tuple[int, float]]:
        """Per bucket with steps seen: (steps in its window, its learned cost ratio at the knot)."""
        anchors = self._anchors(self._corrections())
        return {k: (len(self._windows[i]), anchors[k]) for i, k in enumerate(KNOTS) if self._windows[i]}

    def describe(self) -> dict:
        """JSON for a stats reply: the seed's source, the probes run, and per bucket seen (by its largest row count)
        the steps in its window and the learned cost ratio at it."""
        return {"seed": self.source, "growth_probes": self.probes, "reference_steps": self.references,
                "learned": {str(k): [n, round(r, 3)] for k, (n, r) in self.seen().items()}}

    # -- keeping what was learned -------------------------------------------------------------------------------
    def learned_json(self) -> dict | None:
        """The learned curve for the next start (its cost at 1..KNOTS[-1] rows) and the steps behind it; None while
        no tree step has taught anything (a seed is not kept as if it were learned)."""
        if not self.learn or not any(self._windows):
            return None
        return {"curve": [round(c, 4) for c in self.curve()[1 : KNOTS[-1] + 1]], "steps": self.steps}

    # -- choosing ----------------------------------------------------------------------------------------------------
    def extra(self, rows: int, under: int = 0) -> float:
        """What a pass's `rows` tree rows beyond the root add to it, in plain steps: cost(rows) - 1 alone; above an
        uncached prompt tail of `under` rows (a request's first step), cost(under + rows) - cost(under + 1). At least
        MIN_DRAFT_COST for any drafts: each bucket has its own correction, so the learned curve can dip where one
        bucket meets the next, and a difference of two large costs would then credit drafts with negative time."""
        if rows <= 1:
            return 0.0
        return max(MIN_DRAFT_COST, self.cost(under + rows) - self.cost(under + 1))

    def choose(self, tree: DraftTree, under: int = 0, trust: float = 1.0) -> DraftTree:
        """The tree cut to what pays on the learned curve, its shares scaled by `trust`; the root alone when a plain
        step is due as the reference and the choice depends on it; grown to the next bucket when a growth probe is
        due and the drafts beyond the cut would pay where rows are cheapest.

        Above a prompt tail of `under` rows the drafts are weighed against what they add to that pass (`extra`):
        the tail is paid with or without them, and rows cost more each the more a pass holds. Such a pass is
        neither a reference (it is no plain step) nor a growth probe (it measures the tail's rows too)."""
        self.probing = False
        if under and len(tree) > 1:
            extra = [0.0, 1.0] + [1.0 + self.extra(k, under) for k in range(2, len(tree) + 1)]
            return fit_to_cost(tree, extra, trust)
        if len(tree) == 1 or not self.learn:
            return fit_to_cost(tree, self._seed.curve, trust)
        self.trees += 1
        curve = self.curve()
        last_plain = self._plain[-1][0] if self._plain else 0  # a fresh decoder runs its seed's trees a while first
        if self.steps - last_plain >= REFERENCE_AGE:
            self.references += 1
            self.probing = True
            return tree.prefix(1)
        fitted = fit_to_cost(tree, curve, trust)
        if len(fitted) < len(tree) and self.trees - self._probed >= PROBE_EVERY:
            worth = len(fit_to_cost(tree, CHEAP, trust))
            if trust * sum(tree.shares[len(fitted) : worth]) >= PROBE_GAIN:
                self._probed = self.trees
                self.probes += 1
                self.probing = True
                grown = KNOTS[min(_knot(len(fitted)) + 1, len(KNOTS) - 1)]
                return tree.prefix(min(worth, max(grown, len(fitted) + 1)))
        return fitted


def from_learned_json(data) -> list[float] | None:
    """The curve (curve[k]; curve[0] unused) a `learned_json` holds, checked: 1 at one row, every cost finite and at
    least 1; None for anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("curve"), list):
        return None
    try:
        costs = [float(c) for c in data["curve"]]
    except (TypeError, ValueError):
        return None
    if len(costs) < 2 or costs[0] != 1.0 or any(not math.isfinite(c) or c < 1.0 for c in costs):
        return None
    return [0.0, *costs]
