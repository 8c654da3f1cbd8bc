import dataclasses
import random

import pytest
import torch

from rest_lsp.drafting.draft_tree import DraftTree, build_tree, tree_attention_mask, tree_position_ids


def test_shared_prefixes_become_one_node():
    tree = build_tree(7, [((1, 2, 3), 2.0), ((1, 2, 4), 1.0), ((5,), 1.0)], budget=10)
    assert tree.tokens[0] == 7 and tree.parents[0] == -1 and tree.depths[0] == 0
    paths = set()
    for i in range(1, len(tree)):
        path, j = [], i
        while j > 0:
            path.append(tree.tokens[j])
            j = tree.parents[j]
        paths.add(tuple(reversed(path)))
    assert paths == {(1,), (1, 2), (1, 2, 3), (1, 2, 4), (5,)}
    assert len(tree) == 6  # root + 5 distinct prefixes


def test_budget_keeps_heaviest_nodes_and_their_parents():
    rnd = random.Random(1)
    conts = [(tuple(rnd.randrange(4) for _ in range(rnd.randrange(1, 6))), float(rnd.randrange(1, 9))) for _ in range(40)]
    full = build_tree(0, conts, budget=10_000)
    weights = {}
    for tokens, w in conts:
        for k in range(1, len(tokens) + 1):
            weights[tokens[:k]] = weights.get(tokens[:k], 0.0) + w
    assert len(full) - 1 == len(weights)
    for budget in (0, 1, 3, 8, 20):
        tree = build_tree(0, conts, budget)
        assert len(tree) - 1 == min(budget, len(weights))
        kept = []
        for i in range(1, len(tree)):
            assert tree.parents[i] < i  # parents first: the ancestor mask depends on it
            assert tree.depths[i] == tree.depths[tree.parents[i]] + 1
            path, j = [], i
            while j > 0:
                path.append(tree.tokens[j])
                j = tree.parents[j]
            kept.append(tuple(reversed(path)))
        # nothing left out outweighs the lightest node kept, unless its parent was left out too
        lightest = min((weights[p] for p in kept), default=float("inf"))
        for prefix, w in weights.items():
            if prefix not in kept and (len(prefix) == 1 or prefix[:-1] in kept):
                assert w <= lightest


def brute_force_mask(parents, past):
    n = len(parents)
    allowed = [[True] * past + [False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j >= 0:
            allowed[i][past + j] = True
            j = parents[j]
    return torch.tensor(allowed)


@pytest.mark.parametrize("seed", range(20))
def test_mask_and_positions_match_brute_force(seed):
    rnd = random.Random(seed)
    conts = [(tuple(rnd.randrange(3) for _ in range(rnd.randrange(1, 7))), 1.0) for _ in range(rnd.randrange(1, 15))]
    tree = build_tree(5, conts, budget=rnd.randrange(1, 30))
    past = rnd.randrange(0, 9)
    mask = tree_attention_mask(tree, past, torch.float32)
    assert mask.shape == (1, 1, len(tree), past + len(tree))
    expect = brute_force_mask(tree.parents, past)
    assert torch.equal(mask[0, 0] == 0, expect)
    assert torch.all(mask[0, 0][~expect] == torch.finfo(torch.float32).min)
    pos = tree_position_ids(tree, past)
    for i in range(len(tree)):
        depth, j = 0, i
        while tree.parents[j] >= 0:
            depth, j = depth + 1, tree.parents[j]
        assert pos[0, i].item() == past + depth


def test_fit_to_cost_keeps_the_prefix_that_pays_for_itself():
    from rest_lsp.drafting.draft_tree import fit_to_cost

    # one sure chain of 6 tokens and many unlikely singletons
    conts = [((1, 2, 3, 4, 5, 6), 90.0)] + [((t,), 1.0) for t in range(10, 20)]
    tree = build_tree(0, conts, budget=16)
    assert tree.shares[0] == 1.0 and abs(tree.shares[1] - 0.9) < 1e-9
    flat = fit_to_cost(tree, [0.0, 1.0, 1.0])
    assert flat == tree  # verification is free: keep everything
    steep = [0.0] + [1.0 + 0.5 * k for k in range(64)]
    cut = fit_to_cost(tree, steep)
    assert cut.tokens == tree.tokens[:7]  # the chain pays (0.9 each), the 0.01 singletons do not
    assert fit_to_cost(tree, [0.0, 1.0, 10.0]).tokens == [0]  # nothing pays: a plain step
    assert fit_to_cost(tree, steep, trust=0.1).tokens == [0]  # probabilities scaled to 10%: not worth it
    # brute force: the chosen size maximises expected tokens per unit of cost
    def value(n):
        return (1 + sum(tree.shares[1 : n + 1])) / steep[n + 1]
    assert max(range(len(tree)), key=value) == len(cut) - 1


def test_the_first_head_call_takes_the_likely_nodes_its_rows_pay_for():
    """The head's rows are weighed on its cost by rows measured here: where they cost about one (AVX-512 tiles, a
    GPU) the likely nodes come in one call; where each costs more (AVX2) the root and the nodes a walk likely
    reaches, a walk that leaves them paying one more call (`miss_rows`)."""
    from rest_lsp.engine.decoding import head_rows
    from rest_lsp.engine.runmode import FLAT_STEP_COST, cost_curve

    # 0 -> 1 -> 2, 0 -> 3: the walk reaches 1 half the time, 2 and 3 a tenth each
    tree = DraftTree([1, 2, 3, 4], [-1, 0, 1, 0], [0, 1, 2, 1], shares=(1.0, 0.5, 0.1, 0.1))
    assert head_rows(tree, FLAT_STEP_COST, 12, 4) == [0, 1, 2, 3]  # rows are free: all of them
    assert head_rows(tree, FLAT_STEP_COST, 2, 4) == [0, 1]  # at most `largest`, the likeliest
    avx2 = cost_curve({1: 1.0, 2: 1.12, 3: 1.31, 4: 1.42, 8: 2.08, 12: 2.96})  # a head measured on AVX2
    # root alone: 1 + 0.6 * 1.42; with node 1: 1.12 + 0.2 * 1.42 (the least); all: 1.42
    assert head_rows(tree, avx2, 12, 4) == [0, 1]
    unlikely = DraftTree([1, 2, 3, 4], [-1, 0, 0, 0], [0, 1, 1, 1], shares=(1.0, 0.05, 0.04, 0.03))
    assert head_rows(unlikely, avx2, 12, 4) == [0]  # a walk that likely stops at the root: its row alone
    sure = DraftTree([1, 2, 3, 4, 5], [-1, 0, 1, 2, 3], [0, 1, 2, 3, 4], shares=(1.0, 0.95, 0.9, 0.85, 0.8))
    assert head_rows(sure, avx2, 12, 4) == [0, 1, 2, 3, 4]  # a chain it likely walks to its end: one call
    assert head_rows(DraftTree([1, 2], [-1, 0], [0, 1]), avx2, 12, 4) == [0]  # no shares: the root alone
    # siblings calibrated one by one can promise more than their parent: the walk still leaves at most once
    twins = DraftTree([1, 2, 3], [-1, 0, 0], [0, 1, 1], shares=(1.0, 0.97, 0.97))
    # root alone: 1 + 1.0 * 1.42 (not 1.94 * 1.42); with one twin: 1.12 + 0.97 * 1.42; both: 1.31
    assert head_rows(twins, avx2, 12, 4) == [0, 1, 2]
    steep = cost_curve({1: 1.0, 2: 1.5, 3: 2.5})
    # a miss brings one row: the root alone 1 + 1.0 (uncapped 1 + 1.94, dearer than 1.5 + 0.97 with one twin)
    assert head_rows(twins, steep, 12, 1) == [0]


def test_a_node_the_walk_reaches_outside_the_batch_brings_the_likeliest_nodes_below_it():
    """A walk that reached a node outside the batched head call goes on below it: on the packed head, the node's row
    and the likeliest rows under it cost one row, so they come in one call (values as computed alone)."""
    import torch

    from rest_lsp.engine.decoding import Decoder, below
    from support import tiny_model

    # 0 -> 1 -> 2 -> 3, 1 -> 4, 0 -> 5 -> 6
    tree = DraftTree([9, 1, 2, 3, 4, 5, 6], [-1, 0, 1, 2, 1, 0, 5], [0, 1, 2, 3, 2, 1, 2],
                     shares=(1.0, 0.5, 0.3, 0.2, 0.1, 0.4, 0.35))
    assert below(tree, 1, 3, {}) == [2, 3, 4]
    assert below(tree, 1, 2, {2: None}) == [3, 4]  # rows already computed are not asked again
    assert below(tree, 5, 3, {}) == [6] and below(tree, 3, 3, {}) == [] and below(tree, 0, 0, {}) == []

    decoder = Decoder(tiny_model("llama"))
    # each row as dear as a call: the first call takes the root alone, every other row is a miss
    decoder.run = dataclasses.replace(decoder.run, miss_rows=3, head_cost=tuple(float(k) for k in range(20)))
    calls = []
    real = decoder.logits
    decoder.logits = lambda h: calls.append(h.shape[0]) or real(h)
    hidden = torch.randn(len(tree), decoder.model.config.hidden_size)
    logits_at = decoder._head_at(tree, hidden)
    got = {n: logits_at(n) for n in (0, 1, 2, 4, 3)}
    assert calls == [1, 3, 1]  # the root; 1 with 2 and 3; then 4 alone
    for n, value in got.items():
        assert torch.equal(value, real(hidden[n : n + 1])[0].float())


@pytest.mark.parametrize("seed", range(20))
def test_a_proposal_cut_to_the_budget_gives_the_same_tree(seed):
    """The decoder merges each proposal's `budget` likeliest nodes only (Proposal.prefix): a proposal lists its nodes
    best first, so the tree of its likeliest `budget` is as likely node by node as the tree of all of it (the same
    tree but where nodes tie at the cut: either may be kept)."""
    from rest_lsp.drafting.drafts import Proposal

    rnd = random.Random(seed)
    conts = [(tuple(rnd.randrange(6) for _ in range(rnd.randint(1, 8))), float(rnd.randint(1, 9)))
             for _ in range(rnd.randint(1, 30))]
    prop = Proposal.from_continuations("src", 3, conts)
    for budget in (1, 4, 16):
        cut = prop.prefix(budget)
        assert len(cut) == min(budget, len(prop)) and all(p < i for i, p in enumerate(cut.parents))
        cut_tree, whole_tree = build_tree(7, [cut], budget), build_tree(7, [prop], budget)
        assert sorted(cut_tree.shares) == pytest.approx(sorted(whole_tree.shares))
