"""The step cost is learned from the steps the decoder runs (rest_lsp/engine/step_cost.py): trees shrink where rows
are dear, down to plain steps, grow where they are cheap, and load that slows every step alike changes nothing."""

from __future__ import annotations

import random

import pytest

from rest_lsp.drafting.draft_tree import DraftTree, build_tree
from rest_lsp.drafting.drafts import Proposal
from rest_lsp.engine import decoding, step_cost
from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.engine.runmode import PACKINGS, cost_curve
from rest_lsp.engine.step_cost import CONSERVATIVE, StepCosts

from support import tiny_model

STEEP = lambda rows: 1.0 + 1.5 * (rows - 1)  # noqa: E731 - a row costs more than a plain step: no tree pays
FLAT = lambda rows: 1.0 + 0.01 * (rows - 1)  # noqa: E731 - rows nearly free: a GPU's curve
FLAT_SEED = cost_curve({1: 1.0, 2: 1.05, 64: 1.1})


def sure_tree(n: int = 16) -> DraftTree:
    """A chain of n drafts the sources are sure of (0.95 each level)."""
    return DraftTree(list(range(n + 1)), list(range(-1, n)), list(range(n + 1)),
                     tuple(0.95**i for i in range(n + 1)), ((),) * (n + 1))


def run(costs: StepCosts, cost, steps: int = 300, load=lambda step: 1.0, seed: int = 0) -> list[int]:
    """The rows of each step a decoder would run on trees of 16 sure drafts, each step timed as cost(rows) times
    the load at that step, with 3% noise."""
    rnd = random.Random(seed)
    sizes = []
    for step in range(steps):
        rows = len(costs.choose(sure_tree()))
        costs.record(rows, 0.01 * cost(rows) * load(step) * rnd.uniform(0.97, 1.03))
        sizes.append(rows)
    return sizes


def typical(sizes: list[int]) -> int:
    """The most common size of the last 100 steps (probes aside)."""
    tail = sizes[-100:]
    return max(set(tail), key=tail.count)


def test_a_step_whose_cost_rises_steeply_per_row_shrinks_trees_to_plain_steps():
    """Seeded with a flat curve measured on another day (or another machine's), the steps run say otherwise."""
    costs = StepCosts(FLAT_SEED, "measured")
    sizes = run(costs, STEEP)
    assert sizes[1] > 8  # the seed let big trees through at first
    assert typical(sizes) == 1
    assert sum(s > 1 for s in sizes[-100:]) <= 100 // step_cost.PROBE_EVERY + 1  # only the growth probes
    assert costs.curve()[2] > 1.5


def test_a_flat_step_cost_grows_trees_from_the_conservative_seed():
    costs = StepCosts()
    assert costs.source == "conservative" and costs.curve() is CONSERVATIVE
    sizes = run(costs, FLAT)
    assert sizes[1] < 17  # the conservative seed starts smaller
    assert typical(sizes) == 17  # root and all 16 drafts
    assert costs.curve()[17] < 1.2


def test_trees_grow_back_when_steps_become_cheap_again():
    """A load that makes big steps dear for a while (another process on the vector units, say) shrinks trees; the
    growth probes see when it has gone."""
    costs = StepCosts()
    assert typical(run(costs, STEEP)) == 1
    assert typical(run(costs, FLAT)) == 17


@pytest.mark.parametrize("load", [lambda step: 3.0, lambda step: 1.0 + (step // 50) % 3])
def test_load_that_slows_every_step_alike_leaves_the_choice_unchanged(load):
    """The cost of a tree step is read against plain steps timed close to it: a constant load changes no size at
    all, a load that comes and goes (1-3x) every 50 steps leaves the throughput within 5% and the curve where the
    trees are within 10%."""
    curve_shape = lambda rows: 1.0 + 0.3 * (rows - 1)  # noqa: E731 - a CPU where some drafts pay
    quiet, busy = StepCosts(), StepCosts()
    alone = run(quiet, curve_shape, seed=1)
    loaded = run(busy, curve_shape, load=load, seed=1)
    assert 1 < typical(alone) < 17

    def speed(sizes: list[int]) -> float:  # expected tokens per unit of the step's true cost
        gains = [1 + sum(sure_tree().shares[1:rows]) for rows in sizes[-100:]]
        return sum(gains) / sum(curve_shape(rows) for rows in sizes[-100:])

    assert speed(loaded) == pytest.approx(speed(alone), rel=0.05)
    k = typical(alone)
    assert busy.curve()[k] == pytest.approx(quiet.curve()[k], rel=0.1)  # where both decoders' trees are
    if load(0) == load(299):  # constant
        assert loaded == alone


def test_tree_steps_far_from_a_plain_step_teach_nothing_until_a_plain_step_is_run():
    costs = StepCosts(FLAT_SEED, "measured")
    for _ in range(step_cost.REFERENCE_AGE):
        assert len(costs.choose(sure_tree())) > 1  # a fresh decoder runs its seed's trees
        costs.record(17, 0.011)
    assert costs.seen() == {}  # nothing to compare them with
    assert len(costs.choose(sure_tree())) == 1 and costs.references == 1  # so a plain step is timed
    costs.record(1, 0.01)
    for _ in range(step_cost.REFERENCE_AGE):
        assert len(costs.choose(sure_tree())) > 1
        costs.record(17, 0.011)
    assert costs.seen() == {}  # judged at the next plain step, which is due now
    assert len(costs.choose(sure_tree())) == 1 and costs.references == 2
    costs.record(1, 0.01)
    assert costs.seen()[24][1] == pytest.approx(1.1, rel=0.02)  # against the plain steps before and after them
    for _ in range(step_cost.REFERENCE_AGE - 1):
        costs.record(17, 0.02)
    costs.record(1, 0.02)  # the load doubled somewhere between the two plain steps: those tree steps teach nothing
    assert costs.seen()[24][1] == pytest.approx(1.1, rel=0.02)


def test_a_tree_step_without_a_reference_teaches_nothing():
    costs = StepCosts()
    costs.record(8, 1.0)
    assert costs.seen() == {} and costs.curve() is CONSERVATIVE


# rows dearer the more a pass holds
CONVEX = lambda rows: 1.0 + 0.03 * (rows - 1) + 0.006 * (rows - 1) ** 2  # noqa: E731


def likely_tree(n: int = 8, p: float = 0.6) -> DraftTree:
    """A chain of n drafts, each accepted with probability p once its parent is."""
    return DraftTree(list(range(n + 1)), list(range(-1, n)), list(range(n + 1)),
                     tuple(p**i for i in range(n + 1)), ((),) * (n + 1))


def test_drafts_above_a_prompt_tail_pay_for_what_they_add_to_its_pass():
    """A request's first pass computes the prompt's uncached tail under its tree: the tail is paid either way, and on
    a curve whose rows cost more the more a pass holds, the drafts are cut to what they add to that pass."""
    costs = StepCosts([0.0] + [CONVEX(k) for k in range(1, 65)], "measured")
    alone, on_tail = costs.choose(likely_tree()), costs.choose(likely_tree(), under=12)
    assert costs.extra(3) == pytest.approx(CONVEX(3) - 1.0)
    assert costs.extra(3, under=12) == pytest.approx(CONVEX(15) - CONVEX(13))
    assert 1 < len(on_tail) < len(alone)
    gain = lambda tree, extra: sum(tree.shares) / (1.0 + extra)  # noqa: E731 - tokens a step per plain step's time
    assert gain(on_tail, costs.extra(len(on_tail), 12)) > gain(alone, costs.extra(len(alone), 12))
    assert gain(alone, costs.extra(len(alone))) > gain(on_tail, costs.extra(len(on_tail)))


def test_drafts_never_add_less_than_the_least_a_draft_costs_where_the_curve_dips():
    """Each bucket has its own correction, so a learned curve can dip where one bucket meets the next: a difference
    of two costs across the dip would credit drafts with negative time, in the cut and in the draft gate."""
    dip = [0.0] + [CONVEX(k) if k <= 12 else CONVEX(k) - 0.8 for k in range(1, 65)]
    costs = StepCosts(dip, "measured")
    assert costs.cost(13) < costs.cost(11)
    assert costs.extra(3, under=10) == step_cost.MIN_DRAFT_COST and costs.extra(1, under=10) == 0.0
    assert costs.extra(4) == pytest.approx(CONVEX(4) - 1.0)


def test_a_pass_over_a_prompt_tail_is_neither_a_reference_nor_a_growth_probe():
    costs = StepCosts([0.0] + [CONVEX(k) for k in range(1, 65)], "measured")
    costs.record(1, 0.01)
    for _ in range(step_cost.REFERENCE_AGE + 2 * step_cost.PROBE_EVERY):
        tree = costs.choose(likely_tree(16), under=20)
        assert not costs.probing and len(tree) > 1
        costs.record(20 + len(tree), 0.01 * CONVEX(20 + len(tree)))
    assert costs.references == costs.probes == 0
    assert len(costs.choose(likely_tree(16))) == 1 and costs.references == 1  # a tree step on its own: reference due


# -- the decoder -----------------------------------------------------------------------------------------------------
class _Oracle:
    """Proposes the true continuation as one sure chain (ratios 1)."""

    def __init__(self, full: list[int]):
        self.full = full

    def propose(self, context):
        nxt = self.full[len(context): len(context) + 8]
        if not nxt or self.full[: len(context)] != list(context):
            return []
        return [Proposal("oracle", 16, tuple(nxt), tuple(range(-1, len(nxt) - 1)), (1.0,) * len(nxt))]


class FakeClock:
    """Advances by cost(rows) of each verification pass, whatever the real step took."""

    def __init__(self, decoder: Decoder, cost, load: float = 1.0):
        self.now = 0.0
        real = decoder.verify

        def verify(tree, chain=()):
            self.now += 0.01 * load * cost(len(tree) + len(chain))
            return real(tree, chain)

        decoder.verify = verify
        decoder.clock = lambda: self.now


@pytest.mark.parametrize("cost, few_steps", [(FLAT, True), (STEEP, False)])
def test_the_decoder_sizes_trees_by_the_steps_it_ran(cost, few_steps):
    """Same drafts, same output: where rows are dear REST falls back to plain steps, where they are cheap it
    verifies whole chains."""
    loaded = tiny_model("llama")
    prompt = [random.Random(2).randrange(97) for _ in range(30)]
    decoder = Decoder(loaded)
    truth = decoder.generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=120, budget=0)).tokens
    decoder = Decoder(loaded)
    FakeClock(decoder, cost)
    for _ in range(12):  # learns
        decoder.generate(prompt, _Oracle(prompt + truth), DecodeConfig(max_new_tokens=60, budget=8))
        decoder.reset()
    result = decoder.generate(prompt, _Oracle(prompt + truth), DecodeConfig(max_new_tokens=120, budget=8))
    assert result.tokens == truth
    assert (result.tokens_per_step > 3) == few_steps, result.tokens_per_step
    if not few_steps:
        assert result.tokens_per_step < 1.3  # plain steps, but for the probes


def test_a_cpu_decoder_never_sizes_trees_by_another_machines_curve():
    decoder = Decoder(tiny_model("llama"))
    assert decoder.costs.source == "conservative"
    assert decoder.step_cost == CONSERVATIVE and decoder.step_cost != decoder.run.step_cost
    assert decoder.run.step_cost == PACKINGS[decoder.run.packing].step_cost  # kept: the reference machine's record


def test_the_mode_choices_steps_seed_the_curve_when_nothing_else_was_measured(tmp_path, monkeypatch):
    decoder = Decoder(tiny_model("llama"))
    monkeypatch.setattr(decoding, "_mode_choice_steps", lambda name, device, mode, cache_dir: (20.0, 30.0))
    assert decoder.calibrate(tmp_path, measure=False) is None
    assert decoder.costs.source == "mode choice"
    assert decoder.step_cost[8] == pytest.approx(1.5) and decoder.step_cost[1] == 1.0


def test_a_worthless_draft_is_never_probed():
    costs = StepCosts()
    worthless = DraftTree([0, 1, 2], [-1, 0, 1], [0, 1, 2], (1.0, 0.01, 0.005), ((),) * 3)
    costs.record(1, 0.01)
    for _ in range(3 * step_cost.PROBE_EVERY):
        assert len(costs.choose(worthless)) == 1
        costs.record(1, 0.01)
    assert costs.probes == 0


def test_the_mode_choice_kept_here_is_read_back_as_the_seeds_two_steps(tmp_path):
    import torch

    from rest_lsp.engine import mode_choice
    from rest_lsp.engine.runmode import decide

    cpu = torch.device("cpu")
    names = mode_choice.candidates(decide("cpu", None, gguf=True), True)
    if not names:
        pytest.skip("no mode choice here: the integer kernel does not build")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    key = mode_choice.choice_key(gguf, cpu, names)
    timings = {n: mode_choice.Timing(20.0, 30.0, 100.0) for n in names}
    mode_choice.write_cached(mode_choice.cache_file(tmp_path, key), key, mode_choice.Choice("gguf", timings, "x"))
    assert decoding._mode_choice_steps(str(gguf), cpu, "gguf", tmp_path) == (20.0, 30.0)
    assert decoding._mode_choice_steps(str(gguf), cpu, "gguf", tmp_path / "elsewhere") is None
    assert decoding._mode_choice_steps(str(tmp_path), cpu, "gguf", tmp_path) is None  # not a .gguf


# -- what was learned, kept for the next start -----------------------------------------------------------------------
def learned_steep(tmp_path) -> tuple[Decoder, list[int], list[int]]:
    """A decoder that looked for a learned curve under tmp_path, then learned from steps where rows are dear."""
    loaded = tiny_model("llama")
    prompt = [random.Random(3).randrange(97) for _ in range(30)]
    truth = Decoder(loaded).generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=60, budget=0)).tokens
    decoder = Decoder(loaded)
    decoder.calibrate(tmp_path, measure=False)
    FakeClock(decoder, STEEP)
    for _ in range(8):
        decoder.generate(prompt, _Oracle(prompt + truth), DecodeConfig(max_new_tokens=60, budget=8))
        decoder.reset()
    return decoder, prompt, truth


def test_the_curve_the_steps_taught_seeds_the_next_start_on_this_machine(tmp_path):
    """A restarted server starts from what the last one's steps cost here, not from the conservative guess: where
    rows are dear its first completion already runs plain steps."""
    before, prompt, truth = learned_steep(tmp_path)
    assert before.costs.source == "conservative" and before.step_cost[2] > 1.5
    before.save_learned()
    after = Decoder(tiny_model("llama"))
    assert after.costs.source == "conservative"
    after.calibrate(tmp_path, measure=False)
    assert after.costs.source == "learned here"
    assert after.step_cost[1:17] == pytest.approx(before.step_cost[1:17], abs=1e-3)
    FakeClock(after, STEEP)
    result = after.generate(prompt, _Oracle(prompt + truth), DecodeConfig(max_new_tokens=60, budget=8))
    assert result.tokens == truth and result.tokens_per_step < 1.3
    fresh = Decoder(tiny_model("llama"))
    FakeClock(fresh, STEEP)
    assert fresh.generate(prompt, _Oracle(prompt + truth), DecodeConfig(max_new_tokens=60, budget=8)).steps < result.steps


def test_nothing_is_kept_before_a_tree_step_taught_something_or_for_another_model(tmp_path):
    decoder = Decoder(tiny_model("llama"))
    decoder.save_learned()  # before calibrate: nowhere to keep it
    decoder.calibrate(tmp_path, measure=False)
    decoder.save_learned()  # nothing learned: the seed is not kept as if it were
    assert not list(tmp_path.rglob(f"{decoding.LEARNED_PREFIX}*"))
    learned, _, _ = learned_steep(tmp_path)
    learned.save_learned()
    assert len(list(tmp_path.rglob(f"{decoding.LEARNED_PREFIX}*"))) == 1
    other = Decoder(tiny_model("qwen2"))  # another model: another key, another file
    other.calibrate(tmp_path, measure=False)
    assert other.costs.source == "conservative"


@pytest.mark.parametrize("damage", ["not json", "another key", "not a curve"])
def test_a_damaged_or_foreign_learned_curve_is_not_used(tmp_path, caplog, damage):
    import json

    learned, _, _ = learned_steep(tmp_path)
    learned.save_learned()
    (path,) = tmp_path.rglob(f"{decoding.LEARNED_PREFIX}*")
    data = json.loads(path.read_text())
    if damage == "not json":
        path.write_text("{")
    elif damage == "another key":
        path.write_text(json.dumps({**data, "key": {**data["key"], "machine": "another CPU"}}))
    else:
        path.write_text(json.dumps({**data, "curve": [1.0, -3.0, float("nan")]}))
    after = Decoder(tiny_model("llama"))
    with caplog.at_level("WARNING"):
        after.calibrate(tmp_path, measure=False)
    assert after.costs.source == "conservative"
    assert sum("learned step cost" in r.getMessage() for r in caplog.records) == 1


def test_a_learned_curve_is_checked_before_it_is_a_seed():
    assert step_cost.from_learned_json({"curve": [1.0, 1.2, 1.5]}) == [0.0, 1.0, 1.2, 1.5]
    for bad in (None, [], {"curve": "x"}, {"curve": [1.2, 1.5]}, {"curve": [1.0]}, {"curve": [1.0, 0.5]},
                {"curve": [1.0, float("inf")]}, {"curve": [1.0, None]}):
        assert step_cost.from_learned_json(bad) is None, bad


def test_a_save_while_a_step_is_recorded_keeps_nothing_and_raises_nothing(tmp_path, monkeypatch):
    """A replaced model is saved while its last request may still record steps: the deques change under the walk."""
    learned, _, _ = learned_steep(tmp_path)

    def busy():
        raise RuntimeError("deque mutated during iteration")

    monkeypatch.setattr(learned.costs, "learned_json", busy)
    learned.save_learned()
    assert not list(tmp_path.rglob(f"{decoding.LEARNED_PREFIX}*"))


def test_a_start_that_taught_the_curve_nothing_keeps_the_one_it_started_from(tmp_path):
    """A server seeded with the kept curve that ran no tree step (plain steps only, or steps on fewer threads) saves
    its gate but leaves the kept curve as it was: the start after it still begins from it."""
    before, prompt, truth = learned_steep(tmp_path)
    before.save_learned()
    after = Decoder(tiny_model("llama"))
    after.calibrate(tmp_path, measure=False)
    after.generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=20, budget=0))
    assert after.costs.learned_json() is None
    after.gate.learned_json = lambda: {"situations": {}}  # what its drafted steps taught the gate is saved
    after.save_learned()
    third = Decoder(tiny_model("llama"))
    third.calibrate(tmp_path, measure=False)
    assert third.costs.source == "learned here"
    assert third.step_cost[1:17] == pytest.approx(before.step_cost[1:17], abs=1e-3)


def test_a_tree_weighed_at_less_trust_is_cut_shorter():
    """The same drafts on the same curve (rows dearer past 4): nodes weighed at half their shares keep fewer rows;
    none of a sure chain's is cut at full trust."""
    tree = build_tree(0, [((1, 2, 3, 4, 5, 6), 3.0), ((7, 8), 1.0)], 8)
    costs = StepCosts(cost_curve({1: 1.0, 2: 1.1, 4: 1.35, 8: 2.4}), "measured", learn=False)
    trusted, doubted = len(costs.choose(tree)), len(costs.choose(tree, trust=0.5))
    assert 1 < doubted < trusted and trusted >= 7, (doubted, trusted)


def test_a_first_pass_over_a_prompt_tail_is_learned_and_judged_by_all_its_rows():
    """The decoder's first pass computes the prompt's uncached tail under the tree: the curve learns that pass by all
    its rows, and the gate is told what the tree's rows added to it, not what they would cost alone; that tree (a
    request's first) is weighed at FIRST_TREE_TRUST, the later ones at their shares."""
    loaded = tiny_model("llama")
    prompt = [random.Random(3).randrange(97) for _ in range(30)]
    decoder = Decoder(loaded)
    assert decoder.chain_tail >= len(prompt)  # the whole prompt is the first pass's tail
    truth = decoder.generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=24, budget=0)).tokens
    decoder = Decoder(loaded)
    decoder.costs = StepCosts([0.0] + [CONVEX(k) for k in range(1, 65)], "measured")
    FakeClock(decoder, CONVEX)
    reports = []
    real_report = decoder.gate.report
    decoder.gate.report = lambda situation, drafts, extra, *rest: (reports.append((situation, extra)),
                                                                   real_report(situation, drafts, extra, *rest))
    rows = []
    real_choose = decoder.costs.choose
    trusts = []
    decoder.costs.choose = (lambda tree, under=0, trust=1.0: trusts.append(trust)
                            or rows.append((under, len(t := real_choose(tree, under, trust)))) or t)
    decoder.generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=4, budget=8))  # plain steps: the reference
    decoder.reset()
    rows.clear(), reports.clear(), trusts.clear()
    result = decoder.generate(prompt, _Oracle(prompt + truth), DecodeConfig(max_new_tokens=24, budget=8))
    assert result.tokens == truth
    under, first = rows[0]
    assert under == len(prompt) - 1 and first > 1  # the oracle is sure: its drafts pay even on the tail, at half
    assert trusts[0] == decoding.FIRST_TREE_TRUST < 1.0 and set(trusts[1:]) == {1.0}  # a request's first tree only
    assert reports[0] == ("first", pytest.approx(CONVEX(under + first) - CONVEX(under + 1)))
    decoder.generate(prompt + truth, _Oracle([]), DecodeConfig(max_new_tokens=2, budget=8))  # a plain step judges
    assert step_cost.KNOTS[step_cost._knot(under + first)] in decoder.costs.seen()
