"""benchmarks/bench_rest.py's references: transformers' generate where the model has a transformers forward, our own
engine's plain steps and prompt-lookup trees for a .gguf loaded from its blocks (which has none: the benchmark
died on it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_rest import references  # noqa: E402
from gguf_writer import write_gguf  # noqa: E402
from rest_lsp.engine.decoding import DecodeConfig, Decoder  # noqa: E402
from rest_lsp.drafting.drafts import ContextLookup  # noqa: E402
from rest_lsp.engine.model import load_model  # noqa: E402
from rest_lsp.kernels import quant_matmul  # noqa: E402
from support import tiny_model  # noqa: E402


def test_a_gguf_loaded_from_its_blocks_is_referenced_by_our_own_plain_steps(tmp_path):
    if not quant_matmul.available():
        pytest.skip("no C compiler here builds the quantized kernel")
    loaded = load_model(str(write_gguf(tmp_path / "m.gguf", layers=2)), "cpu", "gguf")
    assert getattr(loaded.model, "lean_only", False)
    plain, lookup, name = references(loaded, 8)
    assert "no transformers forward" in name
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    tokens, prefill_ms, ms = plain(prompt, 12)
    truth = Decoder(loaded).generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=12, budget=0)).tokens
    assert tokens == truth and prefill_ms > 0 and ms > 0
    assert lookup(prompt, 12)[0] == truth  # prompt lookup's drafts, verified: the same tokens


def test_a_model_with_a_transformers_forward_is_referenced_by_generate():
    loaded = tiny_model("llama")
    plain, lookup, name = references(loaded, 8)
    assert name == "transformers generate"
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    tokens, _, _ = plain(prompt, 6)
    assert tokens == Decoder(loaded).generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=6, budget=0)).tokens
    assert lookup(prompt, 6)[0] == tokens
