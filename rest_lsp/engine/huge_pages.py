"""Memory in 2 MB pages for the weights every step streams (Linux's transparent huge pages, asked for by madvise).

A step reads every panel of the model once, front to back. In 4 KB pages that is a page-table walk every 4 KB (two
nested ones in a virtual machine) and a hardware prefetcher that stops at each page's end: the stream is slower, and
a core streams little while it multiplies. In 2 MB pages the stream is faster (docs/LOG.md, 2026-12-06 late night);
how much of a tree's multiplies it hides is benchmarks/step_budget.py's to measure. Linux gives a range of
anonymous memory 2 MB pages where its `transparent_hugepage` setting is `always`, or `madvise` and the range was
advised (MADV_HUGEPAGE): `empty` maps such a range, 2 MB-aligned, and advises the whole 2 MB pages in it (the tail
past the last one stays in small pages, so no page is more than half empty). Where the OS has no such advice (not
Linux, an old Python) or the range is under 2 MB, the memory is torch's.

A step also streams faster when its weights lie side by side in the order it reads them (each matmul's panels
after the last one's: the prefetchers run on from one call into the next), and when a small tensor's pages are
huge ones too: an `Arena` is one `empty` range whose tensors are taken front to back, as a warm load's kept panels
are read (engine/panel_cache.py).

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


class Arena:
    """`nbytes` of `empty` memory handed out front to back: tensors taken one after another lie side by side (each
    at a multiple of ALIGN bytes). A tensor that no longer fits is `empty` memory of its own. The range is mapped
    at once and each page filled when first written, so what is never taken costs address space only; every
    tensor taken keeps the whole range alive."""

    ALIGN = 64  # a cache line

    def __init__(self, nbytes: int):
        self.memory = empty((max(int(nbytes), 0),))
        self.used = 0

    def take(self, shape: Sequence[int], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """An uninitialised tensor at the arena's next free place (`empty` memory of its own when it does not fit)."""
        nbytes = math.prod(int(size) for size in shape) * dtype.itemsize
        at = -(-self.used // self.ALIGN) * self.ALIGN
        if at + nbytes > self.memory.numel():
            return empty(shape, dtype)
        self.used = at + nbytes
        return self.memory[at : at + nbytes].view(dtype).view(tuple(shape))

    def give_back(self, t: torch.Tensor) -> None:
        """Frees t's place for the next `take` where t is the last tensor taken (else nothing: a tensor in the
        middle, or not the arena's, keeps its place)."""
        start = t.data_ptr() - self.memory.data_ptr()
        if 0 <= start < self.used and start + t.numel() * t.element_size() == self.used:
            self.used = start


def _side_by_side(parts: Sequence[torch.Tensor]) -> bool:
    """Whether the contiguous `parts` lie one right after the other in one storage (an Arena's, taken in turn)."""
    storage = parts[0].untyped_storage().data_ptr()
    return all(p.is_contiguous() and p.dtype == parts[0].dtype and p.shape[1:] == parts[0].shape[1:]
               and p.untyped_storage().data_ptr() == storage for p in parts) and all(
        a.data_ptr() + a.numel() * a.element_size() == b.data_ptr() for a, b in zip(parts, parts[1:]))


def cat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch.cat(parts) along dim 0: a view of the parts' own memory where they lie side by side in it, else copied
    into `empty` memory."""
    if len(parts) == 1:
        return parts[0]
    if _side_by_side(parts):
        first = parts[0]
        shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
        # the row-major strides of the whole: a contiguous part's own may differ where a dimension has size 1
        return torch.empty(0, dtype=first.dtype).set_(first.untyped_storage(), first.storage_offset(), shape,
                                                      torch.empty(shape, device="meta").stride())
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
