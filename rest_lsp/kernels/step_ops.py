"""The ops a lean step calls its kernels through: `torch.ops.rest_lsp_step.quant_mm`, `.panel_mm` and `.row_attn`,
native where they can be, `.rope_cache`, a layer's rotation and cache writes in one native op, and `.rms_norm`.

A 1-token step of a small model makes some 150 kernel calls (four matmuls and an attention a layer, the LM head).
Through quant_matmul.py's and row_attention.py's ops each call leaves TorchScript for Python (the dispatcher's
Python kernel, the wrapper's checks, ctypes), several times the cost of the call's own dispatch: a good part of a
small model's step. Here the same calls are registered with torch's dispatcher as native kernels (step_ops.cpp,
through torch's stable C ABI), which check their tensors as the wrappers do and call the same kernel entry points
with the same arguments: the same bits, without Python in between. `rope_cache` takes a layer's some dozen small
torch ops between its q/k/v matmul and its attention (views, a roll, the rotation's products and sum, two cache
writes) in one call, each element's operations those of the torch ops (lean_llama's `rotate`), bit for bit.
`rms_norm` takes a norm's ops (61 calls a step of the default model, each several torch ops on a tensor of one row)
in one call: the same formula, its mean of squares summed in double, so the same as the Python op to rounding, not
bit for bit (a process runs one or the other for all its steps, so REST and plain still share every bit).

The schemas take tensors where the wrappers take optional ones (a bias or mask of no elements stands for none):
the stable ABI's optional arguments change form between torch versions, plain tensors do not. Where the native
library cannot be had (no C++ compiler, a torch without the stable ABI's library calls, a failing check against
the Python ops' results) the same ops run the Python wrappers, said once.

The native ops call the kernel libraries of the level chosen (levels.py) when the first lean step was built; the
wrappers ask per call.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

import torch

from rest_lsp.kernels import panel_matmul, quant_matmul, row_attention
from rest_lsp.kernels.loader import Kernel

log = logging.getLogger(__name__)

NAMESPACE = "rest_lsp_step"
SCHEMAS = {
    "quant_mm": "quant_mm(Tensor x, Tensor panels, int n, Tensor bias, int bits) -> Tensor",
    "panel_mm": "panel_mm(Tensor x, Tensor panels, int n, Tensor bias) -> Tensor",
    "row_attn": "row_attn(Tensor q, Tensor k, Tensor v, int keys, Tensor mask, int mask_from, float scale) -> Tensor",
    "rope_cache": "rope_cache(Tensor qkv, Tensor cos, Tensor sin, Tensor k_cache, Tensor v_cache, int past, "
                  "Tensor rows, int heads) -> Tensor",
    "rms_norm": "rms_norm(Tensor x, Tensor weight, Tensor doubled, float eps) -> Tensor",
}
_TORCH_LIB = Path(torch.__file__).parent / "lib"
# the torch version in the flags: a library is built again for another torch (the cache key covers every flag)
# -ffp-contract=off: rope_cache's products and sums round where torch's ops round them
FLAGS = ("-O2", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC", "-Wl,--no-undefined",
         f"-DREST_LSP_TORCH={torch.__version__.replace('+', '_')}")
LIBS = (f"-L{_TORCH_LIB}", f"-Wl,-rpath,{_TORCH_LIB}", "-ltorch_cpu", "-lc10", "-lstdc++", "-lm")

_ops = torch.library.Library(NAMESPACE, "DEF")
for _schema in SCHEMAS.values():
    _ops.define(_schema)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.step_bind.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.step_bind.restype = ctypes.c_int
    lib.step_register.argtypes = [ctypes.c_char_p]
    lib.step_register.restype = ctypes.c_void_p
    lib.step_unregister.argtypes = [ctypes.c_void_p]
    lib.step_unregister.restype = ctypes.c_int
    return lib


KERNEL = Kernel("step_ops", FLAGS, LIBS, _bind, lambda lib: lib,
                "the step's kernels are called through Python", suffix=".cpp")

_lock = threading.Lock()
_native: bool | None = None  # None: not registered yet


def _py_quant_mm(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor, bits: int) -> torch.Tensor:
    return quant_matmul.quant_mm(x, panels, n, bias if bias.numel() else None, bits=bits)


def _py_row_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: int, mask: torch.Tensor, mask_from: int,
                 scale: float) -> torch.Tensor:
    return row_attention.row_attn(q, k, v, keys, mask if mask.numel() else None, mask_from, scale)


def _py_panel_mm(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor) -> torch.Tensor:
    return panel_matmul.panel_mm(x, panels, n, bias if bias.numel() else None)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' x * cos + rotate_half(x) * sin, bit for bit: rotate_half(x) * sin is the two halves swapped
    (one roll) times sin with its first half negated (`sin` here)."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, -1) * sin


def _py_rope_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, past: int, rows: torch.Tensor, heads: int) -> torch.Tensor:
    """rope_cache in torch's ops: qkv [n, (Hq + 2 Hkv) D] -> the rotated q [Hq, n, D], k and v written into the
    caches' rows `rows` (no elements: past on)."""
    n, (hkv, _, d) = qkv.shape[0], k_cache.shape
    all_heads = qkv.view(n, heads + 2 * hkv, d).transpose(0, 1)  # [Hq + 2 Hkv, n, D]
    qk = rotate(all_heads[: heads + hkv], cos, sin)  # q and k heads in one rotation
    if rows.numel() == 0:
        k_cache[:, past : past + n] = qk[heads:]
        v_cache[:, past : past + n] = all_heads[heads + hkv :]
    else:
        k_cache.index_copy_(1, rows, qk[heads:])
        v_cache.index_copy_(1, rows, all_heads[heads + hkv :])
    return qk[:heads].contiguous()


def layer_norm_rms(x: torch.Tensor, doubled: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [n, H] in fp32 as LayerNorm over [x, -x] (mean 0, the same mean square) with the weight twice
    (`doubled` [2H]): one kernel where torch's rms_norm is six ops on a CPU; transformers' norm to rounding."""
    H = x.shape[-1]
    return torch.nn.functional.layer_norm(torch.cat([x, -x], dim=-1), [2 * H], doubled, None, eps)[:, :H]


def _py_rms_norm(x: torch.Tensor, weight: torch.Tensor, doubled: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm in torch's ops (`layer_norm_rms`): the native op's result to rounding."""
    return layer_norm_rms(x, doubled, eps)


def _address(lib: ctypes.CDLL | None, name: str) -> int | None:
    return None if lib is None else ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _agrees() -> bool:
    """Whether the registered ops give the Python wrappers' results bit for bit on small products and attention."""
    gen = torch.Generator().manual_seed(0)
    none = torch.empty(0)
    if quant_matmul.library() is not None:
        x = torch.randn(3, 80, generator=gen)
        for bits, bias in ((8, none), (4, torch.randn(40, generator=gen))):
            q, d = quant_matmul.quantize_q8_0(torch.randn(40, 80, generator=gen))
            panels = quant_matmul.pack_blocks(q.clamp(-8, 7) if bits == 4 else q, d, bits)
            got = torch.ops.rest_lsp_step.quant_mm(x, panels, 40, bias, bits)
            if not torch.equal(got, _py_quant_mm(x, panels, 40, bias, bits)):
                return False
    if panel_matmul.library() is not None:
        x, w = torch.randn(3, 40, generator=gen), torch.randn(20, 40, generator=gen)
        for bias in (none, torch.randn(20, generator=gen)):
            got = torch.ops.rest_lsp_step.panel_mm(x, panel_matmul.pack(w), 20, bias)
            if not torch.equal(got, _py_panel_mm(x, panel_matmul.pack(w), 20, bias)):
                return False
    qkv, cos, sin = torch.randn(3, 8 * 16, generator=gen), torch.randn(1, 3, 16, generator=gen), torch.randn(1, 3, 16)
    caches = [torch.zeros(2, 2, 10, 16) for _ in range(2)]
    for rows in (none, torch.tensor([7, 2, 5])):
        got = torch.ops.rest_lsp_step.rope_cache(qkv, cos, sin, caches[0][0], caches[0][1], 4, rows, 4)
        want = _py_rope_cache(qkv, cos, sin, caches[1][0], caches[1][1], 4, rows, 4)
        if not (torch.equal(got, want) and torch.equal(caches[0], caches[1])):
            return False
    x, w = torch.randn(3, 24, generator=gen), torch.randn(24, generator=gen)
    got = torch.ops.rest_lsp_step.rms_norm(x, w, torch.cat([w, w]), 1e-6)
    if not torch.allclose(got, _py_rms_norm(x, w, torch.cat([w, w]), 1e-6), rtol=1e-5, atol=1e-6):
        return False  # the norm is the same to rounding, not bit for bit
    if row_attention.library() is not None:
        q, k, v = (torch.randn(*s, generator=gen) for s in ((4, 3, 16), (2, 20, 16), (2, 20, 16)))
        mask = torch.tensor([[0.0, -1e30, -1e30], [0.0, 0.0, -1e30], [0.0, -1e30, 0.0]])
        for m in (none, mask):
            if not torch.equal(torch.ops.rest_lsp_step.row_attn(q, k, v, 12, m, 9, 0.25),
                               _py_row_attn(q, k, v, 12, m, 9, 0.25)):
                return False
    return True


def _register_native() -> bool:
    lib = KERNEL.library()
    if lib is None:
        return False
    lib.step_bind(_address(quant_matmul.library(), "quant_mm"), _address(row_attention.library(), "row_attn"),
                  _address(panel_matmul.library(), "panel_mm"))
    handle = lib.step_register(NAMESPACE.encode())
    if not handle:
        log.warning("torch did not take the native step ops: %s.", KERNEL.purpose)
        return False
    try:
        if _agrees():
            return True
    except Exception as err:  # noqa: BLE001 - any failure leaves the Python ops, which always work
        log.warning("The native step ops failed their check (%s): %s.", err, KERNEL.purpose)
    else:
        log.warning("The native step ops differ from the Python ones: %s.", KERNEL.purpose)
    lib.step_unregister(handle)
    return False


def ready() -> bool:
    """Registers the ops' kernels once a process (native where they can be, else the Python wrappers); whether
    they are native."""
    global _native
    if _native is None:
        with _lock:
            if _native is None:
                native = _register_native()
                if not native:
                    for name, fn in (("quant_mm", _py_quant_mm), ("panel_mm", _py_panel_mm),
                                     ("row_attn", _py_row_attn), ("rope_cache", _py_rope_cache),
                                     ("rms_norm", _py_rms_norm)):
                        _ops.impl(name, fn, "CPU")
                _native = native
    return _native
