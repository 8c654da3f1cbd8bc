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


def test_a_tensor_under_a_huge_page_is_torchs_own(monkeypatch):
    mapped, mmap_ = [], huge_pages.mmap.mmap
    monkeypatch.setattr(huge_pages.mmap, "mmap", lambda *args, **kwargs: mapped.append(args) or mmap_(*args, **kwargs))
    t = huge_pages.empty((1000, 3))
    # torch's own storage (resizable, unlike one over a buffer) and no mapping of ours; whether torch's memory lies in
    # advised pages is its allocator's business (in CI once it did, after torch had advised a large block there)
    assert t.shape == (1000, 3) and t.untyped_storage().resizable() and not mapped
    big = huge_pages.empty((huge_pages.HUGE,))
    assert (not big.untyped_storage().resizable()) == (len(mapped) == 1) == (huge_pages.ADVICE is not None)


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


@needs_advice
def test_an_arena_lays_its_tensors_side_by_side_in_advised_memory():
    arena = huge_pages.Arena(4 * huge_pages.HUGE)
    a, b = arena.take((3, 1000)), arena.take((10, 64), torch.float32)  # small ones, each in huge pages all the same
    assert b.data_ptr() == a.data_ptr() + 3008  # the next cache line
    assert huge_pages.advised(a) and huge_pages.advised(b) and b.shape == (10, 64) and b.dtype == torch.float32
    a.fill_(1)
    b.fill_(2.0)
    assert int(a.sum()) == 3000 and float(b.sum()) == 1280.0
    over = arena.take((4 * huge_pages.HUGE,))  # past its end: memory of its own
    assert over.untyped_storage().data_ptr() != arena.memory.untyped_storage().data_ptr()


def test_an_arena_gives_back_only_its_last_tensor():
    arena = huge_pages.Arena(1 << 16)
    a, b = arena.take((100,)), arena.take((100,))
    arena.give_back(a)  # not the last: keeps its place
    assert arena.take((1,)).data_ptr() == b.data_ptr() + 128
    c = arena.take((640,))
    arena.give_back(c)
    assert arena.take((64,)).data_ptr() == c.data_ptr()
    arena.give_back(torch.empty(10, dtype=torch.uint8))  # not the arena's: nothing
    assert arena.take((1,)).data_ptr() == c.data_ptr() + 64


def test_cat_of_tensors_side_by_side_is_a_view_and_of_others_a_copy():
    arena = huge_pages.Arena(1 << 20)
    gen = torch.Generator().manual_seed(1)
    parts = [arena.take((rows, 256)) for rows in (5, 1, 9)]
    for p in parts:
        p.copy_(torch.randint(0, 256, p.shape, generator=gen, dtype=torch.uint8))
    got = huge_pages.cat(parts)
    assert torch.equal(got, torch.cat(parts)) and got.data_ptr() == parts[0].data_ptr()
    apart = [parts[0], parts[2]]  # the same storage, not side by side
    got = huge_pages.cat(apart)
    assert torch.equal(got, torch.cat(apart)) and got.data_ptr() != parts[0].data_ptr()
    # a contiguous part whose size-1 dimension has another stride: the whole still reads row after row
    flat = arena.take((128,))
    flat.copy_(torch.arange(128, dtype=torch.uint8))
    odd, even = flat[:64].view(64, 1).T, flat[64:].view(1, 64)
    assert odd.stride() != even.stride() and torch.equal(huge_pages.cat([odd, even]), torch.cat([odd, even]))
