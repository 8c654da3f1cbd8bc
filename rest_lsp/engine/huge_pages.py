"""Memory in 2 MB pages for the weights every step streams (Linux's transparent huge pages, asked for by madvise).

A step reads every panel of the model once, front to back. In 4 KB pages that is a page-table walk every 4 KB (two
nested ones in a virtual machine) and a hardware prefetcher that stops at each page's end, so a core streams its
panels only while it is not multiplying: a tree step then costs a plain step plus its rows' multiplies, where the
two could overlap (benchmarks/step_budget.py measures how much they do). In 2 MB pages the stream runs on under the
multiplies. Linux gives a range of anonymous memory 2 MB pages where its `transparent_hugepage` setting is `always`,
or `madvise` and the range was advised (MADV_HUGEPAGE): `empty` maps such a range, 2 MB-aligned, and advises the
whole 2 MB pages in it (the tail past the last one stays in small pages, so no page is more than half empty). Where
the OS has no such advice (not Linux, an old Python) or the range is under 2 MB, the memory is torch's.

Rule: the bytes and what reads them are the same either way; only the pages under them differ.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Sequence

import torch

HUGE = 2 << 20  # bytes in a huge page (x86-64 and arm64 Linux with 4 KB base pages)
ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)  # None: this OS or Python cannot ask for them


def empty(shape: Sequence[int], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised tensor whose whole 2 MB pages are advised to be huge ones (torch.empty where they cannot
    be asked for, or the tensor holds none)."""
    count = 1
    for size in shape:
        count *= int(size)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    if ADVICE is None or nbytes < HUGE:
        return torch.empty(tuple(shape), dtype=dtype)
    # anonymous and private (a shared mapping would be shmem, whose huge pages another setting governs): zero pages,
    # each faulted in when first written
    try:
        area = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE)
    except OSError:  # no address space or memory for a mapping: torch's, which says so in its own words if it fails
        return torch.empty(tuple(shape), dtype=dtype)
    skip = -_address(area) % HUGE  # the first 2 MB boundary in it
    try:
        area.madvise(ADVICE, skip, nbytes // HUGE * HUGE)
    except OSError:  # a kernel without transparent huge pages: small pages, as torch's would be
        pass
    # the tensor holds `area` alive (torch.frombuffer keeps a reference to its buffer)
    return torch.frombuffer(area, dtype=dtype, count=count, offset=skip).view(tuple(shape))


def cat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch.cat(parts) along dim 0, into `empty` memory."""
    if len(parts) == 1:
        return parts[0]
    rows = sum(p.shape[0] for p in parts)
    out = empty((rows, *parts[0].shape[1:]), parts[0].dtype)
    at = 0
    for p in parts:
        out[at : at + p.shape[0]] = p
        at += p.shape[0]
    return out


def adopt(t: torch.Tensor) -> torch.Tensor:
    """t's values in `empty` memory (t itself where that would be torch's memory anyway): for weights packed by
    code that allocates its own output."""
    if ADVICE is None or t.numel() * t.element_size() < HUGE:
        return t
    return empty(t.shape, t.dtype).copy_(t)


def advised(t: torch.Tensor) -> bool:
    """Whether t's memory lies in a range advised to be huge pages (Linux: the `hg` flag of its mapping in
    /proc/self/smaps); False where that cannot be read."""
    address = t.data_ptr()
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and all(c in "0123456789abcdef-" for c in head):
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    inside = lo <= address < hi
                elif inside and line.startswith("VmFlags:"):
                    return "hg" in line.split()
    except OSError:
        pass
    return False


def _address(area: mmap.mmap) -> int:
    """Where an mmap's bytes start (the export ends before the mapping could need to close)."""
    view = ctypes.c_char.from_buffer(area)
    try:
        return ctypes.addressof(view)
    finally:
        del view
