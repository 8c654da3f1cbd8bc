"""When a step drafts at all: only where drafting has paid, so that REST is never slower than leaving it off.

`fit_to_cost` weighs a tree's rows against what its drafts promise, but drafting itself is not free: asking the
sources, building and cutting the tree and teaching the learners is Python work on every step, paid whether the tree
pays or not (on a slow CPU, a good part of a small model's step: docs/LOG.md), and promises can be too high. So after every drafted step the
decoder reports what drafting brought and what it cost, in plain steps:

    gain = accepted drafts - (cost(rows) - 1) - drafting seconds / plain step seconds

cost(rows) from the step-cost curve the steps taught (step_cost), the plain step from its reference (the median of
recent one-row passes). Gains are averaged per SITUATION, as acceptance runs in streaks and a request's first step
meets drafts of its own (the output the model wrote there a moment ago, the start a prompt holds back):
- "first": the first step of a request;
- "after": a step after one that accepted drafts;
- "cold": a step after one that accepted none.
A situation drafts while its average gain is at least 0 (and until MIN_SEEN drafted steps have been seen); below 0
its steps are plain, all but one in `explore` of them, which drafts so that the average follows the workload
(`explore` doubles, up to EXPLORE_MAX, while those steps confirm the loss; back to EXPLORE when the situation pays).
A step that does not draft costs exactly a plain step: no sources asked, no learners taught. Exactness is untouched:
which trees are verified never changes what the walk accepts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SITUATIONS = ("first", "after", "cold")
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

    @staticmethod
    def situation(first: bool, accepted_drafts: int) -> str:
        """The situation of a step: the request's first, else after a step that accepted `accepted_drafts`."""
        return "first" if first else "after" if accepted_drafts > 0 else "cold"

    def paying(self, situation: str) -> bool:
        s = self.situations[situation]
        return s.seen < MIN_SEEN or s.gain >= 0.0

    def drafts(self, situation: str) -> bool:
        """Whether a step in `situation` drafts: yes while it pays, else one step in `explore`."""
        s = self.situations[situation]
        if self.paying(situation) or s.skipped + 1 >= s.explore:
            s.skipped = 0
            return True
        s.skipped += 1
        s.plain_steps += 1
        return False

    def report(self, situation: str, accepted_drafts: int, extra_rows_cost: float, draft_s: float,
               plain_s: float | None) -> None:
        """A drafted step in `situation` accepted `accepted_drafts` drafts; its rows beyond the root cost
        `extra_rows_cost` plain steps (cost(rows) - 1); drafting and learning took `draft_s` seconds; a plain step
        takes `plain_s` now (None: not known yet, and the step teaches nothing)."""
        if plain_s is None or plain_s <= 0:
            return
        s = self.situations[situation]
        gain = accepted_drafts - extra_rows_cost - draft_s / plain_s
        was = self.paying(situation)
        s.seen += 1
        s.gain += max(ALPHA, 1 / s.seen) * (gain - s.gain)
        if self.paying(situation):
            s.explore = EXPLORE
        elif not was:  # an exploring step confirmed the loss: explore less often
            s.explore = min(EXPLORE_MAX, 2 * s.explore)

    def learned_json(self) -> dict | None:
        """What the gate learned, for the next start on this machine and model (per situation its average gain and
        the drafted steps behind it); None before a drafted step taught it anything."""
        if not any(s.seen for s in self.situations.values()):
            return None
        return {name: {"gain": round(s.gain, 4), "seen": s.seen} for name, s in self.situations.items()}

    @classmethod
    def from_learned_json(cls, data) -> "DraftGate | None":
        """A gate that starts from what an earlier one learned (`learned_json`), checked; None for anything else.
        Each situation counts at most MIN_SEEN steps behind its average, so this start's own steps soon outvote the
        last one's (a workspace whose drafts pay more reopens a closed situation within a few explorations)."""
        if not isinstance(data, dict) or set(data) != set(SITUATIONS):
            return None
        gate = cls()
        for name, kept in data.items():
            if not isinstance(kept, dict):
                return None
            gain, seen = kept.get("gain"), kept.get("seen")
            if (not isinstance(gain, (int, float)) or isinstance(gain, bool) or not math.isfinite(gain)
                    or not isinstance(seen, int) or isinstance(seen, bool) or seen < 0):
                return None
            gate.situations[name] = _Situation(gain=float(gain), seen=min(seen, MIN_SEEN))
        return gate

    def describe(self) -> dict:
        """JSON for a stats reply: per situation its average gain (plain steps a drafted step saves), the drafted
        steps seen, whether it drafts now, and the steps it left plain."""
        return {name: {"gain": round(s.gain, 3), "seen": s.seen, "drafts": self.paying(name),
                       "plain_steps": s.plain_steps} for name, s in self.situations.items()}
