"""The row-exact attention kernel (kernels/row_attention.py): close to float64, and each row's result the same bits
whatever rows share the call, wherever its keys sit (the shared past or its own tail), on every path that builds."""

import pytest
import torch

from kernel_support import library_of
from rest_lsp.kernels import levels, row_attention

MIN = torch.finfo(torch.float32).min


def lib_for(level):
    """The library of `level` (None: the dispatcher's), or a skip that says why."""
    if not row_attention.available():
        pytest.skip("no C compiler here builds the row-exact attention kernel")
    return row_attention.library() if level is None else library_of(row_attention, level)


def random_parents(n: int, gen: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def tree_mask(parents: list[int]) -> torch.Tensor:
    """Additive [n, n]: a node sees its ancestors and itself (parents precede children)."""
    mask = torch.full((len(parents), len(parents)), MIN)
    for i, parent in enumerate(parents):
        mask[i, i] = 0
        if parent >= 0:
            mask[i] = torch.maximum(mask[i], mask[parent])
    return mask


def ancestors(parents: list[int], i: int) -> list[int]:
    chain = []
    while i >= 0:
        chain.append(i)
        i = parents[i]
    return chain[::-1]


def caches(hkv: int, rows: int, d: int, gen: torch.Generator, capacity: int | None = None):
    k = torch.randn(hkv, capacity or rows, d, generator=gen)
    v = torch.randn(hkv, capacity or rows, d, generator=gen)
    return k, v


SHAPES = [(14, 2, 64), (4, 4, 16), (6, 2, 20), (3, 1, 7), (8, 2, 128)]  # Qwen2.5-0.5B's, then odd ones


@pytest.mark.parametrize("level", levels.LEVELS)
@pytest.mark.parametrize("hq,hkv,d", SHAPES)
def test_close_to_the_float64_reference(level, hq, hkv, d):
    lib = lib_for(level)
    gen = torch.Generator().manual_seed(hq * 100 + d)
    past, n = 37, 16
    k, v = caches(hkv, past + n + 5, d, gen)
    q = torch.randn(hq, n, d, generator=gen)
    mask = tree_mask(random_parents(n, gen))
    got = row_attention.row_attn(q, k, v, past + n, mask, past, d**-0.5, lib=lib)
    want = row_attention.reference(q, k, v, past + n, mask, past, d**-0.5)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
    plain = row_attention.row_attn(q[:, :1], k, v, past + 1, None, 0, d**-0.5, lib=lib)
    assert torch.allclose(plain.double(), row_attention.reference(q[:, :1], k, v, past + 1, None, 0, d**-0.5),
                          rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("level", levels.LEVELS)
@pytest.mark.parametrize("hq,hkv,d", SHAPES)
def test_a_row_is_the_same_bits_alone_or_in_a_tree(level, hq, hkv, d):
    """One row of a random 16-row tree, called alone with its own visible columns, gives the tree's bits; so does
    the plain step (one row, its ancestors committed before it)."""
    lib = lib_for(level)
    gen = torch.Generator().manual_seed(7 + d)
    for trial in range(3):
        past, n = [1, 300, 45][trial], 16
        k, v = caches(hkv, past + n, d, gen, capacity=past + n + 8)
        q = torch.randn(hq, n, d, generator=gen) * 3
        parents = random_parents(n, gen)
        mask = tree_mask(parents)
        tree = row_attention.row_attn(q, k, v, past + n, mask, past, d**-0.5, lib=lib).view(n, hq, d)
        for i in range(n):
            alone = row_attention.row_attn(q[:, i : i + 1], k, v, past + n, mask[i : i + 1], past, d**-0.5, lib=lib)
            assert torch.equal(alone.view(hq, d), tree[i]), (trial, i)
            # the plain step: the ancestors committed at past.., the row itself next, no mask
            chain = ancestors(parents, i)
            kp, vp = k.clone(), v.clone()
            kp[:, past : past + len(chain)] = k[:, [past + a for a in chain]]
            vp[:, past : past + len(chain)] = v[:, [past + a for a in chain]]
            plain = row_attention.row_attn(q[:, i : i + 1], kp, vp, past + len(chain), None, 0, d**-0.5, lib=lib)
            assert torch.equal(plain.view(hq, d), tree[i]), (trial, i)
            # ...and with its ancestors as a tail over a shorter shared part (a chained step's split)
            cut = max(1, past // 2)
            tail = torch.full((1, past + len(chain) - cut), MIN)
            tail[0] = 0
            split = row_attention.row_attn(q[:, i : i + 1], kp, vp, past + len(chain), tail, cut, d**-0.5, lib=lib)
            assert torch.equal(split.view(hq, d), tree[i]), (trial, i)


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
def test_every_path_computes_the_same_bits(hq, hkv, d):
    """Every level this CPU runs, the same bits: head sizes that fill the vectors and ones that leave a part."""
    gen = torch.Generator().manual_seed(3)
    past, n = 133, 16
    k, v = caches(hkv, past + n, d, gen)
    q = torch.randn(hq, n, d, generator=gen) * 4
    mask = tree_mask(random_parents(n, gen))
    want = row_attention.row_attn(q, k, v, past + n, mask, past, 0.125, lib=lib_for(None))
    for level in levels.runnable():
        lib = row_attention.library(level)
        if lib is not None:
            assert torch.equal(row_attention.row_attn(q, k, v, past + n, mask, past, 0.125, lib=lib), want), level


def test_a_causal_prefill_is_one_row_at_a_time():
    """A prompt's rows at once (causal mask over them), in chunks, or one a step: the same bits for every row."""
    lib = lib_for(None)
    gen = torch.Generator().manual_seed(5)
    hq, hkv, d, n = 14, 2, 64, 70
    k, v = caches(hkv, n, d, gen)
    q = torch.randn(hq, n, d, generator=gen)
    causal = torch.full((n, n), MIN).triu_(1)
    whole = row_attention.row_attn(q, k, v, n, causal, 0, 0.125, lib=lib)
    chunks = torch.cat([row_attention.row_attn(q[:, s : s + 32], k, v, min(s + 32, n),
                                               causal[: min(32, n - s), : min(32, n - s)], s, 0.125, lib=lib)
                        for s in range(0, n, 32)])
    steps = torch.cat([row_attention.row_attn(q[:, i : i + 1], k, v, i + 1, None, 0, 0.125, lib=lib)
                       for i in range(n)])
    assert torch.equal(whole, chunks) and torch.equal(whole, steps)


def test_threads_do_not_change_a_row():
    lib = lib_for(None)
    gen = torch.Generator().manual_seed(9)
    k, v = caches(2, 200, 64, gen)
    q = torch.randn(14, 40, 64, generator=gen)
    causal = torch.full((40, 40), MIN).triu_(1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = row_attention.row_attn(q, k, v, 200, causal, 160, 0.125, lib=lib)
        torch.set_num_threads(2)
        two = row_attention.row_attn(q, k, v, 200, causal, 160, 0.125, lib=lib)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_shapes_it_does_not_take_are_errors():
    lib = lib_for(None)
    k, v = torch.zeros(2, 10, 8), torch.zeros(2, 10, 8)
    with pytest.raises(ValueError):
        row_attention.row_attn(torch.zeros(3, 1, 8), k, v, 5, None, 0, 1.0, lib=lib)  # heads not a multiple
    with pytest.raises(ValueError):
        row_attention.row_attn(torch.zeros(4, 2, 8), k, v, 5, torch.zeros(2, 3), 1, 1.0, lib=lib)  # mask width
    with pytest.raises(ValueError):
        row_attention.row_attn(torch.zeros(4, 1, 8), k, v, 0, None, 0, 1.0, lib=lib)  # no keys at all


# -- in the engine: the quantized modes' steps ---------------------------------------------------------------------

@pytest.fixture()
def q8_tiny(tiny):
    from rest_lsp.kernels import quant_matmul

    if tiny.device.type != "cpu":
        pytest.skip("the quantized mode runs on a CPU")
    if not (quant_matmul.available() and row_attention.available()):
        pytest.skip("no C compiler here builds the quantized kernels")
    return tiny


def test_only_the_quantized_packings_attend_row_by_row(q8_tiny):
    from rest_lsp.engine.lean_llama import LeanLlama

    assert all(layer.row_exact for layer in LeanLlama(q8_tiny.model, 64, pack="q8").layers)
    assert not any(layer.row_exact for layer in LeanLlama(q8_tiny.model, 64).layers)  # fp32 keeps torch's attention


def test_a_tree_steps_rows_are_plain_steps_bits_in_q8(q8_tiny):
    """Each node of a random tree verified in one step has the hidden state, bit for bit, that plain one-token
    steps along its path give; the prompt's prefill at once is its prefill a token at a time."""
    from rest_lsp.drafting.draft_tree import DraftTree, tree_attention_mask
    from rest_lsp.engine.lean_llama import LeanLlama

    lean = LeanLlama(q8_tiny.model, 256, pack="q8")
    gen = torch.Generator().manual_seed(11)
    vocab = q8_tiny.model.config.vocab_size
    prompt = torch.randint(0, vocab, (23,), generator=gen)
    n = 16
    parents = random_parents(n, gen)
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    tree = DraftTree(torch.randint(0, vocab, (n,), generator=gen).tolist(), parents, depths)

    cache = lean.new_cache()
    whole = lean.forward(prompt, torch.arange(23), cache)
    mask = tree_attention_mask(tree, 0, lean.dtype, lean.device)[0, 0]
    ids = torch.tensor(tree.tokens)
    rows = lean.forward(ids, torch.tensor(depths) + 23, cache, mask)

    one = lean.new_cache()
    steps = torch.cat([lean.forward(prompt[i : i + 1], torch.tensor([i]), one) for i in range(23)])
    assert torch.equal(whole, steps)
    for i in range(n):
        path = ancestors(parents, i)
        plain = lean.new_cache()
        lean.forward(prompt, torch.arange(23), plain)
        for a in path:
            last = lean.forward(ids[a : a + 1], torch.tensor([23 + depths[a]]), plain)
        assert torch.equal(last[0], rows[i]), i
