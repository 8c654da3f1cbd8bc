"""benchmarks/shaped_gguf.py: the Qwen2.5-Coder shapes, llama.cpp's Q4_K_M type choices, random blocks that
dequantize to a trained model's spread, and a small shaped file read back (tokenizer copied, vocabulary padded)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import shaped_gguf  # noqa: E402
from benchmarks.shaped_gguf import SHAPES, Shape, random_rows, tensor_plan, use_more_bits  # noqa: E402
from gguf_writer import write_gguf  # noqa: E402


@pytest.mark.parametrize("size, params", [("1.5b", 1_543_714_304), ("7b", 7_615_616_512)])
def test_the_shapes_hold_the_published_parameter_counts(size, params):
    # the model cards: 1.54B and 7.61B parameters
    assert sum(int(np.prod(d)) for _, d, _ in tensor_plan(SHAPES[size], "q8_0")) == params


def test_use_more_bits_is_llama_cpps_rule_for_28_layers():
    assert [i for i in range(28) if use_more_bits(i, 28)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]


def test_q4_k_m_gives_q6_k_to_the_output_and_to_attn_v_and_ffn_down_where_more_bits_are_used():
    plan = {name: kind for name, _, kind in tensor_plan(SHAPES["7b"], "q4_k_m")}
    assert plan["output.weight"] == "Q6_K" and plan["token_embd.weight"] == "Q4_K"
    assert plan["blk.0.attn_v.weight"] == plan["blk.27.ffn_down.weight"] == "Q6_K"
    assert plan["blk.3.attn_v.weight"] == plan["blk.3.ffn_down.weight"] == "Q4_K"
    assert plan["blk.5.ffn_down.weight"] == "Q6_K" and plan["blk.5.ffn_up.weight"] == "Q4_K"
    assert {plan[n] for n in plan if n.endswith(("norm.weight", ".bias"))} == {"F32"}
    assert Counter(plan.values())["Q6_K"] == 1 + 2 * 14


def test_tied_embeddings_have_no_output_tensor_and_the_embedding_takes_the_outputs_type():
    plan = {name: kind for name, _, kind in tensor_plan(SHAPES["1.5b"], "q4_k_m")}
    assert "output.weight" not in plan and plan["token_embd.weight"] == "Q6_K"
    assert {k for n, k in plan.items() if not n.endswith(("norm.weight", ".bias"))} <= {"Q4_K", "Q6_K"}
    assert {k for n, k in ((n, k) for n, _, k in tensor_plan(SHAPES["1.5b"], "q8_0"))
            if not n.endswith(("norm.weight", ".bias"))} == {"Q8_0"}


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_random_blocks_dequantize_to_finite_weights_spread_like_a_trained_models(qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    blocks = random_rows(16, 512, qtype, np.random.default_rng(0))
    weights = dequantize(blocks, GGMLQuantizationType[qtype])
    assert weights.shape == (16, 512) and np.isfinite(weights).all()
    assert abs(float(weights.mean())) < 0.1 * shaped_gguf.WEIGHT_STD
    assert 0.7 * shaped_gguf.WEIGHT_STD < float(weights.std()) < 1.3 * shaped_gguf.WEIGHT_STD


def test_a_small_shaped_file_reads_back_with_its_plan_and_the_copied_tokenizer_padded(tmp_path):
    from gguf import GGUFReader

    source = write_gguf(tmp_path / "tok.gguf", vocab=97)  # 97 tokens
    shape = Shape("tiny", hidden=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab=100, tied=False)
    path = shaped_gguf.write(tmp_path / "tiny.gguf", shape, "q4_k_m", source)
    reader = GGUFReader(str(path))
    got = {t.name: (t.tensor_type.name, tuple(int(x) for x in reversed(t.shape))) for t in reader.tensors}
    assert got == {name: (kind, dims) for name, dims, kind in tensor_plan(shape, "q4_k_m")}
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 100 and tokens[-1] == "[PAD99]"
    assert reader.fields["tokenizer.ggml.merges"].contents() == GGUFReader(str(source)).fields[
        "tokenizer.ggml.merges"].contents()
    assert reader.fields["qwen2.attention.head_count_kv"].contents() == 2
    assert reader.fields["general.file_type"].contents() == 15
    assert not path.with_name(path.name + ".part").exists()
