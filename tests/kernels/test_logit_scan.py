"""The logit scan (kernels/logit_scan.py): torch.argmax's index on every level, ties and ragged lengths included;
softmax's top k; rows it does not take left to torch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rest_lsp.kernels import levels, loader, logit_scan
from rest_lsp.engine.decoding import top_successors
from rest_lsp.kernels.buffers import BAD_SIZES, UNSUPPORTED


def lib_of(level=None):
    """The scan's library of `level` (None: the dispatcher's). Where a C compiler is here it must build and pass its
    check (a failed check would otherwise leave every test skipped); a level this CPU lacks is skipped by name."""
    if level is not None and level not in levels.runnable():
        pytest.skip(f"this CPU does not execute the {level} level")
    if loader._compiler() is None:
        pytest.skip("no C compiler here builds the logit scan")
    lib = logit_scan.library(level)
    assert lib is not None, "the logit scan failed to build or its check against torch"
    return lib


def rows_of(n: int, vocab: int, scale: float, seed: int) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("level", levels.LEVELS)
@settings(max_examples=25, deadline=None)
@given(vocab=st.sampled_from([1, 15, 64, 65, 1000, 151936]), scale=st.sampled_from([0.1, 3.0, 30.0]),
       seed=st.integers(0, 2**31 - 1), ties=st.integers(0, 3))
def test_argmax_is_torchs_index_with_ties(level, vocab, scale, seed, ties):
    lib = lib_of(level)
    row = rows_of(1, vocab, scale, seed)[0]
    gen = torch.Generator().manual_seed(seed)
    for spot in torch.randint(0, vocab, (ties,), generator=gen).tolist():  # the largest value again elsewhere
        row[spot] = row.max()
    assert logit_scan.argmax(row, lib) == int(torch.argmax(row))


@pytest.mark.parametrize("level", levels.LEVELS)
@pytest.mark.parametrize("vocab,k", [(8, 8), (100, 8), (151936 + 5, 8), (3000, 64)])
def test_the_top_is_softmaxs_top_k(level, vocab, k):
    lib = lib_of(level)
    rows = rows_of(3, vocab, 4.0, 7)
    rows[2, -8:] = rows[2].max() + torch.arange(8, 0, -1)  # the top in the ragged tail, in order
    ids, probs = logit_scan.top(list(rows), k, lib)
    want = torch.topk(torch.softmax(rows.double(), -1), k, dim=-1)  # the normaliser in float64
    assert ids == want.indices.tolist() and ids[2][:8] == list(range(vocab - 8, vocab))
    for got, expected in zip(probs, want.values.tolist()):
        assert got == pytest.approx(expected, rel=2e-6, abs=1e-12)


def test_the_top_is_what_recycling_found_before():
    rows = list(rows_of(3, 151936, 3.0, 9))
    found = logit_scan.top(rows, 8, lib_of())
    ids, probs = top_successors(torch.stack(rows))
    assert found[0] == ids and all(got == pytest.approx(p, rel=1e-4) for a, b in zip(found[1], probs)
                                   for got, p in zip(a, b))


def test_a_row_with_a_nan_or_an_infinite_maximum_is_torchs():
    lib = lib_of()
    row = rows_of(1, 300, 1.0, 3)[0]
    for bad, spots in ((float("nan"), (100, 200)), (float("nan"), (299,)), (float("inf"), (100, 200))):
        odd = row.clone()
        odd[list(spots)] = bad  # in a block of 64, or in the tail past the last one
        ids, _ = logit_scan._scan(lib, odd[None], 1, False)
        assert ids is None  # the kernel says so, and the caller's torch route answers
        assert logit_scan.argmax(odd) == int(torch.argmax(odd)) == spots[0]
        assert logit_scan.top([row, odd], 8) is None
    masked = torch.full((50,), float("-inf"))
    assert logit_scan._scan(lib, masked[None], 1, False) == (None, None)
    assert logit_scan.argmax(masked) == int(torch.argmax(masked))
    signed = torch.tensor([-1.0, -0.0, 0.0, -0.0])  # zeros of either sign are equal: the first wins, as torch's
    assert logit_scan.argmax(signed) == int(torch.argmax(signed)) == 1


def test_what_it_does_not_take_goes_to_torch():
    lib = logit_scan.library()
    row, short = rows_of(1, 40, 1.0, 5)[0], rows_of(1, 5, 1.0, 8)[0]
    assert logit_scan.top([row], 41) is None and logit_scan.top([row], 0) is None and logit_scan.top([], 8) is None
    assert logit_scan.top([row, short], 8) is None and logit_scan.top([row], 65) is None
    strided = rows_of(40, 2, 1.0, 6)[:, 0]  # stride 2
    for other in (row.double(), strided, torch.tensor(3.0), rows_of(2, 40, 1.0, 4)):
        assert logit_scan.argmax(other, lib) == int(torch.argmax(other))  # even with the library given
    assert logit_scan.top([strided], 4, lib) is None and logit_scan.top([row.double()], 4, lib) is None
    view = rows_of(3, 400, 1.0, 10)
    assert logit_scan.argmax(view[2, 7:], lib) == int(torch.argmax(view[2, 7:]))  # a view at an offset


@pytest.mark.parametrize("case,code", [
    ("two rows from a buffer of one", BAD_SIZES), ("rows closer than a row", BAD_SIZES),
    ("a row past the buffer", BAD_SIZES), ("a top of 8 into 2 ids", BAD_SIZES), ("a top of 8 into 2 values", BAD_SIZES),
    ("no top", UNSUPPORTED), ("a top over 64", UNSUPPORTED), ("a top over the row", UNSUPPORTED)])
def test_the_c_refuses_sizes_before_reading(case, code):
    lib = lib_of()
    row = rows_of(1, 100, 1.0, 5)[0]
    ids, out = torch.zeros(8, dtype=torch.int32), torch.zeros(8)
    n, v, stride, xn, k, idsn, outn = 1, 100, 100, 100, 1, 8, 8
    if case == "two rows from a buffer of one":
        n = 2
    elif case == "rows closer than a row":
        n, v, stride = 2, 40, 30
    elif case == "a row past the buffer":
        xn = 99
    elif case == "a top of 8 into 2 ids":
        k, idsn = 8, 2
    elif case == "a top of 8 into 2 values":
        k, outn = 8, 2
    elif case == "a top over the row":
        v, stride, k = 10, 10, 20
    else:
        k = {"no top": 0, "a top over 64": 65}[case]
    assert lib.logit_scan(row.data_ptr(), n, v, stride, xn, k, 1, ids.data_ptr(), idsn, out.data_ptr(),
                          outn) == code
    assert not ids.any() and not out.any()  # nothing written


def test_every_level_gives_the_same_bits():
    rows = list(rows_of(2, 151936 + 3, 5.0, 11))
    found = {level: logit_scan.top(rows, 8, lib_of(level)) for level in levels.runnable()}
    if len(found) < 2:
        pytest.skip("this CPU executes one level only")
    assert all(got == found["portable"] for got in found.values()), found.keys()
