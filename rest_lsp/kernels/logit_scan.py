"""One pass over a row of logits: the model's greedy token, or its k likeliest tokens and their probabilities.

A walk reads every node it visits for the model's token (argmax), and Token Recycling reads the visited nodes
again for their likeliest successors (a top-k and a softmax's normaliser). Each is a row of the vocabulary
(150,000 floats for the Qwen models), and torch's reductions over it cost a step more than the reading: each
allocates its output and intermediates (fresh pages of a large row), argmax does not vectorise, and a row is split
among torch's threads, woken for a few microseconds of work. Here a row is read once (twice for the normaliser,
from the cache) on the calling thread, into buffers of the caller's.

Rule: `argmax` is torch.argmax's index, bit for bit (the first of equal maxima), so the greedy token, and with it
REST = plain and = generate, does not depend on which computed it; a row holding a NaN or an infinite maximum is
left to torch. The top's probabilities are softmax's in float64 to about 1e-6 relative (drafting weights), the
same bits on every level. The C is logit_scan.c, built per level by loader.py and checked against torch before
use.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Sequence

import torch

from rest_lsp.kernels.buffers import extent, outcome
from rest_lsp.kernels.loader import Kernel

log = logging.getLogger(__name__)

# -ffp-contract=off: every multiply and add rounds where the source says, so every level gives the same bits
FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
LIBS = ("-lm",)
KMAX = 64  # the most tokens a top takes (logit_scan.c)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    ll, vp = ctypes.c_longlong, ctypes.c_void_p
    # x, n, v, stride, xn, k, lse, ids, idsn, probs, probsn
    lib.logit_scan.argtypes = [vp, ll, ll, ll, ll, ctypes.c_int, ctypes.c_int, vp, ll, vp, ll]
    lib.logit_scan.restype = ctypes.c_int
    return lib


def _checked(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` once its argmax and top agree with torch's on rows with ties and a ragged length (ValueError if not)."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 1000 + 7, generator=gen)
    rows[1, 500] = rows[1, 900] = rows[1].max() + 1  # a tie for the largest: the first wins
    ids, probs = _scan(lib, rows, 8, True)
    want = torch.topk(torch.softmax(rows.double(), -1), 8, dim=-1)
    if ids is None or ids[:, 0].tolist() != torch.argmax(rows, -1).tolist() or ids[1, 0] != 500 or not torch.allclose(
            probs.double(), want.values, rtol=1e-5, atol=1e-9) or set(ids[0].tolist()) != set(want.indices[0].tolist()):
        raise ValueError("its results differ from torch's")
    return lib


KERNEL = Kernel("logit_scan", FLAGS, LIBS, _bind, _checked, "the logits are read by torch's reductions")


def library(level: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernel of `level` (the dispatcher's by default), built and checked on first use; None where it
    cannot be (said once)."""
    return KERNEL.library(level)


def _scan(lib: ctypes.CDLL, rows: torch.Tensor, k: int, lse: bool
          ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(ids [n, k] int32, probs or values [n, k]) of fp32 rows [n, V] (unit stride); (None, None) where a row
    needs torch (a NaN, an infinite maximum)."""
    n, v = rows.shape
    ids = torch.empty(n, k, dtype=torch.int32)
    out = torch.empty(n, k, dtype=torch.float32)
    rc = lib.logit_scan(rows.data_ptr(), n, v, rows.stride(0) if n > 1 else v, extent(rows), k, int(lse),
                        ids.data_ptr(), ids.numel(), out.data_ptr(), out.numel())
    if outcome("logit_scan", rc, f"a top of {k} tokens (1 to {KMAX}, at most the row's {v})"):
        return None, None
    return ids, out


def _usable(t: torch.Tensor) -> bool:
    """Whether the kernel reads `t` as it is: one row [V] of fp32 in this process's memory, unit stride."""
    return t.dim() == 1 and t.is_cpu and t.dtype == torch.float32 and t.stride(0) == 1 and t.shape[0] > 0


def argmax(row: torch.Tensor, lib: ctypes.CDLL | None = None) -> int:
    """int(torch.argmax(row)) of a row [V]: one pass where the kernel takes the row, torch's otherwise."""
    lib = (lib or library()) if _usable(row) else None
    if lib is not None:
        ids, _ = _scan(lib, row[None], 1, False)
        if ids is not None:
            return int(ids[0, 0])
    return int(torch.argmax(row))


def top(rows: Sequence[torch.Tensor], k: int, lib: ctypes.CDLL | None = None
        ) -> tuple[list[list[int]], list[list[float]]] | None:
    """Per row [V]: its k likeliest tokens, likeliest first, and their softmax probabilities; None where the kernel
    cannot be had or a row is not one it takes (the caller's torch route then)."""
    if not rows or not all(_usable(r) and k <= r.shape[0] for r in rows) or not 1 <= k <= KMAX:
        return None
    lib = lib or library()
    if lib is None:
        return None
    found = [_scan(lib, r[None], k, True) for r in rows]
    if any(ids is None for ids, _ in found):
        return None
    return [ids[0].tolist() for ids, _ in found], [probs[0].tolist() for _, probs in found]
