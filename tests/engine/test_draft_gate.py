"""A step drafts only where drafting has paid (rest_lsp/engine/draft_gate.py): REST is never slower than leaving it
off, however costly or useless the sources, and drafts that pay are always asked."""

from __future__ import annotations

import random

import pytest

from rest_lsp.drafting.drafts import Proposal
from rest_lsp.engine import draft_gate
from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.engine.draft_gate import DraftGate

from support import tiny_model


# -- the gate alone --------------------------------------------------------------------------------------------------
def drafted_steps(gate: DraftGate, situation: str, gain: float, steps: int) -> int:
    """How many of `steps` steps in `situation` draft, each drafted one reporting `gain` (as drafting work)."""
    n = 0
    for _ in range(steps):
        if gate.drafts(situation):
            n += 1
            gate.report(situation, 0, 0.0, -gain * 0.01, 0.01)
    return n


def test_a_situation_that_loses_stops_drafting_but_for_rare_explorations():
    gate = DraftGate()
    assert drafted_steps(gate, "cold", -0.2, draft_gate.MIN_SEEN) == draft_gate.MIN_SEEN  # judged on enough steps
    n = drafted_steps(gate, "cold", -0.2, 400)
    assert 400 // draft_gate.EXPLORE_MAX <= n <= 400 // draft_gate.EXPLORE_MAX + 4, n
    assert gate.describe()["cold"]["drafts"] is False and gate.describe()["cold"]["plain_steps"] == 400 - n
    assert gate.paying("after") and gate.paying("first")  # situations are judged apart


def test_a_situation_that_pays_again_drafts_again():
    gate = DraftGate()
    drafted_steps(gate, "cold", -0.2, 200)
    assert not gate.paying("cold")
    for _ in range(2000):
        if gate.drafts("cold"):
            gate.report("cold", 1, 0.3, 0.001, 0.01)  # a draft accepted, for 0.4 plain steps
        if gate.paying("cold"):
            break
    assert gate.paying("cold")
    assert drafted_steps(gate, "cold", 0.5, 50) == 50


def kinds_run(gate: DraftGate, situation: str, gains: dict, steps: int) -> dict:
    """How many of `steps` steps in `situation` ran each kind (None: plain), each drafted step reporting its kind's
    gain in `gains`."""
    ran = {draft_gate.FULL: 0, draft_gate.LITE: 0, None: 0}
    for _ in range(steps):
        kind = gate.kind(situation)
        ran[kind] += 1
        if kind is not None:
            gate.report(situation, 0, 0.0, -gains[kind] * 0.01, 0.01, kind)
    return ran


@pytest.mark.parametrize("better", [draft_gate.FULL, draft_gate.LITE])
def test_both_kinds_are_judged_and_the_one_that_gains_more_drafts(better):
    """Full drafting and lite steps both pay; the one that gains more runs nearly every step once both are
    judged, the other explored ever more rarely (never plain: drafting pays)."""
    worse = draft_gate.LITE if better == draft_gate.FULL else draft_gate.FULL
    gate = DraftGate()
    first = kinds_run(gate, "after", {better: 0.5, worse: 0.1}, 2 * draft_gate.MIN_SEEN)
    assert first[better] == first[worse] == draft_gate.MIN_SEEN  # judged on the same number of steps, turn about
    ran = kinds_run(gate, "after", {better: 0.5, worse: 0.1}, 400)
    assert ran[None] == 0 and ran[worse] <= 400 // draft_gate.EXPLORE_MAX + 4, ran
    said = gate.describe()
    assert said["after"]["drafts"] and said["lite"]["after"]["drafts"]  # both pay
    # where neither pays, plain steps but for rare explorations of each
    ran = kinds_run(gate, "cold", {better: -0.3, worse: -0.5}, 2 * draft_gate.MIN_SEEN)
    ran = kinds_run(gate, "cold", {better: -0.3, worse: -0.5}, 400)
    assert ran[None] >= 400 - 2 * (400 // draft_gate.EXPLORE_MAX + 4), ran


def test_without_lite_steps_the_gate_judges_full_drafting_alone():
    """A decoder whose drafts are not a mix of sources cannot draft the context alone: kind(lite=False) is full or
    plain, as `drafts` says."""
    gate = DraftGate()
    ran = [gate.kind("cold", lite=False) for _ in range(draft_gate.MIN_SEEN)]
    assert ran == [draft_gate.FULL] * draft_gate.MIN_SEEN


def test_without_a_plain_step_to_compare_nothing_is_learned():
    gate = DraftGate()
    for _ in range(100):
        gate.report("cold", 0, 3.0, 1.0, None)
    assert gate.paying("cold") and gate.describe()["cold"]["seen"] == 0


def test_situations():
    assert DraftGate.situation(True, 3) == "first" and DraftGate.situation(True, 3, copying=True) == "first"
    assert DraftGate.situation(False, 2) == "after"
    assert DraftGate.situation(False, 2, copying=True) == "copying"
    assert DraftGate.situation(False, 0) == "cold"


def test_a_copying_step_drafts_the_context_alone_while_that_pays():
    gate = DraftGate()
    ran = kinds_run(gate, "copying", {draft_gate.FULL: 2.0, draft_gate.LITE: 0.5}, 100)
    assert ran == {draft_gate.FULL: 0, draft_gate.LITE: 100, None: 0}, ran  # never the full mix
    ran = kinds_run(gate, "copying", {draft_gate.LITE: -0.5}, 400)  # until it stops paying: plain but explorations
    assert ran[draft_gate.FULL] == 0 and ran[None] >= 400 - 2 * (400 // draft_gate.EXPLORE_MAX + 4), ran
    assert [gate.kind("copying", lite=False) for _ in range(3)] == [draft_gate.FULL] * 3  # no mix: full, judged


# -- the decoder -----------------------------------------------------------------------------------------------------
class Clock:
    """A fake clock: a pass of k rows takes 10 ms times (1 + 0.05 (k - 1)) (rows nearly free), and a source's
    proposal takes what it says."""

    def __init__(self, decoder: Decoder):
        self.now = 0.0
        real = decoder.verify

        def verify(tree, chain=()):
            self.now += 0.01 * (1 + 0.05 * (len(tree) + len(chain) - 1))
            return real(tree, chain)

        decoder.verify = verify
        decoder.clock = lambda: self.now


class Source:
    """Proposes 6 tokens after each context: the true continuation (`right`) or tokens the model never writes,
    as one sure chain; each proposal costs `work` seconds on the clock."""

    def __init__(self, clock: Clock, full: list[int], right: bool, work: float, vocab: int):
        self.clock, self.full, self.right, self.work, self.vocab = clock, full, right, work, vocab
        self.asked = 0
        self.rnd = random.Random(0)

    def propose(self, context):
        self.asked += 1
        self.clock.now += self.work
        if self.right:
            nxt = self.full[len(context): len(context) + 6]
        else:
            nxt = [self.rnd.randrange(self.vocab) for _ in range(6)]
        if not nxt:
            return []
        return [Proposal("src", 16, tuple(nxt), tuple(range(-1, len(nxt) - 1)), (1.0,) * len(nxt))]


@pytest.mark.parametrize("right", [False, True])
def test_drafting_that_costs_more_than_it_brings_stops_and_drafting_that_pays_goes_on(right):
    loaded = tiny_model("llama")
    prompt = [random.Random(3).randrange(97) for _ in range(24)]
    plain = Decoder(loaded).generate(prompt, Source(None, [], False, 0.0, 97), DecodeConfig(max_new_tokens=40,
                                                                                             budget=0)).tokens
    decoder = Decoder(loaded)
    clock = Clock(decoder)
    asked = steps = 0
    for _ in range(10):
        decoder.reset()
        source = Source(clock, prompt + plain, right, 0.004, loaded.model.config.vocab_size)  # 0.4 plain steps
        result = decoder.generate(prompt, source, DecodeConfig(max_new_tokens=40, budget=8))
        assert result.tokens == plain
        asked, steps = asked + source.asked, steps + result.steps
    if right:
        assert asked == steps and steps <= 10 * 40 / 3  # asked every step, trees of sure drafts verified
    else:
        assert asked < 0.3 * steps, (asked, steps)  # plain steps: the useless source is rarely asked
        assert decoder.gate.describe()["cold"]["drafts"] is False


def test_a_fixed_budget_drafts_every_step():
    """fit_to_cost=False asks for every tree whatever it costs (a benchmark's fixed trees)."""
    loaded = tiny_model("llama")
    prompt = [random.Random(4).randrange(97) for _ in range(24)]
    decoder = Decoder(loaded)
    clock = Clock(decoder)
    source = Source(clock, [], False, 0.004, loaded.model.config.vocab_size)
    result = decoder.generate(prompt, source, DecodeConfig(max_new_tokens=60, budget=8, fit_to_cost=False))
    assert source.asked == result.steps


# -- kept across restarts --------------------------------------------------------------------------------------------
def test_what_the_gate_learned_is_kept_checked_and_soon_outvoted():
    gate = DraftGate()
    assert gate.learned_json() is None  # nothing taught: nothing to keep
    drafted_steps(gate, "cold", -0.3, 300)
    drafted_steps(gate, "after", 0.5, 40)
    kept = DraftGate.from_learned_json(gate.learned_json())
    assert not kept.paying("cold") and kept.paying("after") and kept.paying("first")
    assert kept.describe()["cold"]["seen"] == draft_gate.MIN_SEEN  # counted as a few steps, not 300
    # a workspace whose drafts pay: the closed situation drafts again after a few explorations
    explored = 0
    while not kept.paying("cold"):
        if kept.drafts("cold"):
            explored += 1
            kept.report("cold", 1, 0.3, 0.001, 0.01)
    assert explored <= 6, explored
    good = {s: {"gain": 0.1, "seen": 3} for s in draft_gate.SITUATIONS}
    assert DraftGate.from_learned_json({**good, "lite": good}) is not None
    for bad in (None, [], {}, {"cold": {"gain": 0.1, "seen": 3}}, good, {**good, "lite": {}},
                {**good, "lite": {**good, "cold": {"gain": float("inf"), "seen": 3}}},
                {**{s: {"gain": float("nan"), "seen": 3} for s in draft_gate.SITUATIONS}, "lite": good},
                {**{s: {"gain": 0.1, "seen": -1} for s in draft_gate.SITUATIONS}, "lite": good},
                {**{s: {"gain": "0.1", "seen": 3} for s in draft_gate.SITUATIONS}, "lite": good},
                {**{s: {"gain": 0.1, "seen": True} for s in draft_gate.SITUATIONS}, "lite": good}):
        assert DraftGate.from_learned_json(bad) is None, bad
    # a file kept before the "copying" situation: the others as kept, that one from scratch
    before = {s: {"gain": -0.4, "seen": 20} for s in draft_gate.KEPT_BEFORE}
    gate = DraftGate.from_learned_json({**before, "lite": before})
    assert gate is not None and not gate.paying("cold") and gate.describe()["lite"]["copying"]["seen"] == 0
    assert gate.kind("copying") == draft_gate.LITE
    assert DraftGate.from_learned_json({**before, "lite": before, "later": before["cold"]}) is None


def test_a_restarted_decoder_starts_from_where_drafting_paid_here(tmp_path):
    """A server that learned a useless source does not pay for learning it again after a restart; a decoder that
    has learned this run's steps keeps them when it looks for a kept state again."""
    loaded = tiny_model("llama")
    prompt = [random.Random(3).randrange(97) for _ in range(24)]
    vocab = loaded.model.config.vocab_size

    def asked_in_one_request(decoder: Decoder) -> int:
        decoder.reset()
        source = Source(Clock(decoder), [], False, 0.004, vocab)
        decoder.generate(prompt, source, DecodeConfig(max_new_tokens=40, budget=8))
        return source.asked

    before = Decoder(loaded)
    before.calibrate(tmp_path, measure=False)
    for _ in range(6):
        asked_in_one_request(before)
    assert not before.gate.paying("cold")
    before.save_learned()
    after, fresh = Decoder(loaded), Decoder(loaded)
    after.calibrate(tmp_path, measure=False)
    assert not after.gate.paying("cold")
    assert asked_in_one_request(after) < asked_in_one_request(fresh) / 2
    learned = after.gate.describe()
    after.calibrate(tmp_path, measure=False)  # a later look (an idle calibration) replaces nothing learned since
    assert after.gate.describe() == learned


class OneAhead(Source):
    """The right next token alone, as one sure draft."""

    def propose(self, context):
        found = super().propose(context)
        return [p.prefix(1) for p in found]


def timed_beside_plain(new_tokens: int) -> tuple[list[int], int, list[int], Decoder, Clock]:
    """The tiny llama model's prompt of 24 tokens: (the prompt, the vocabulary's size, the `new_tokens` plain decoding
    writes after it, a fresh decoder on the model, the fake clock its steps run on)."""
    loaded = tiny_model("llama")
    prompt = [random.Random(6).randrange(97) for _ in range(24)]
    vocab = loaded.model.config.vocab_size
    plain = Decoder(loaded).generate(prompt, Source(None, [], False, 0.0, vocab),
                                     DecodeConfig(max_new_tokens=new_tokens, budget=0)).tokens
    decoder = Decoder(loaded)
    return prompt, vocab, plain, decoder, Clock(decoder)


def context_beside_workspace(workspace_work: float, right: type = OneAhead,
                             requests: int = 12) -> tuple[dict, int, int, int]:
    """`requests` requests of 40 tokens drafted from a mix of a cheap context lookup that is right (`right`: one token
    ahead, or Source's six) and a workspace lookup that is never right and costs `workspace_work` seconds (a plain
    step: 0.01), each output checked to be plain's: (the gate's description, steps, times the workspace was asked,
    times the context was). The mix names the first source's proposals "context"."""
    from rest_lsp.drafting.drafts import DraftMix

    prompt, vocab, plain, decoder, clock = timed_beside_plain(40)
    context = right(clock, prompt + plain, True, 0.0002, vocab)
    workspace = Source(clock, [], False, workspace_work, vocab)
    steps = 0
    for _ in range(requests):
        decoder.reset()
        result = decoder.generate(prompt, DraftMix([("context", context), ("workspace", workspace)]),
                                  DecodeConfig(max_new_tokens=40, budget=8))
        assert result.tokens == plain
        steps += result.steps
    return decoder.gate.describe(), steps, workspace.asked, context.asked


def test_a_step_after_copying_the_context_drafts_the_context_alone():
    """After a step whose deepest accepted draft the context proposed, the next drafts the context alone: a cheap
    workspace that is never right is not asked there (its siblings would take a share of the copied chain's next
    node); the output is plain's."""
    said, steps, workspace, context = context_beside_workspace(0.0002, right=Source, requests=6)
    assert said["copying"]["seen"] == 0 and said["lite"]["copying"]["seen"] > 0, said  # lite alone, judged
    # the workspace asked on the requests' first steps (and rare cold ones), the context on every step
    assert workspace <= 2 * 6 and context == steps, (workspace, context, steps)


def test_where_every_source_costs_more_than_it_brings_the_context_alone_still_drafts():
    """Full drafting loses (1 draft accepted for 1.5 plain steps of work), a lite step (the context alone) pays,
    so steps go on drafting one token ahead without asking the costly source; the output is plain's. (Each step
    after one that accepted the context's draft is "copying": lite whenever it drafts.)"""
    said, steps, workspace, context = context_beside_workspace(0.015)
    assert said["copying"]["seen"] == 0 and said["lite"]["copying"]["drafts"], said
    assert workspace < 0.3 * steps and context > 0.8 * steps, (workspace, context, steps)
    assert steps < 0.7 * 12 * 40  # drafts accepted: about two tokens a step


def test_where_every_source_pays_but_the_context_alone_pays_more_steps_draft_lite():
    """The workspace costs half a plain step: full drafting still pays (a draft accepted a step, for about half a
    step of work), the context alone pays about twice as much, so steps draft lite and the workspace is rarely
    asked; the output is plain's. (Judging full drafting alone kept asking the workspace on every step.) Once the
    context's draft is accepted the steps are "copying", whose lite ledger alone is judged."""
    said, steps, workspace, context = context_beside_workspace(0.005)
    assert said["copying"]["seen"] == 0 and said["lite"]["copying"]["gain"] > 0, said
    assert workspace < 0.3 * steps and context > 0.8 * steps, (workspace, context, steps)


class Matching:
    """A context source that is always wrong (tokens the model does not write: none of `written`) and claims a match
    of `match_length` tokens: what it proposes is never accepted, so every step after the first follows a miss;
    `asked` counts its proposals."""

    def __init__(self, match_length: int, vocab: int, written: list[int]):
        self.match_length, self.rnd = match_length, random.Random(1)
        self.tokens = [t for t in range(vocab) if t not in set(written)]
        self.asked = 0

    def propose(self, context):
        self.asked += 1
        chain = tuple(self.rnd.choice(self.tokens) for _ in range(4))
        return [Proposal("src", self.match_length, chain, tuple(range(-1, 3)), (1.0,) * 4)]


@pytest.mark.parametrize("longer", [0, 1])
def test_a_step_after_a_miss_where_the_context_matches_long_is_copying(longer):
    """A step after one that accepted nothing, once such steps have stopped drafting (the source is always wrong),
    is "copying" (lite alone, its own ledger) where the context's match is at least ECHO_MATCH tokens long, and
    stays plain where it is shorter; the output is plain's either way, and a lite step asks the context once."""
    from rest_lsp.drafting.drafts import DraftMix
    from rest_lsp.engine.decoding import ECHO_MATCH

    prompt, vocab, plain, decoder, clock = timed_beside_plain(64)
    context = Matching(ECHO_MATCH - 1 + longer, vocab, plain)
    workspace = Source(clock, [], False, 0.0, vocab)
    mix = DraftMix([("context", context), ("workspace", workspace)])
    result = decoder.generate(prompt, mix, DecodeConfig(max_new_tokens=64, budget=8))
    assert result.tokens == plain
    said = decoder.gate.describe()
    assert not said["cold"]["drafts"] and not said["lite"]["cold"]["drafts"], said  # judged, and plain since
    assert (said["lite"]["copying"]["seen"] > 0) == bool(longer), said
    # asked once a step, and once more by each full step (every source; it asks the workspace too): a lite step's
    # tree is built from the proposals that told its situation
    assert context.asked <= result.steps + workspace.asked, (context.asked, result.steps, workspace.asked)
