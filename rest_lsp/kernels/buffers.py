"""The contract between a kernel's C entry point and its Python side: what a call may touch and what it says back.

Every entry point is given, beside each pointer, how many elements its buffer holds from that pointer on
(`extent`: to the end of the tensor's storage, whatever its view), and checks its rows, columns and every buffer
length against them before it reads or writes anything. It returns 0 (or another non-negative result) or one of
the codes below, which `outcome` turns into one sentence: a MemoryError for scratch memory it could not have, a
ValueError for everything else. Nothing a caller passes makes a kernel abort the process.

`CALLS` counts the calls per entry point in this process (the sanitizer run, .ci/sanitize.sh, reports them).
"""

from __future__ import annotations

from collections import Counter

import torch

NO_MEMORY = -1  # the scratch memory could not be had
UNSUPPORTED = -2  # a shape or width the kernel does not take
BAD_SIZES = -3  # rows, columns or lengths that do not fit the buffers given

CALLS: Counter[str] = Counter()


def extent(t: torch.Tensor) -> int:
    """The elements of t's dtype its storage holds from t.data_ptr() on: all a kernel may read or write there."""
    return (t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()) // t.element_size()


def outcome(name: str, rc: int, unsupported: str) -> int:
    """`rc` when the call ran (>= 0); else the one sentence that says why not (`unsupported`: what the kernel
    does not take, for UNSUPPORTED)."""
    CALLS[name] += 1
    if rc >= 0:
        return rc
    if rc == NO_MEMORY:
        raise MemoryError(f"{name}: no scratch memory for this call.")
    if rc == UNSUPPORTED:
        raise ValueError(f"{name}: {unsupported}.")
    raise ValueError(f"{name}: the sizes passed do not fit the buffers given (code {rc}).")
