"""When a step drafts at all: only where drafting has paid, so that REST is never slower than leaving it off.

`fit_to_cost` weighs a tree's rows against what its drafts promise, but drafting itself is not free: asking the
sources, building and cutting the tree and teaching the learners is Python work on every step, paid whether the tree
pays or not (on a slow CPU, a good part of a small model's step: docs/LOG.md), and promises can be too high. So after every drafted step the
decoder reports what drafting brought and what it cost, in plain steps:

    gain = accepted drafts - (cost(rows) - 1) - drafting seconds / plain step seconds

cost(rows) from the step-cost curve the steps taught (step_cost; above an uncached prompt tail, what the rows add
to that pass: `StepCosts.extra`), the plain step from its reference (the median of recent one-row passes).
Gains are averaged per SITUATION, as acceptance runs in streaks and a request's first step
meets drafts of its own (the output the model wrote there a moment ago, the start a prompt holds back):
- "first": the first step of a request;
- "copying": a step after one whose deepest accepted draft the context source proposed (the output is copying text
  the prompt holds), or after one that accepted nothing where "cold" steps are plain and the context's match is
  long (decoding.ECHO_MATCH: the last tokens stand in the prompt already; else copying would begin unseen);
- "after": a step after one that accepted other drafts;
- "cold": a step after one that accepted none.
A situation drafts while its average gain is at least 0 (and until MIN_SEEN drafted steps have been seen); below 0
its steps are plain, all but one in `explore` of them, which drafts so that the average follows the workload
(`explore` doubles, up to EXPLORE_MAX, while those steps confirm the loss; back to EXPLORE when the situation pays).
A step that does not draft costs exactly a plain step: no sources asked, no learners taught. Exactness is untouched:
which trees are verified never changes what the walk accepts.

Beside full drafting, a LITE step drafts from the prompt's own text alone (the context lookup: the cheapest source,
and the one that accepts most where a person writes code), the successor table untaught. Lite steps are judged as
full ones, in a ledger of their own per situation, and a situation drafts the kind that has gained more (the other
explored one step in its `explore`), plain only where neither pays. More sources are not always more: each adds
candidates whose promises are estimates, a tree on a steep step-cost curve has room for few, and those that
promise most include those overestimated most; where rows are cheap the full mix wins. Both kinds are judged on
MIN_SEEN steps first, taking turns. A "copying" step drafts lite whenever it drafts: the context's match just grew,
and every other source's sibling of its next node takes a share of that node's chance (siblings share at most 1),
so the full mix cut the copied chain short (docs/LOG.md); its lite ledger alone decides whether it drafts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SITUATIONS = ("first", "copying", "after", "cold")
COPYING = "copying"  # drafts lite alone (above)
COLD = "cold"
KEPT_BEFORE = ("first", "after", "cold")  # what a gate kept before "copying": such a file starts that one afresh
FULL, LITE = "full", "lite"  # how a step drafts: every source, or the context alone
ALPHA = 1 / 16  # least weight of the newest gain in a situation's average (a plain mean of the first 16)
MIN_SEEN = 8  # drafted steps a situation is judged on at least (after 4, a 24-token generation of repeated text
# closed it before its drafts were accepted: tests/commands/test_cli.py)
EXPLORE = 4  # a losing situation drafts one step in this many, doubling while it loses
EXPLORE_MAX = 16  # at most: a losing situation still learns from one step in 16 (and costs plain at most a 16th of
# its drafting work)


@dataclass
class _Situation:
    gain: float = 0.0  # exponentially weighted average gain of its drafted steps (plain steps)
    seen: int = 0  # drafted steps reported
    explore: int = EXPLORE  # one drafted step in this many while it loses
    skipped: int = 0  # plain steps since its last drafted one
    plain_steps: int = 0  # steps it did not draft, in all


@dataclass
class DraftGate:
    """Per situation, whether its steps draft; `report` after each drafted step teaches it."""

    situations: dict[str, _Situation] = field(default_factory=lambda: {s: _Situation() for s in SITUATIONS})
    lite: dict[str, _Situation] = field(default_factory=lambda: {s: _Situation() for s in SITUATIONS})

    @staticmethod
    def situation(first: bool, accepted_drafts: int, copying: bool = False) -> str:
        """The situation of a step: the request's first, else after a step that accepted `accepted_drafts` (the
        deepest of them the context's when `copying`)."""
        if first:
            return "first"
        return COLD if accepted_drafts <= 0 else COPYING if copying else "after"

    def paying(self, situation: str) -> bool:
        """Whether full drafting pays in `situation` (yes until judged)."""
        return _pays(self.situations[situation])

    def drafts(self, situation: str) -> bool:
        """Whether a step in `situation` drafts in full where lite steps are not possible: yes while that pays, else
        one step in `explore`."""
        return self.kind(situation, lite=False) == FULL

    def kind(self, situation: str, lite: bool = True) -> str | None:
        """How a step in `situation` drafts: FULL (every source), LITE (the context alone; only if `lite`) or None
        (a plain step). Both kinds are judged on MIN_SEEN steps first, taking turns; then the one that gained more
        while it pays, the other one step in its `explore`; where neither pays, plain but for those explorations."""
        full, light = self.situations[situation], self.lite[situation]
        if not lite:
            return FULL if _due(full) else None
        if situation == COPYING:
            return LITE if _due(light) else None
        if full.seen < MIN_SEEN or light.seen < MIN_SEEN:
            return FULL if full.seen <= light.seen else LITE
        ranked = ((FULL, full), (LITE, light)) if full.gain >= light.gain else ((LITE, light), (FULL, full))
        (best, ahead), (other, behind) = ranked
        if ahead.gain >= 0.0:
            chosen = other if _explored(behind) else best
        else:
            chosen = best if _explored(ahead) else other if _explored(behind) else None
        for name, s in ranked:
            if name != chosen:
                s.plain_steps += 1
        return chosen

    def report(self, situation: str, accepted_drafts: int, extra_rows_cost: float, draft_s: float,
               plain_s: float | None, kind: str = FULL) -> None:
        """A drafted step in `situation` (drafting `kind`) accepted `accepted_drafts` drafts; its rows beyond the
        root cost `extra_rows_cost` plain steps (`StepCosts.extra`: cost(rows) - 1 alone); drafting and learning
        took `draft_s` seconds; a plain step takes `plain_s` now (None: not known yet, and the step teaches
        nothing)."""
        if plain_s is None or plain_s <= 0:
            return
        s = (self.situations if kind == FULL else self.lite)[situation]
        gain = accepted_drafts - extra_rows_cost - draft_s / plain_s
        was = self._leads(situation, kind)
        s.seen += 1
        s.gain += max(ALPHA, 1 / s.seen) * (gain - s.gain)
        if self._leads(situation, kind):
            s.explore = EXPLORE
        elif not was:  # an exploring step confirmed it behind: explore it less often
            s.explore = min(EXPLORE_MAX, 2 * s.explore)

    def _leads(self, situation: str, kind: str) -> bool:
        """Whether `kind` is what `situation` drafts now: it pays and (where lite steps were judged at all) has
        gained at least as much as the other kind."""
        full, light = self.situations[situation], self.lite[situation]
        mine, theirs = (full, light) if kind == FULL else (light, full)
        if not _pays(mine):
            return False
        if not light.seen or mine.seen < MIN_SEEN or theirs.seen < MIN_SEEN:
            return True
        return mine.gain > theirs.gain or (kind == FULL and mine.gain == theirs.gain)

    def learned_json(self) -> dict | None:
        """What the gate learned, for the next start on this machine and model (per situation its average gain and
        the drafted steps behind it; the same for lite steps under "lite"); None before a drafted step taught it
        anything."""
        if not any(s.seen for s in (*self.situations.values(), *self.lite.values())):
            return None

        def kept(ledgers: dict[str, _Situation]) -> dict:
            return {name: {"gain": round(s.gain, 4), "seen": s.seen} for name, s in ledgers.items()}

        return {**kept(self.situations), "lite": kept(self.lite)}

    @classmethod
    def from_learned_json(cls, data) -> "DraftGate | None":
        """A gate that starts from what an earlier one learned (`learned_json`), checked; None for anything else.
        Each ledger counts at most MIN_SEEN steps behind its average, so this start's own steps soon outvote the
        last one's (a workspace whose drafts pay more reopens a closed situation within a few explorations)."""
        if not isinstance(data, dict) or not set(KEPT_BEFORE) | {"lite"} <= set(data) <= {*SITUATIONS, "lite"}:
            return None
        gate = cls()
        full = {k: data[k] for k in SITUATIONS if k in data}
        for ledgers, kept in ((gate.situations, full), (gate.lite, data["lite"])):
            if not isinstance(kept, dict) or not set(KEPT_BEFORE) <= set(kept) <= set(SITUATIONS):
                return None
            for name, one in kept.items():
                ledger = _ledger(one)
                if ledger is None:
                    return None
                ledgers[name] = ledger
        return gate

    def describe(self) -> dict:
        """JSON for a stats reply: per situation its average gain (plain steps a drafted step saves), the drafted
        steps seen, whether it pays, and the situation's steps it did not draft (plain, or the other kind); the same
        for lite steps under "lite"."""
        def one(s: _Situation) -> dict:
            return {"gain": round(s.gain, 3), "seen": s.seen, "drafts": _pays(s), "plain_steps": s.plain_steps}

        return {**{name: one(s) for name, s in self.situations.items()},
                "lite": {name: one(s) for name, s in self.lite.items()}}


def _ledger(kept) -> _Situation | None:
    """A ledger from its kept form ({"gain", "seen"}), its steps cut to MIN_SEEN; None for anything else."""
    if not isinstance(kept, dict):
        return None
    gain, seen = kept.get("gain"), kept.get("seen")
    if (not isinstance(gain, (int, float)) or isinstance(gain, bool) or not math.isfinite(gain)
            or not isinstance(seen, int) or isinstance(seen, bool) or seen < 0):
        return None
    return _Situation(gain=float(gain), seen=min(seen, MIN_SEEN))


def _pays(s: _Situation) -> bool:
    return s.seen < MIN_SEEN or s.gain >= 0.0


def _due(s: _Situation) -> bool:
    """Whether a step of this ledger's kind runs now: yes while it pays, else one step in `explore`."""
    if _pays(s) or s.skipped + 1 >= s.explore:
        s.skipped = 0
        return True
    s.skipped += 1
    s.plain_steps += 1
    return False


def _explored(s: _Situation) -> bool:
    """Whether this step explores a ledger that is not chosen: one step in its `explore`."""
    s.skipped += 1
    if s.skipped >= s.explore:
        s.skipped = 0
        return True
    return False
