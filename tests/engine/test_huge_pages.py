"""engine/huge_pages.py: the weights' memory is private anonymous memory whose whole 2 MB pages are advised to be
huge ones (the `hg` flag of its mapping), torch's own below a huge page, and lives as long as any view of it."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from rest_lsp.engine import huge_pages

needs_advice = pytest.mark.skipif(huge_pages.ADVICE is None or not Path("/proc/self/smaps").exists(),
                                  reason="no MADV_HUGEPAGE or /proc/self/smaps here (not Linux)")


def mapping_kb(t: torch.Tensor, field: str) -> int:
    """`field` (kB) of the /proc/self/smaps entry of the mapping that holds t's first byte."""
    return int(huge_pages.mapping(t)[field].split()[0])


@needs_advice
def test_a_large_tensor_is_private_anonymous_memory_advised_as_huge_pages():
    t = huge_pages.empty((3 * huge_pages.HUGE + 100,))
    assert t.dtype == torch.uint8 and t.shape == (3 * huge_pages.HUGE + 100,)
    assert t.data_ptr() % huge_pages.HUGE == 0 and huge_pages.advised(t)
    t.fill_(7)
    assert int(t[-1]) == 7 and int(t.sum()) == 7 * t.numel()
    # private pages, not shmem (whose huge pages another setting governs): every page written counts as anonymous
    assert mapping_kb(t, "Anonymous") >= 3 * huge_pages.HUGE // 1024


@needs_advice
def test_other_shapes_and_dtypes_are_laid_out_as_torch_empty_would():
    t = huge_pages.empty((1024, 1024), torch.float32)
    assert t.shape == (1024, 1024) and t.dtype == torch.float32 and t.is_contiguous() and huge_pages.advised(t)
    t.copy_(torch.arange(1024 * 1024, dtype=torch.float32).view(1024, 1024))
    assert float(t[1023, 1023]) == 1024 * 1024 - 1


def test_a_tensor_under_a_huge_page_is_torchs_own():
    t = huge_pages.empty((1000, 3))
    assert t.shape == (1000, 3) and not huge_pages.advised(t)


def test_cat_is_torch_cat():
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randint(0, 256, (rows, 4096), generator=gen, dtype=torch.uint8) for rows in (300, 1, 700)]
    got = huge_pages.cat(parts)
    assert torch.equal(got, torch.cat(parts))
    assert huge_pages.advised(got) == (huge_pages.ADVICE is not None and Path("/proc/self/smaps").exists())
    assert huge_pages.cat(parts[:1]) is parts[0]


@needs_advice
def test_the_memory_lives_as_long_as_a_view_of_it():
    t = huge_pages.empty((2 * huge_pages.HUGE,))
    t.fill_(5)
    view = t[huge_pages.HUGE :]
    del t
    gc.collect()
    view.add_(1)
    assert int(view.sum()) == 6 * huge_pages.HUGE and huge_pages.advised(view)


def test_adopt_moves_a_large_tensor_and_leaves_a_small_one():
    big = torch.arange(huge_pages.HUGE, dtype=torch.int32).view(-1, 64)
    small = torch.arange(10)
    moved = huge_pages.adopt(big)
    assert torch.equal(moved, big) and huge_pages.adopt(small) is small
    assert (moved.data_ptr() != big.data_ptr()) == (huge_pages.ADVICE is not None)
    assert huge_pages.advised(moved) == (huge_pages.ADVICE is not None and Path("/proc/self/smaps").exists())


def test_a_mapping_refused_falls_back_to_torchs_memory(monkeypatch):
    asked = []

    def refuse(*args, **kwargs):
        asked.append(args)
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(huge_pages.mmap, "mmap", refuse)
    t = huge_pages.empty((4 * huge_pages.HUGE,))
    # whether torch's own memory lies in advised pages is glibc's and torch's business (their allocators may ask
    # for huge pages themselves, and did once in the suite): what matters is that the refusal was met, not raised
    assert t.shape == (4 * huge_pages.HUGE,) and len(asked) == (huge_pages.ADVICE is not None)
    t.fill_(1)
    assert int(t.sum()) == 4 * huge_pages.HUGE
