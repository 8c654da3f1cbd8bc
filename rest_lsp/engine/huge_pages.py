"""Memory in 2 MB pages for the weights every step streams (Linux's transparent huge pages, asked for by madvise).

A step reads every panel of the model once, front to back. In 4 KB pages that is a page-table walk every 4 KB (two
nested ones in a virtual machine) and a hardware prefetcher that stops at each page's end: the stream is slower, and
a core streams little while it multiplies. In 2 MB pages the stream is faster (docs/LOG.md, 2026-12-06 late night);
how much of a tree's multiplies it hides is benchmarks/step_budget.py's to measure. Linux gives a range of
anonymous memory 2 MB pages where its `transparent_hugepage` setting is `always`, or `madvise` and the range was
advised (MADV_HUGEPAGE): `empty` maps such a range, 2 MB-aligned, and advises the whole 2 MB pages in it (the tail
past the last one stays in small pages, so no page is more than half empty). Where the OS has no such advice (not
Linux, an old Python) or the range is under 2 MB, the memory is torch's.

Rule: the bytes and what reads them are the same either way; only the pages under them differ.
"""

from __future__ import annotations

import ctypes
import math
import mmap
from typing import Sequence

import torch

HUGE = 2 << 20  # bytes in a huge page (x86-64 and arm64 Linux with 4 KB base pages)
ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)  # None: this OS or Python cannot ask for them


def _maps(nbytes: int) -> bool:
    """Whether `empty` gives `nbytes` a mapping of its own (else torch's memory): huge pages can be asked for here
    and the bytes hold at least one."""
    return ADVICE is not None and nbytes >= HUGE


def empty(shape: Sequence[int], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised tensor whose whole 2 MB pages are advised to be huge ones (torch.empty where they cannot
    be asked for, or the tensor holds none)."""
    count = math.prod(int(size) for size in shape)
    nbytes = count * dtype.itemsize
    if not _maps(nbytes):
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
    if not _maps(t.numel() * t.element_size()):
        return t
    return empty(t.shape, t.dtype).copy_(t)


def mapping(t: torch.Tensor) -> dict[str, str]:
    """The /proc/self/smaps entry of the mapping that holds t's first byte, {field: value} (e.g. "VmFlags",
    "Anonymous": "2048 kB"); empty where there is none or it cannot be read (not Linux)."""
    address, fields, inside = t.data_ptr(), {}, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and all(c in "0123456789abcdef-" for c in head):  # a mapping's first line
                    if inside:
                        break
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    inside = lo <= address < hi
                elif inside:
                    name, _, value = line.partition(":")
                    fields[name] = value.strip()
    except OSError:
        return {}
    return fields


def advised(t: torch.Tensor) -> bool:
    """Whether t's memory lies in a range advised to be huge pages (Linux: the `hg` flag of its mapping)."""
    return "hg" in mapping(t).get("VmFlags", "").split()


def _address(area: mmap.mmap) -> int:
    """Where an mmap's bytes start (the export ends before the mapping could need to close)."""
    view = ctypes.c_char.from_buffer(area)
    try:
        return ctypes.addressof(view)
    finally:
        del view
