"""The CPU matmul of a decoding step's few rows: fp32 weights in panels, streamed once, with the rows' arithmetic
hidden under the stream.

A step of a small model on a CPU is a pass over every weight for a handful of rows (1 for plain decoding, 8-16 for
a draft tree). Memory decides its price: the step streams every weight once. oneDNN's packed kernel reads the
weights and then does the rows' arithmetic, one after the other, so its cost grows with the rows
(benchmarks/bench_kernels.py, figures in benchmarks/RESULTS.md). No library we can
depend on has a kernel for this shape (llama.cpp's are for its quantized formats), so this one is ours, and small:

  - the weight [N, K] is stored once as panels [N/16, K, 16]: 16 output columns, all of K, contiguous;
  - a tile of up to 6 input rows keeps 6 x 16 sums in registers while it walks a panel, one fused multiply-add
    per weight and row; the rows of a tree are 1-3 tiles, so the panel is read from memory once;
  - while a panel is being multiplied, the next one is prefetched, so the memory is always busy;
  - the panels are split between torch.get_num_threads() threads of torch's own OpenMP pool: the library asks for
    libgomp.so.1, which a Linux torch wheel has loaded under that name already (one team of threads per process,
    see docs/how-it-works.md; a torch on another OpenMP runtime would get a second pool).

Each output is one chain of fused multiply-adds over k in order, whatever the number of rows: a row's result is
bit for bit the same alone or in a tree of 16 (a step's matmuls do not round differently with its width). The
order differs from MKL's and oneDNN's, as theirs differ from each other: fp32 rounding, no more.

The C is panel_matmul.c, built per instruction-set level and loaded by loader.py's one path, checked against
F.linear before use; with no compiler, one that fails or a library that disagrees, `available()` is False and the
step runs on oneDNN (where torch has it).
The op is `torch.ops.rest_lsp.panel_mm`, so the TorchScript layer stack calls it like any other.
"""

from __future__ import annotations

import ctypes
import logging

import torch

from rest_lsp.kernels.buffers import extent, outcome
from rest_lsp.kernels.loader import Kernel, register

log = logging.getLogger(__name__)

PANEL = 16  # output columns per panel: two 8-float vectors (one AVX2 register each)
FLAGS = ("-O3", "-ffp-contract=fast", "-shared", "-fPIC")  # the level's flags follow (levels.py)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    ll, vp = ctypes.c_longlong, ctypes.c_void_p
    # x, xn, m, k, p, pn, n, bias, bn, y, yn, threads (xn...: the floats each buffer holds)
    lib.panel_mm.argtypes = [vp, ll, ll, ll, vp, ll, ll, vp, ll, vp, ll, ctypes.c_int]
    lib.panel_mm.restype = ctypes.c_int
    lib.panel_threaded.restype = ctypes.c_int
    return lib


def _checked(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` once it computes a small product with partial panels and tiles as F.linear does (ValueError if not):
    a compiler that miscompiles it must not reach the exact mode."""
    gen = torch.Generator().manual_seed(0)
    weight, bias, x = (torch.randn(*shape, generator=gen) for shape in ((50, 33), (50,), (7, 33)))
    got = panel_mm(x, pack(weight), 50, bias, lib=lib)  # [7, 50]
    if not torch.allclose(got, torch.nn.functional.linear(x, weight, bias), rtol=1e-4, atol=1e-4):
        raise ValueError("its results differ from F.linear's")
    if not lib.panel_threaded():
        log.warning("The panel kernel was built without OpenMP: its matmuls run on one thread.")
    return lib


KERNEL = Kernel("panel_matmul", FLAGS, (), _bind, _checked,
                "fp32 steps run without rest-lsp's panel kernel (on oneDNN where torch has it)")


def library(level: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernel of `level` (the dispatcher's by default), built and checked on first use; None where it
    cannot be (said once)."""
    return KERNEL.library(level)


def available() -> bool:
    return library() is not None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (fp32) -> panels [ceil(N / PANEL), K, PANEL], the columns past N zero."""
    n, k = weight.shape
    rows = -(-n // PANEL) * PANEL
    padded = torch.zeros(rows, k, dtype=torch.float32)
    padded[:n] = weight.detach().float()
    return padded.view(rows // PANEL, PANEL, k).transpose(1, 2).contiguous()


def panel_mm(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None = None,
             lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [m, K] @ W.T + bias -> [m, n], W given by `pack`."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the panel kernel is not available on this machine")
    if x.dim() != 2:
        raise ValueError(f"panel_mm: the input {list(x.shape)} must be rows [m, K]")
    x = x.contiguous()
    m, k = x.shape
    # called ~120 times a step: the checks stay cheap attribute reads (`is_cpu`, not a loop over `device.type`)
    if (x.dtype != torch.float32 or panels.dtype != torch.float32 or panels.dim() != 3 or panels.shape[1:] != (k, PANEL)
            or panels.shape[0] * PANEL < n or n < 0 or not panels.is_contiguous() or not (x.is_cpu and panels.is_cpu)
            or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous() or bias.numel() < n
                                      or not bias.is_cpu))):
        raise ValueError(f"panel_mm: input [{m}, {k}] {x.dtype} does not fit panels {list(panels.shape)} "
                         f"{panels.dtype} for {n} outputs" + ("" if bias is None else f", bias [{bias.numel()}]"))
    y = torch.empty(m, n, dtype=torch.float32)  # [m, n]
    if m:
        outcome("panel_mm", lib.panel_mm(x.data_ptr(), extent(x), m, k, panels.data_ptr(), extent(panels), n,
                                         None if bias is None else bias.data_ptr(), 0 if bias is None else extent(bias),
                                         y.data_ptr(), extent(y), torch.get_num_threads()), "")
    return y


def _op(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    return panel_mm(x, panels, n, bias)


register("panel_mm(Tensor x, Tensor panels, int n, Tensor? bias) -> Tensor", _op)  # torch.ops.rest_lsp.panel_mm
