"""The step's kernel ops (rest_lsp/kernels/step_ops.py): native, they give the Python wrappers' results bit for bit,
refuse bad tensors with one sentence, and a lean step's kernel calls no longer go through Python; where the native
library cannot be had, the same ops run the wrappers."""

import subprocess
import sys

import pytest
import torch
from support import tiny_model

from rest_lsp.engine.lean_llama import LeanLlama
from rest_lsp.engine.lean_llama import rotate
from rest_lsp.kernels import panel_matmul, quant_matmul, row_attention, step_ops

NONE = torch.empty(0)


@pytest.fixture(scope="module")
def native():
    if quant_matmul.library() is None or row_attention.library() is None or panel_matmul.library() is None:
        pytest.skip("no C compiler here builds the kernels")
    if not step_ops.ready():
        pytest.skip("the native step ops cannot be built here (no C++ compiler, or a torch without its stable ABI)")
    return True


def panels_of(n: int, k: int, bits: int, gen: torch.Generator) -> torch.Tensor:
    q, d = quant_matmul.quantize_q8_0(torch.randn(n, k, generator=gen))
    off = quant_matmul.OFFSETS[bits] if bits != 8 else 128
    return quant_matmul.pack_blocks(q.clamp(-off, off - 1), d, bits)


@pytest.mark.parametrize("bits", [8, 5, 4])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_quant_mm_is_the_wrappers_product_bit_for_bit(native, bits, rows):
    gen = torch.Generator().manual_seed(rows * 10 + bits)
    x, panels = torch.randn(rows, 96, generator=gen), panels_of(50, 96, bits, gen)
    for bias in (None, torch.randn(50, generator=gen)):
        got = torch.ops.rest_lsp_step.quant_mm(x, panels, 50, NONE if bias is None else bias, bits)
        assert torch.equal(got, quant_matmul.quant_mm(x, panels, 50, bias, bits=bits))


@pytest.mark.parametrize("rows", [1, 7])
def test_panel_mm_is_the_wrappers_product_bit_for_bit(native, rows):
    gen = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 72, generator=gen), torch.randn(40, 72, generator=gen)
    for bias in (None, torch.randn(40, generator=gen)):
        got = torch.ops.rest_lsp_step.panel_mm(x, panel_matmul.pack(w), 40, NONE if bias is None else bias)
        assert torch.equal(got, panel_matmul.panel_mm(x, panel_matmul.pack(w), 40, bias))


@pytest.mark.parametrize("n", [1, 6])
def test_rope_cache_is_the_layers_rotation_and_cache_writes_bit_for_bit(native, n):
    """What lean_llama's torch ops did between the q/k/v matmul and attention: q and k rotated by `rotate`, k and v
    written at rows past.. (a plain or tree step) or at given rows (a static step), nothing else of the cache
    touched."""
    gen = torch.Generator().manual_seed(n)
    hq, hkv, d = 6, 2, 32
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen) * 50
    cos, sin = torch.randn(1, n, d, generator=gen), torch.randn(1, n, d, generator=gen)
    for rows in (None, torch.randperm(20, generator=gen)[:n]):
        got_k, got_v = torch.randn(2, hkv, 20, d, generator=gen).unbind(0)
        want_k, want_v = got_k.clone(), got_v.clone()
        q = torch.ops.rest_lsp_step.rope_cache(qkv, cos, sin, got_k, got_v, 9, NONE.long() if rows is None else rows,
                                               hq)
        heads = qkv.view(n, hq + 2 * hkv, d).transpose(0, 1)
        qk = rotate(heads[: hq + hkv], cos, sin)
        at = torch.arange(9, 9 + n) if rows is None else rows
        want_k[:, at], want_v[:, at] = qk[hq:], heads[hq + hkv :]
        assert torch.equal(q, qk[:hq]) and q.is_contiguous()
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("rows", [1, 5])
def test_row_attn_is_the_wrappers_attention_bit_for_bit(native, rows):
    gen = torch.Generator().manual_seed(rows)
    q = torch.randn(6, rows, 32, generator=gen)
    k, v = torch.randn(2, 40, 32, generator=gen), torch.randn(2, 40, 32, generator=gen)
    mask = torch.where(torch.rand(rows, rows, generator=gen) < 0.5, 0.0, -1e30)
    mask.diagonal().zero_()
    assert torch.equal(torch.ops.rest_lsp_step.row_attn(q, k, v, 30, NONE, 0, 0.125),
                       row_attention.row_attn(q, k, v, 30, None, 0, 0.125))
    assert torch.equal(torch.ops.rest_lsp_step.row_attn(q, k, v, 30 + rows, mask, 30, 0.125),
                       row_attention.row_attn(q, k, v, 30 + rows, mask, 30, 0.125))


@pytest.mark.parametrize("width", [24, 576, 896])
def test_rms_norm_is_transformers_norm_to_rounding_and_each_rows_own(native, width):
    """The native norm: transformers' formula (LlamaRMSNorm in fp32) to rounding, the Python op's layer-norm route to
    rounding, and a row's bits the same alone and among others (a tree step's rows = a plain step's)."""
    gen = torch.Generator().manual_seed(width)
    x, w = torch.randn(9, width, generator=gen) * 30, torch.randn(width, generator=gen)
    got = torch.ops.rest_lsp_step.rms_norm(x, w, torch.cat([w, w]), 1e-6)
    want = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    assert torch.allclose(got, step_ops._py_rms_norm(x, w, torch.cat([w, w]), 1e-6), rtol=1e-6, atol=1e-6)
    for i in (0, 4, 8):
        assert torch.equal(torch.ops.rest_lsp_step.rms_norm(x[i : i + 1].clone(), w, NONE, 1e-6), got[i : i + 1])


def test_bad_tensors_are_refused_in_one_sentence(native):
    x, panels = torch.randn(2, 64), quant_matmul.pack(torch.randn(32, 64))
    q, k = torch.randn(4, 1, 16), torch.randn(2, 10, 16)
    calls = {
        "more outputs than panels": lambda: torch.ops.rest_lsp_step.quant_mm(x, panels, 48, NONE, 8),
        "columns": lambda: torch.ops.rest_lsp_step.quant_mm(x.t().contiguous().t(), panels, 32, NONE, 8),
        "fp64 rows": lambda: torch.ops.rest_lsp_step.quant_mm(x.double(), panels, 32, NONE, 8),
        "a short bias": lambda: torch.ops.rest_lsp_step.quant_mm(x, panels, 32, torch.ones(3), 8),
        "3 bits": lambda: torch.ops.rest_lsp_step.quant_mm(x, panels, 32, NONE, 3),
        "other panels": lambda: torch.ops.rest_lsp_step.quant_mm(torch.randn(2, 96), panels, 32, NONE, 8),
        "keys past the cache": lambda: torch.ops.rest_lsp_step.row_attn(q, k, k, 11, NONE, 0, 1.0),
        "a mask of other rows": lambda: torch.ops.rest_lsp_step.row_attn(q, k, k, 6, torch.zeros(2, 2), 4, 1.0),
        "a 2-d query": lambda: torch.ops.rest_lsp_step.row_attn(q[0], k, k, 5, NONE, 0, 1.0),
        "panels of other rows": lambda: torch.ops.rest_lsp_step.panel_mm(x, panel_matmul.pack(torch.ones(8, 32)), 8,
                                                                          NONE),
        "rows past the cache": lambda: torch.ops.rest_lsp_step.rope_cache(torch.zeros(1, 96), torch.zeros(1, 1, 16),
                                                                           torch.zeros(1, 1, 16), k, k, 10, NONE, 2),
        "a slot past the cache": lambda: torch.ops.rest_lsp_step.rope_cache(
            torch.zeros(1, 96), torch.zeros(1, 1, 16), torch.zeros(1, 1, 16), k, k, 0, torch.tensor([10]), 2),
        "other heads": lambda: torch.ops.rest_lsp_step.rope_cache(torch.zeros(1, 96), torch.zeros(1, 1, 16),
                                                                   torch.zeros(1, 1, 16), k, k, 0, NONE, 3),
        "a weight of another width": lambda: torch.ops.rest_lsp_step.rms_norm(x, torch.ones(32), NONE, 1e-6),
        "a column of rows": lambda: torch.ops.rest_lsp_step.rms_norm(x.t(), torch.ones(2), NONE, 1e-6),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=r"^(quant_mm|panel_mm|row_attn|rope_cache|rms_norm): [^\n]*$"):
            call()
            pytest.fail(name)


@pytest.mark.parametrize("pack", ["q8", "panel"])
def test_a_lean_step_calls_no_python_wrapper(native, monkeypatch, pack):
    """The quantized and fp32 steps' matmuls and attention run the native ops: the wrappers (which the ops of
    quant_matmul.py, panel_matmul.py and row_attention.py call) are never reached."""
    loaded = tiny_model("llama")
    lean = LeanLlama(loaded.model, 64, pack=pack)
    cache = lean.new_cache()
    ids = torch.tensor([3, 14, 15, 92, 65])
    lean.forward(ids[:4], torch.arange(4), cache)
    calls = []
    monkeypatch.setattr(quant_matmul, "quant_mm", lambda *a, **k: calls.append("quant_mm"))
    monkeypatch.setattr(row_attention, "row_attn", lambda *a, **k: calls.append("row_attn"))
    monkeypatch.setattr(panel_matmul, "panel_mm", lambda *a, **k: calls.append("panel_mm"))
    assert lean.scripted and lean.layers[0].fused_rope and lean.layers[0].row_exact == (pack == "q8")
    assert lean.layers[0].in_native and lean.layers[0].post_native and lean.stack.norm_native  # step_ops.rms_norm
    lean.head(lean.forward(ids[4:], torch.arange(4, 5), cache))
    assert calls == []


def test_without_the_native_library_the_ops_run_the_wrappers(tmp_path):
    """A fresh process whose native library cannot be had: the ops exist and give the wrappers' results."""
    script = """
import torch
from rest_lsp.kernels import quant_matmul, step_ops
if quant_matmul.library() is None:
    print("skip"); raise SystemExit
step_ops.KERNEL.library = lambda level=None: None
assert step_ops.ready() is False
x, panels = torch.randn(2, 64), quant_matmul.pack(torch.randn(32, 64))
assert torch.equal(torch.ops.rest_lsp_step.quant_mm(x, panels, 32, torch.empty(0), 8),
                   quant_matmul.quant_mm(x, panels, 32))
print("ok")
"""
    env = {**__import__("os").environ, "REST_LSP_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() == "skip":
        pytest.skip("no C compiler here builds the kernels")
    assert done.stdout.strip() == "ok"
