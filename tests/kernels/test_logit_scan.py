"""The logit scan (kernels/logit_scan.py): torch.argmax's index on every level, ties and ragged lengths included;
softmax's top k; rows it does not take left to torch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_support import library_of
from rest_lsp.kernels import levels, logit_scan
from rest_lsp.kernels.buffers import BAD_SIZES


def rows_of(n: int, vocab: int, scale: float, seed: int) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("level", levels.LEVELS)
@settings(max_examples=25, deadline=None)
@given(vocab=st.sampled_from([1, 15, 64, 65, 1000, 151936]), scale=st.sampled_from([0.1, 3.0, 30.0]),
       seed=st.integers(0, 2**31 - 1), ties=st.integers(0, 3))
def test_argmax_is_torchs_index_with_ties(level, vocab, scale, seed, ties):
    lib = library_of(logit_scan, level)
    row = rows_of(1, vocab, scale, seed)[0]
    gen = torch.Generator().manual_seed(seed)
    for spot in torch.randint(0, vocab, (ties,), generator=gen).tolist():  # the largest value again elsewhere
        row[spot] = row.max()
    assert logit_scan.argmax(row, lib) == int(torch.argmax(row))


@pytest.mark.parametrize("level", levels.LEVELS)
@pytest.mark.parametrize("vocab", [8, 100, 151936 + 5])
def test_the_top_is_softmaxs_top_k(level, vocab):
    lib = library_of(logit_scan, level)
    rows = rows_of(3, vocab, 4.0, 7)
    rows[2, -8:] = rows[2].max() + torch.arange(8, 0, -1)  # the top in the ragged tail, in order
    ids, probs = logit_scan.top(list(rows), 8, lib)
    want = torch.topk(torch.softmax(rows, -1), 8, dim=-1)
    assert ids == want.indices.tolist() and ids[2] == list(range(vocab - 8, vocab))
    for got, expected in zip(probs, want.values.tolist()):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-9)


def test_a_row_with_a_nan_or_an_infinite_maximum_is_torchs():
    if logit_scan.library() is None:
        pytest.skip("no C compiler here builds the logit scan")
    row = rows_of(1, 300, 1.0, 3)[0]
    for bad in (float("nan"), float("inf")):
        odd = row.clone()
        odd[100], odd[200] = bad, bad
        assert logit_scan.argmax(odd) == int(torch.argmax(odd)) == 100
        assert logit_scan.top([row, odd], 8) is None  # the caller's torch route
    assert logit_scan.argmax(torch.full((50,), float("-inf"))) == int(torch.argmax(torch.full((50,), float("-inf"))))


def test_what_it_does_not_take_goes_to_torch():
    row = rows_of(1, 40, 1.0, 5)[0]
    assert logit_scan.top([row], 41) is None and logit_scan.top([row], 0) is None and logit_scan.top([], 8) is None
    assert logit_scan.top([row.double()], 8) is None and logit_scan.argmax(row.double()) == int(torch.argmax(row))
    strided = rows_of(40, 2, 1.0, 6)[:, 0]  # stride 2
    assert logit_scan.argmax(strided) == int(torch.argmax(strided)) and logit_scan.top([strided], 4) is None
    if logit_scan.library() is not None:  # two rows from a buffer of one: refused before anything is read
        ids, out = torch.zeros(2, dtype=torch.int32), torch.zeros(2)
        assert logit_scan.library().logit_scan(row.data_ptr(), 2, 40, 40, 40, 1, 0, ids.data_ptr(), 2, out.data_ptr(),
                                               2) == BAD_SIZES and not out.any() and not ids.any()
        assert logit_scan.library().logit_scan(row.data_ptr(), 1, 40, 40, 40, 8, 0, ids.data_ptr(), 2, out.data_ptr(),
                                               8) == BAD_SIZES and not ids.any()  # a top of 8 into 2 ids


def test_every_level_gives_the_same_bits():
    rows = list(rows_of(2, 151936 + 3, 5.0, 11))
    found = {level: logit_scan.top(rows, 8, logit_scan.library(level)) for level in levels.runnable()
             if logit_scan.library(level) is not None}
    if len(found) < 2:
        pytest.skip("fewer than two levels build here")
    assert all(got == found["portable"] for got in found.values()), found.keys()
