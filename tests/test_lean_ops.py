"""The lean engine's small ops against transformers' own: the rotation bit for bit, the norm to rounding, and the
attention scale folded into the query weights only where that is exact."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from rest_lsp.lean_llama import LeanLlama, Norm, query_scale

from conftest import tiny_model


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
