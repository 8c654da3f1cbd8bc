"""The static verification step (rows padded to a bucket, attention over the cache's whole capacity) computes what the
eager step computes, and on a GPU its CUDA graphs replay it. The decoding-level exactness of the static engine is in
test_exactness.py (the `lean-static` engine)."""

import random

import pytest
import torch

from rest_lsp.drafting.draft_tree import DraftTree, tree_attention_mask
from rest_lsp.engine.cuda_graphs import STEP_BUCKETS
from rest_lsp.engine.lean_llama import CACHE_BLOCK, LeanLlama

from support import tiny_model


def random_tree(n: int, rnd: random.Random, vocab: int) -> DraftTree:
    parents = [-1] + [rnd.randrange(i) for i in range(1, n)]
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    return DraftTree([rnd.randrange(vocab) for _ in range(n)], parents, depths)


def prefilled(lean: LeanLlama, prompt: list[int]):
    cache = lean.new_cache()
    if prompt:
        lean.forward(torch.tensor(prompt, device=lean.device), torch.arange(len(prompt), device=lean.device), cache)
    return cache


def tree_step(lean: LeanLlama, cache, tree: DraftTree, static: bool) -> torch.Tensor:
    past = cache.length
    ids = torch.tensor(tree.tokens, device=lean.device)
    pos = torch.tensor(tree.depths, device=lean.device) + past
    mask = None if len(tree) == 1 else tree_attention_mask(tree, 0, lean.dtype, lean.device)[0, 0]
    lean.static = static
    try:
        return lean.step(ids, pos, cache, mask)
    finally:
        lean.static = True


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_static_step_computes_what_the_eager_step_does(arch):
    loaded = tiny_model(arch)
    lean = LeanLlama(loaded.model, 512, static=True)
    rnd = random.Random(3)
    for past in (0, 1, 7, 40):
        prompt = [rnd.randrange(97) for _ in range(past)]
        for n in (1, 2, 3, 5, 8, 13, 16, 30):
            tree = random_tree(n, rnd, 97)
            eager, static = prefilled(lean, prompt), prefilled(lean, prompt)
            want = tree_step(lean, eager, tree, static=False)  # [n, H]
            got = tree_step(lean, static, tree, static=True)
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert static.length == eager.length == past + n
            valid = slice(0, past + n)
            torch.testing.assert_close(static.k[:, :, valid], eager.k[:, :, valid], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(static.v[:, :, valid], eager.v[:, :, valid], rtol=1e-5, atol=1e-5)
            # the padding rows, written past the length, hold finite numbers: a later step weighs them 0
            assert torch.isfinite(static.k).all() and torch.isfinite(static.v).all()


def test_a_tree_larger_than_every_bucket_runs_eagerly():
    loaded = tiny_model("llama")
    lean = LeanLlama(loaded.model, 512, static=True)
    rnd = random.Random(1)
    tree = random_tree(STEP_BUCKETS[-1] + 3, rnd, 97)
    eager, static = prefilled(lean, [1, 2, 3]), prefilled(lean, [1, 2, 3])
    torch.testing.assert_close(tree_step(lean, static, tree, True), tree_step(lean, eager, tree, False))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


@cuda
def test_cuda_graphs_replay_the_static_step_and_capture_once_per_cache_and_bucket():
    loaded = tiny_model("qwen2")
    model = loaded.model.to("cuda")
    lean = LeanLlama(model, 2 * CACHE_BLOCK, static=True)
    assert lean.graphs is not None
    rnd = random.Random(5)
    prompt = [rnd.randrange(97) for _ in range(30)]
    graphed, plain = prefilled(lean, prompt), prefilled(lean, prompt)
    for n in (1, 3, 3, 8, 1):
        tree = random_tree(n, rnd, 97)
        want = tree_step(lean, plain, tree, static=False)
        got = tree_step(lean, graphed, tree, static=True)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        plain.crop(len(prompt))
        graphed.crop(len(prompt))
    assert lean.graphs.captures == 3  # buckets 1, 4 and 8, each captured once on this cache
    # a cache that grows past its block is new storage: its graphs are captured again, and stay right
    long = prompt * (CACHE_BLOCK // len(prompt) + 1)
    graphed, plain = prefilled(lean, long), prefilled(lean, long)
    tree = random_tree(3, rnd, 97)
    torch.testing.assert_close(tree_step(lean, graphed, tree, True), tree_step(lean, plain, tree, False),
                               rtol=1e-4, atol=1e-4)
    assert lean.graphs.captures == 4


def test_a_reset_keeps_the_cache_storage_that_graphs_are_captured_on():
    """A decoder that forgets its sequence (bench_rest does per prompt) keeps its KV cache's storage: on a GPU the
    graphs captured on it stay valid, so each bucket is captured once per decoder, not once per prompt."""
    from rest_lsp.engine.decoding import DecodeConfig, Decoder
    from rest_lsp.drafting.drafts import ContextLookup

    loaded = tiny_model("llama")
    decoder = Decoder(loaded, static=True)
    prompt = [5, 6, 7, 8] * 6
    first = decoder.generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=24, budget=16))
    cache = decoder._cache
    captures = decoder.lean.graphs.captures if decoder.lean.graphs is not None else None
    decoder.reset()
    assert decoder._cache is cache and cache.length == 0 and not decoder.holds(prompt[:1])
    again = decoder.generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=24, budget=16))
    assert again.tokens == first.tokens and again.prefill_tokens == len(prompt) - 1
    assert decoder._cache is cache
    if captures is not None:
        assert decoder.lean.graphs.captures == captures
    # a detached cache leaves with its storage: the decoder starts a new one
    state = decoder.detach_cache()
    assert state.fields[0] is cache and decoder._cache is None
