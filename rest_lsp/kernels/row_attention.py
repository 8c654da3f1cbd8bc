"""Attention whose result for a row is the same bits whatever rows share the step: what makes REST = plain decoding
exact in the quantized modes (q8_0, gguf).

torch's attention for a tree step reduces each row over the whole key list (the masked columns included), in a
layout that depends on the number of rows, so a row's softmax sums and `probs @ V` round differently from the
same row alone; the next matmul's per-block int8 quantization turns that into different tokens. Here each row
(and query head; under grouped-query attention head h reads key head h // group) attends over exactly its own
key list: the cache rows 0..P-1 every row shares (the committed past), then its own tail (the visible columns of
the mask: a tree row's ancestors in depth order, then itself). Per (row, head):

  - score j: a chain over d in order, s = fma(q[d], k_j[d], s), times the scale;
  - m: the exact maximum; p_j = exp(s_j - m) by one polynomial (no libm), elementwise;
  - the sum of p_j in lanes by j mod 16, then a fixed pairwise sum of the lanes;
  - out[d]: a chain over j in list order, a = fma(p_j, v_j[d], a), then divided by the sum.

Every operation depends only on the list index j and the values: not on the rows in the call, on where the
shared part ends, or on the other rows. A plain step (one row, the ancestors committed) therefore gives bit for
bit what the row gives in a tree. The shared part is read once for all rows of a block (keys outer, rows inner),
and blocks of rows by key head run on torch's OpenMP threads; neither changes a row's chain.

One C source with GCC's vector types of 16 floats, each multiply and add rounded where the source says, the fused
multiply-adds AVX-512's or AVX2's instruction or libm's fmaf (all round once); the AVX2 build does the same
operations on pairs of 8-float registers with its own transposes and blocking (GCC lowers 16-float shuffles to
scalar code there). Whatever the compiler targets (its level, levels.py), each lane's operations are the same IEEE
ones in the same order, so the paths agree bit for bit
(tests/kernels/test_row_attention.py). The C is row_attention.c, built per level by loader.py's one path, checked
against a float64 reference before use; `available()` is False where it cannot be built.
"""

from __future__ import annotations

import ctypes
import logging

import torch

from rest_lsp.kernels.buffers import extent, outcome
from rest_lsp.kernels.loader import Kernel, register

log = logging.getLogger(__name__)


# -ffp-contract=off: every multiply and add rounds where the source says (no path fuses them); the level's flags
# follow (levels.py)
FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
LIBS = ("-lm",)  # fmaf, where the target has no fused multiply-add


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    ll, vp = ctypes.c_longlong, ctypes.c_void_p
    # q, qn, n, hq, hkv, d, k, v, kvn, hs, P, mask, maskn, W, ms, scale, out, outn, threads
    lib.row_attn.argtypes = [vp, ll, ll, ll, ll, ll, vp, vp, ll, ll, ll, vp, ll, ll, ll, ctypes.c_float, vp, ll,
                             ctypes.c_int]
    lib.row_attn.restype = ctypes.c_int
    lib.row_attn_threaded.restype = ctypes.c_int
    return lib


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: int, mask: torch.Tensor | None,
              mask_from: int, scale: float) -> torch.Tensor:
    """What `row_attn` computes, in float64: q [Hq, n, D], k, v [Hkv, rows, D] -> [n, Hq * D]."""
    hq, n, d = q.shape
    group = hq // k.shape[0]
    out = torch.empty(n, hq, d, dtype=torch.float64)
    for i in range(n):
        if mask is None:
            seen = torch.arange(keys)
        else:
            seen = torch.cat([torch.arange(mask_from), mask_from + torch.nonzero(mask[i] == 0)[:, 0]])
        for h in range(hq):
            kk, vv = k[h // group, seen].double(), v[h // group, seen].double()
            p = torch.softmax(kk @ q[h, i].double() * scale, 0)
            out[i, h] = p @ vv
    return out.reshape(n, hq * d)


def _checked(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` once a small grouped attention with a tree mask matches the float64 reference (ValueError if not)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=gen) for shape in ((6, 5, 20), (2, 40, 20), (2, 40, 20)))
    mask = torch.full((5, 5), -1e30)
    for i, parent in enumerate((-1, 0, 0, 1, 3)):
        mask[i, i] = 0
        if parent >= 0:
            mask[i] = torch.maximum(mask[i], mask[parent])
    got = row_attn(q, k, v, 35, mask, 30, 0.3, lib=lib)
    if not torch.allclose(got.double(), reference(q, k, v, 35, mask, 30, 0.3), rtol=1e-4, atol=1e-5):
        raise ValueError("its results differ from the reference's")
    if not lib.row_attn_threaded():
        log.warning("The row-exact attention kernel was built without OpenMP: it runs on one thread.")
    return lib


KERNEL = Kernel("row_attention", FLAGS, LIBS, _bind, _checked,
                "the quantized modes' attention runs on torch's ops (no row-exact attention)")


def library(level: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernel of `level` (the dispatcher's by default), built and checked on first use; None where it
    cannot be (said once)."""
    return KERNEL.library(level)


def available() -> bool:
    return library() is not None


def row_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: int, mask: torch.Tensor | None,
             mask_from: int, scale: float, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """q [Hq, n, D], the caches k, v [Hkv, capacity, D] (fp32) -> attention [n, Hq * D]. Row i's keys: cache rows
    0..mask_from-1, then mask_from + c for each column c where mask [n, keys - mask_from] is 0 (mask None: rows
    0..keys-1 for every row)."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the row-exact attention kernel is not available on this machine")
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"row_attn: q {list(q.shape)} and the caches {list(k.shape)} must have 3 dimensions")
    q = q.contiguous()
    hq, n, d = q.shape
    hkv = k.shape[0]
    if mask is not None and mask.stride(-1) != 1:
        mask = mask.contiguous()
    if (q.dtype != torch.float32 or k.dtype != torch.float32 or v.dtype != torch.float32
            or k.shape != v.shape or k.stride() != v.stride() or k.shape[2] != d or k.stride(2) != 1
            or k.stride(1) != d or k.stride(0) < 0 or hkv == 0 or hq % hkv or not (q.is_cpu and k.is_cpu and v.is_cpu)
            or not 0 <= mask_from <= keys <= k.shape[1]
            or (mask is not None and (mask.dtype != torch.float32 or mask.dim() != 2 or mask.shape[0] != n
                                      or mask.shape[1] != keys - mask_from or mask.stride(0) < 0
                                      or not mask.is_cpu))):
        raise ValueError(f"row_attn: q {list(q.shape)} {q.dtype} does not fit caches {list(k.shape)} {k.dtype}, "
                         f"{keys} keys" + ("" if mask is None else f", mask {list(mask.shape)} from {mask_from}"))
    out = torch.empty(n, hq * d, dtype=torch.float32)
    if n:
        rc = lib.row_attn(q.data_ptr(), extent(q), n, hq, hkv, d, k.data_ptr(), v.data_ptr(),
                          min(extent(k), extent(v)), k.stride(0), keys if mask is None else mask_from,
                          None if mask is None else mask.data_ptr(), 0 if mask is None else extent(mask),
                          0 if mask is None else mask.shape[1], 0 if mask is None else mask.stride(0), scale,
                          out.data_ptr(), out.numel(), torch.get_num_threads())
        outcome("row_attn", rc, "a row with no keys, more than 64 query heads a key head, or heads over 1024 wide")
    return out


def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: int, mask: torch.Tensor | None, mask_from: int,
        scale: float) -> torch.Tensor:
    return row_attn(q, k, v, keys, mask, mask_from, scale)


register("row_attn(Tensor q, Tensor k, Tensor v, int keys, Tensor? mask, int mask_from, float scale) -> Tensor",
         _op)  # torch.ops.rest_lsp.row_attn
