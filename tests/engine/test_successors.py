"""Token Recycling's observations: each visited node's likeliest next tokens and their probabilities, found without a
full softmax and top-k over the vocabulary, must be what topk(softmax(logits)) gives."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rest_lsp.engine.decoding import SUCCESSORS, TOPK_BLOCK, top_successors


def reference(logits: torch.Tensor, k: int):
    top = torch.topk(torch.softmax(logits, dim=-1), min(k, logits.shape[-1]), dim=-1)
    return top.indices.tolist(), top.values.tolist()


def assert_same(logits: torch.Tensor, k: int = SUCCESSORS) -> None:
    ids, probs = top_successors(logits, k)
    want_ids, want_probs = reference(logits, k)
    assert ids == want_ids  # the probabilities: fp32 sums over V in another order
    for row, want in zip(probs, want_probs):
        assert row == pytest.approx(want, rel=1e-4, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), vocab=st.sampled_from([3, 50, 4 * SUCCESSORS * TOPK_BLOCK,
                                                        4 * SUCCESSORS * TOPK_BLOCK + 1, 9000, 151936]),
       scale=st.sampled_from([0.1, 3.0, 30.0]), seed=st.integers(0, 2**31 - 1))
def test_the_likeliest_successors_are_softmaxs_top_k(rows, vocab, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    assert_same(torch.randn(rows, vocab, generator=gen) * scale)


@pytest.mark.parametrize("where", ["one block", "the padded last block", "first and last"])
def test_the_top_k_crowded_into_one_block_or_the_padded_tail_are_all_found(where):
    vocab = 151936 + 5  # not a multiple of TOPK_BLOCK: the last block is padded
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(1))
    spots = {"one block": list(range(640, 640 + SUCCESSORS)),
             "the padded last block": list(range(vocab - SUCCESSORS, vocab)),
             "first and last": [0, 1, 2, 3, vocab - 4, vocab - 3, vocab - 2, vocab - 1]}[where]
    for rank, spot in enumerate(spots):
        logits[:, spot] = 20.0 - rank
    ids, _ = top_successors(logits)
    assert ids == [spots, spots]
    assert_same(logits)
