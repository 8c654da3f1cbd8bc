"""float16-weights: fp32 activations and arithmetic over fbgemm's fp16 copies of the linear weights (CPU).

Not the exact mode: the weights round to fp16 once, so its output may leave fp32's where the model is near a tie.
What it promises is REST's own: greedy REST output is what plain decoding in the same mode writes.
"""


import pytest
import torch

from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.engine.lean_llama import LeanLlama
from rest_lsp.engine.matmuls import Matmul, fp16_packs, pick_packing
from rest_lsp.engine.runmode import FP16_WEIGHTS, pick_weight_packing
from rest_lsp.settings import Settings
from test_exactness import assert_rest_is_plain_decoding, plain_tokens

pytestmark = pytest.mark.skipif(not fp16_packs(torch.float32, torch.device("cpu")),
                                reason="this torch has no fbgemm fp16 kernels")


@pytest.fixture()
def cpu_tiny(tiny):
    if tiny.device.type != "cpu":
        pytest.skip("float16-weights runs on a CPU")
    return tiny


def test_a_packed_fp16_matmul_is_the_fp32_product_of_the_rounded_weights():
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 64), torch.randn(96), torch.randn(5, 64)
    got = Matmul.of(weight, bias, "fp16")(x)
    want = x @ weight.half().float().T + bias
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, x @ weight.T + bias, rtol=1e-6, atol=1e-6)  # the weights did round


def test_greedy_rest_equals_plain_decoding_in_the_same_mode(cpu_tiny):
    """Perfect, useless, partly right and branchy drafts, trees of 4-16 nodes: every step's accepted tokens are
    the ones a one-token step of float16-weights picks."""
    decoder = Decoder(cpu_tiny, pack="fp16")
    assert decoder.engine == "lean-fp16"
    assert_rest_is_plain_decoding(decoder, cpu_tiny.model.config.vocab_size, budgets=(4, 16))


def test_the_default_model_in_float16_weights_drafts_what_it_decodes(default_model):
    if default_model.device.type != "cpu":
        pytest.skip("float16-weights runs on a CPU")
    from rest_lsp.drafting.drafts import ContextLookup, NgramDrafts

    tok = default_model.tokenizer
    prompt = tok.encode("import os\n\n\ndef list_python_files(folder):\n"
                        '    """Return the paths of the Python files under folder."""\n    result = []\n')
    decoder = Decoder(default_model, pack="fp16")
    truth = plain_tokens(decoder, prompt, 32)
    for source in (ContextLookup(), NgramDrafts([prompt + truth])):
        assert decoder.generate(prompt, source, DecodeConfig(max_new_tokens=32, budget=16)).tokens == truth
    # the fp16 copies are the model's weights rounded once: the logits stay within fp16's rounding of fp32's
    exact = Decoder(default_model)
    ids = torch.tensor(prompt)
    for d in (decoder, exact):
        d.reset()
    a = decoder.logits(decoder.lean.forward(ids, torch.arange(len(prompt)), decoder.lean.new_cache())[-1:])
    b = exact.logits(exact.lean.forward(ids, torch.arange(len(prompt)), exact.lean.new_cache())[-1:])
    assert (a - b).abs().max() < 0.5 and a.argmax() == b.argmax()


def test_a_gguf_model_defaults_to_float16_weights_on_a_cpu_without_bf16(monkeypatch):
    """A GGUF's weights are quantized or half already: by default they run as fp16 copies on a CPU without bf16
    in hardware; a model folder keeps fp32 (the exact mode), and a CPU with bf16 keeps its bf16 default."""
    from rest_lsp.engine import runmode

    cpu = torch.device("cpu")
    monkeypatch.setattr(runmode, "native_bf16", lambda *a, **k: False)
    assert pick_weight_packing(None, cpu, gguf=True) == ("fp16", None)
    assert pick_weight_packing("auto", cpu, gguf=True) == ("fp16", None)
    assert pick_weight_packing(None, cpu, gguf=False) == (None, None)
    assert pick_weight_packing("float32", cpu, gguf=True) == (None, None)  # the exact mode, asked for
    assert pick_weight_packing(None, torch.device("cuda"), gguf=True) == (None, None)
    monkeypatch.setattr(runmode, "native_bf16", lambda *a, **k: True)
    assert pick_weight_packing(None, cpu, gguf=True) == (None, None)


def test_float16_weights_elsewhere_runs_float32_and_says_so():
    assert pick_weight_packing(FP16_WEIGHTS, torch.device("cpu")) == ("fp16", None)
    packing, note = pick_weight_packing(FP16_WEIGHTS, torch.device("cuda"))
    assert packing is None and "float32 instead" in note and note.count(".") == 1
    assert pick_weight_packing("float32", torch.device("cpu")) == (None, None)
    with pytest.raises(ValueError, match="cannot pack"):
        pick_packing("fp16", torch.bfloat16, torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown packing"):
        pick_packing("int3", torch.float32, torch.device("cpu"))


def test_the_setting_takes_float16_weights():
    settings, errors = Settings().update({"dtype": "float16-weights"})
    assert errors == [] and settings.dtype == FP16_WEIGHTS
    assert Settings().update({"dtype": "float8"})[1]  # and an unknown one is a sentence, not a crash


def test_lean_engines_over_one_model_keep_their_own_packing(cpu_tiny):
    fp16 = LeanLlama(cpu_tiny.model, 64, pack="fp16")
    exact = LeanLlama(cpu_tiny.model, 64)
    assert fp16.layers[0].qkv.packing == "fp16" and exact.layers[0].qkv.packing != "fp16"
    assert LeanLlama(cpu_tiny.model, 64, pack="fp16").layers is fp16.layers  # packed once per model


def test_the_bundled_gguf_model_loads_in_float16_weights_by_default(monkeypatch):
    """Where the CPU has no bf16 and the integer kernel does not build (else the faster of this and the gguf mode
    runs: test_mode_choice.py)."""
    from rest_lsp.engine import runmode
    from rest_lsp.kernels import quant_matmul
    from rest_lsp.engine.model import load_model

    monkeypatch.setattr(runmode, "native_bf16", lambda *a, **k: False)
    monkeypatch.setattr(quant_matmul, "available", lambda: False)
    loaded = load_model(None, "cpu")
    assert loaded.mode == FP16_WEIGHTS and loaded.dtype == torch.float32 and not loaded.notes
    assert Decoder(loaded).engine == "lean-fp16" and Decoder(loaded).mode == FP16_WEIGHTS
    assert Decoder(loaded, lean=False).mode == "float32"  # the transformers path runs the fp32 weights
    assert load_model(None, "cpu", "float32").mode == "float32"
