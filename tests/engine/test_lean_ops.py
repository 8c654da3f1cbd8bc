"""The lean engine's small ops against transformers' own: the rotation bit for bit (its table built on one thread), the
norm to rounding, and the attention scale folded into the query weights only where that is exact."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from rest_lsp.engine.lean_llama import LeanLlama, Norm, query_scale
from rest_lsp.engine.matmuls import panel_packs

from support import tiny_model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_rotation_is_transformers_rotation_bit_for_bit(arch):
    loaded = tiny_model(arch)
    lean = LeanLlama(loaded.model, 512)
    rotary = loaded.model.model.rotary_emb
    positions = torch.tensor([0, 3, 17, 200, 511])
    x = torch.randn(1, 4, len(positions), lean.head_dim, generator=torch.Generator().manual_seed(0))  # [B, H, n, D]
    cos, sin = rotary(x, positions[None])  # [1, n, D] each
    want, _ = apply_rotary_pos_emb(x, x, cos, sin)
    got = lean._rotate(x[0], lean.cos[positions][None], lean.sin[positions][None])
    assert torch.equal(got, want[0])


def test_the_rotation_table_is_computed_on_one_thread_and_is_transformers_at_every_position(monkeypatch):
    """torch's cos over a whole [1024, 64] table, split between two threads, came back wrong in the worker thread's
    half in 5 of 300 fresh processes (docs/LOG.md, 2026-12-06, night), and the table lives as long as the
    process: each cos and sin call that builds it takes fewer elements than torch splits between threads, and its
    rows are transformers' own at positions far into a long context."""
    from rest_lsp.engine import rotary

    loaded = tiny_model("qwen2")
    lean = LeanLlama(loaded.model, 512)
    sizes = []

    def recorded(real):
        def call(self):
            sizes.append(self.numel())
            return real(self)
        return call

    monkeypatch.setattr(torch.Tensor, "cos", recorded(torch.Tensor.cos))
    monkeypatch.setattr(torch.Tensor, "sin", recorded(torch.Tensor.sin))
    cos, sin = lean._rope_table(4096)
    monkeypatch.undo()
    assert len(sizes) > 2 * 4096 * lean.head_dim // rotary.TRIG_ELEMENTS
    assert max(sizes) <= rotary.TRIG_ELEMENTS < 2048  # 2048: where torch splits cos and sin between threads
    positions = torch.tensor([0, 1, 511, 512, 1023, 1024, 2047, 3000, 4095])
    x = torch.randn(1, 1, len(positions), lean.head_dim)
    want_cos, want_sin = loaded.model.model.rotary_emb(x, positions[None])  # [1, n, D]: a few elements a call
    assert torch.equal(cos[positions], want_cos[0])
    half = lean.head_dim // 2
    assert torch.equal(sin[positions][:, half:], want_sin[0][:, half:])
    assert torch.equal(sin[positions][:, :half], -want_sin[0][:, :half])  # the first half negated for `rotate`


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_the_norm_is_rmsnorm_to_rounding(rows):
    torch.manual_seed(0)
    module = LlamaRMSNorm(48, eps=1e-5)
    module.weight.data = torch.randn(48)
    loaded = tiny_model("llama")
    lean = LeanLlama(loaded.model, 512)
    x = torch.randn(rows, 48) * 3
    got = lean._rms(x, Norm.of(module.weight))
    assert got.shape == (rows, 48)
    torch.testing.assert_close(got, module(x), rtol=1e-6, atol=1e-6)
    half = Norm.of(module.weight.to(torch.bfloat16))
    assert half.doubled is None  # half dtypes keep transformers' own op order
    torch.testing.assert_close(lean._rms(x.to(torch.bfloat16), half).float(), module(x), rtol=2e-2, atol=2e-2)


def test_the_attention_scale_moves_into_the_weights_only_when_exact():
    assert query_scale(64) == 0.125 and query_scale(16) == 0.25 and query_scale(256) == 1 / 16
    assert query_scale(96) is None and query_scale(80) is None  # 1/sqrt(D) not a power of two: scaled per layer
    loaded = tiny_model("llama")
    lean = LeanLlama(loaded.model, 512)
    q_rows = lean.heads * lean.head_dim
    fused = loaded.model.model.layers[0]._lean_fused[0]  # the model's own q/k/v weights, never scaled in place
    assert torch.equal(fused[:q_rows], loaded.model.model.layers[0].self_attn.q_proj.weight)
    scale = query_scale(lean.head_dim)
    if scale is None:
        assert lean.score_scale == lean.head_dim**-0.5
    else:
        assert lean.score_scale == 1.0
        x = torch.randn(2, fused.shape[1])
        got = lean.layers[0].qkv(x)
        torch.testing.assert_close(got[:, :q_rows], (x @ fused[:q_rows].T) * scale, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got[:, q_rows:], x @ fused[q_rows:].T, rtol=1e-6, atol=1e-6)


def _tiny_odd_head_dim():
    """A Llama whose 1/sqrt(head_dim) is not a power of two: attention scales its scores per layer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    return LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2)).eval()


def _run(lean: LeanLlama, static: bool) -> list[torch.Tensor]:
    """A prefill, a 1-token step and a tree step: their hidden states, then the cache's valid rows."""
    from test_static_step import random_tree, tree_step
    import random

    cache = lean.new_cache()
    rnd = random.Random(5)
    prompt = [rnd.randrange(97) for _ in range(20)]
    out = [lean.forward(torch.tensor(prompt), torch.arange(20), cache).clone()]
    out.append(tree_step(lean, cache, random_tree(1, rnd, 97), static).clone())
    out.append(tree_step(lean, cache, random_tree(7, rnd, 97), static).clone())
    return out + [cache.k[:, :, : cache.length].clone(), cache.v[:, :, : cache.length].clone()]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "odd-head-dim"])
@pytest.mark.parametrize("pack", ["none", "panel", "onednn", "fp16"])
@pytest.mark.parametrize("static", [False, True], ids=["eager-step", "static-step"])
def test_the_scripted_layers_compute_what_the_python_layers_do_bit_for_bit(arch, pack, static):
    if pack == "panel" and not panel_packs(torch.float32, torch.device("cpu")):
        pytest.skip("no C compiler here builds the panel kernel")
    model = _tiny_odd_head_dim() if arch == "odd-head-dim" else tiny_model(arch).model
    scripted = LeanLlama(model, 512, pack=pack, script=True)
    python = LeanLlama(model, 512, pack=pack, script=False)
    assert scripted.scripted and not python.scripted and scripted.layers is python.layers
    if arch == "odd-head-dim":
        assert scripted.score_scale != 1.0
    for got, want in zip(_run(scripted, static), _run(python, static), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_scripted_layers_compute_what_the_python_layers_do_in_bfloat16(arch):
    model = tiny_model(arch).model.to(torch.bfloat16)  # what a CPU with bf16 in hardware runs by default
    scripted, python = LeanLlama(model, 512, script=True), LeanLlama(model, 512, script=False)
    assert scripted.scripted and scripted.norm.doubled is None  # the half-dtype norm, in transformers' op order
    for got, want in zip(_run(scripted, False), _run(python, False), strict=True):
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_layers_that_cannot_be_scripted_run_eagerly_and_say_so_once(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise RuntimeError("this torch has no TorchScript\nmore detail")

    monkeypatch.setattr(torch.jit, "script", refuse)
    model = tiny_model("llama").model
    with caplog.at_level("WARNING", logger="rest_lsp.engine.lean_llama"):
        lean = LeanLlama(model, 512, script=True)
    assert not lean.scripted
    assert [r.getMessage() for r in caplog.records] == [
        "The decoder layers run in eager mode: TorchScript could not compile them (this torch has no TorchScript)."]
    python = LeanLlama(model, 512, script=False)
    for got, want in zip(_run(lean, False), _run(python, False), strict=True):
        assert torch.equal(got, want)
