"""Regression tests of issue 13's engine items: sliding windows, long RoPE, failed passes, out-of-vocabulary drafts,
interruptible prefills, model loading edges and the CLI's sampling checks. Tiny random models, no download."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from conftest import tiny_folder, tiny_model
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from rest_lsp.engine.decoding import PREFILL_CHUNK, DecodeConfig, Decoder
from rest_lsp.drafting.drafts import ContextLookup, NgramDrafts, NoDrafts
from rest_lsp.engine.lean_llama import LeanLlama
from rest_lsp.engine.model import LoadedModel

WINDOW = 16


def _loaded(model) -> LoadedModel:
    return LoadedModel(model=model.eval(), tokenizer=None, device=torch.device("cpu"), dtype=torch.float32,
                       name=type(model).__name__)


def _reference(loaded: LoadedModel, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _sliding(arch: str) -> LoadedModel:
    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None, sliding_window=WINDOW)
    if arch == "mistral":
        return _loaded(MistralForCausalLM(MistralConfig(**common)))
    # Qwen2: layer 0 full attention, layer 1 windowed
    return _loaded(Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=True, max_window_layers=1)))


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_sliding_window_models_decode_like_generate_past_the_window(arch):
    loaded = _sliding(arch)
    rnd = random.Random(0)
    decoder = Decoder(loaded)  # one decoder for all: its cache is reused and cropped across prompts
    for plen, perfect in ((40, False), (40, True), (9, True), (30, True)):
        prompt = [rnd.randrange(97) for _ in range(plen)]
        truth = _reference(loaded, prompt, 24)
        drafts = NgramDrafts([prompt + truth]) if perfect else NoDrafts()
        got = decoder.generate(prompt, drafts, DecodeConfig(max_new_tokens=24, budget=6, fit_to_cost=False))
        assert got.tokens == truth, (arch, plen, perfect)
    # a prompt that shares a prefix with the last sequence reuses the cache past the window
    prompt = prompt + truth[:10]
    assert decoder.generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=12, budget=6)).tokens == \
        _reference(loaded, prompt, 12)


ROPE_SWITCH = 32


def _longrope() -> LoadedModel:
    torch.manual_seed(0)
    half = 64 // 4 // 2
    config = Phi3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        original_max_position_embeddings=ROPE_SWITCH, bos_token_id=None, eos_token_id=None,
                        pad_token_id=None, sliding_window=None,
                        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * half,
                                         "long_factor": [float(4 + i) for i in range(half)],
                                         "original_max_position_embeddings": ROPE_SWITCH})
    model = Phi3ForCausalLM(config)
    with torch.no_grad():  # sharp logits and attention, so that a wrong rotation changes the argmax
        model.lm_head.weight.mul_(4.0)
        for layer in model.model.layers:
            layer.self_attn.qkv_proj.weight[: 2 * 64].mul_(6.0)
    return _loaded(model)


def test_long_rope_models_decode_like_generate_across_the_switch():
    loaded = _longrope()
    rnd = random.Random(0)
    decoder = Decoder(loaded)
    for plen in (20, 26, 31, 32, 33, 40, 12):  # below, at and past the switch, then back below on the same cache
        prompt = [rnd.randrange(97) for _ in range(plen)]
        truth = _reference(loaded, prompt, 20)
        for drafts in (NoDrafts(), NgramDrafts([prompt + truth])):
            got = decoder.generate(prompt, drafts, DecodeConfig(max_new_tokens=20, budget=8, fit_to_cost=False))
            assert got.tokens == truth, (plen, type(drafts).__name__)


class _FakeOOM(RuntimeError):
    pass


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers"])
def test_a_pass_that_fails_in_a_middle_layer_leaves_the_decoder_exact(lean, monkeypatch):
    torch.manual_seed(0)
    loaded = _loaded(LlamaForCausalLM(LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=None)))
    armed = []

    def fail_once(module, args):
        if armed and args[0].shape[1] > 1:  # a tree, like an out-of-memory on the biggest step
            armed.clear()
            raise _FakeOOM("out of memory (simulated in layer 2)")

    loaded.model.model.layers[2].register_forward_pre_hook(fail_once)
    rnd = random.Random(0)
    prompt = [rnd.randrange(97) for _ in range(30)]
    truth = _reference(loaded, prompt, 20)
    decoder = Decoder(loaded, lean=lean)
    if lean:  # our own layers, run in Python (where a hook can fail one): fail in layer 2, on trees only
        decoder.lean = LeanLlama(loaded.model, decoder.max_context, script=False)

        def fail_once_lean(module, args):
            if armed and args[0].shape[0] > 1:  # x [n, H]
                armed.clear()
                raise _FakeOOM("out of memory (simulated in layer 2)")

        decoder.lean.layers[2].register_forward_pre_hook(fail_once_lean)
    decoder.generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=4, budget=8))  # a warm cache
    armed.append(1)
    with pytest.raises(_FakeOOM):
        decoder.generate(prompt, NgramDrafts([prompt + truth]), DecodeConfig(max_new_tokens=20, budget=8,
                                                                              fit_to_cost=False))
    if lean:
        assert decoder._cache.length == len(decoder._cached)
    else:
        lengths = {layer.get_seq_length() for layer in decoder._cache.layers}
        assert lengths == {len(decoder._cached)}, lengths
    for p in (prompt, prompt[:25] + [1, 2], prompt + truth[:3]):
        assert decoder.generate(p, ContextLookup(), DecodeConfig(max_new_tokens=12, budget=8)).tokens == \
            _reference(loaded, p, 12)


def test_crop_cuts_every_layer_to_the_kept_length():
    loaded = tiny_model("llama")
    decoder = Decoder(loaded, lean=False)  # the DynamicCache path: layers can differ in length
    prompt = list(range(3, 40))
    decoder.prefill(prompt)
    first = decoder._cache.layers[0]  # layer 0 alone got 5 more rows, as after a pass failing in layer 1
    first.keys = torch.cat([first.keys, first.keys[:, :, :5]], dim=2)
    first.values = torch.cat([first.values, first.values[:, :, :5]], dim=2)
    decoder.prefill(prompt[:20] + [1, 2, 3])
    assert [layer.get_seq_length() for layer in decoder._cache.layers] == [23, 23]
    p = prompt[:20] + [1, 2, 3, 4]
    assert decoder.generate(p, NoDrafts(), DecodeConfig(max_new_tokens=8, budget=0)).tokens == \
        _reference(loaded, p, 8)


def test_draft_ids_outside_the_vocabulary_are_dropped():
    loaded = tiny_model("llama")  # 97 tokens
    prompt = [5, 6, 7, 8]
    truth = _reference(loaded, prompt, 12)
    bad = NgramDrafts([prompt + [97, 150, 3], prompt + truth[:2] + [-1, 4000]])  # a datastore of another tokenizer
    got = Decoder(loaded).generate(prompt, bad, DecodeConfig(max_new_tokens=12, budget=8, fit_to_cost=False))
    assert got.tokens == truth


def test_the_prefill_stops_between_chunks_when_cancelled():
    loaded = tiny_model("llama", max_positions=1024)
    decoder = Decoder(loaded)
    prompt = [random.Random(1).randrange(97) for _ in range(2 * PREFILL_CHUNK + 40)]
    asked = []

    def cancelled() -> bool:
        asked.append(1)
        return len(asked) > 1  # the request is cancelled while the first chunk runs

    result = decoder.generate(prompt, NoDrafts(), DecodeConfig(max_new_tokens=8, budget=0), cancelled=cancelled)
    assert result.finish == "stopped" and result.tokens == [] and result.steps == 0
    assert len(decoder._cached) == PREFILL_CHUNK
    # the next request goes on from the chunk already computed, and is exact
    again = decoder.generate(prompt, NoDrafts(), DecodeConfig(max_new_tokens=8, budget=0))
    assert again.tokens == _reference(loaded, prompt, 8)
    assert again.prefill_tokens == len(prompt) - 1 - PREFILL_CHUNK


def test_a_cancel_during_a_short_prefill_stops_before_the_first_step_and_between_steps():
    loaded = tiny_model("llama", max_positions=1024)
    decoder = Decoder(loaded)
    prompt = [5, 6, 7, 8, 9] * 16  # longer than CHAIN_TAIL: prefilled in a pass of its own, not with the first step
    checks = []

    def during_the_prefill() -> bool:  # asked once before the prompt's only chunk, cancelled while it runs
        checks.append(1)
        return len(checks) > 1

    result = decoder.generate(prompt, NoDrafts(), DecodeConfig(max_new_tokens=8, budget=0),
                              cancelled=during_the_prefill)
    assert result.finish == "stopped" and result.tokens == [] and result.steps == 0
    assert len(decoder._cached) == len(prompt) - 1  # the prefill was whole: the next request goes on from it
    asked = []

    def after_three() -> bool:  # asked before each step (the prompt is cached: no prefill chunk asks)
        asked.append(1)
        return len(asked) > 3

    result = decoder.generate(prompt, NoDrafts(), DecodeConfig(max_new_tokens=8, budget=0), cancelled=after_three)
    assert result.finish == "stopped" and result.steps == 3 and result.tokens == _reference(loaded, prompt, 3)


# -- model loading ------------------------------------------------------------------------------------------------


@pytest.fixture
def model_module(tmp_path, monkeypatch):
    import rest_lsp.engine.model as module

    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    return module


def _fake_gguf(tmp_path: Path, module, monkeypatch, name="m.gguf") -> tuple[str, list]:
    """A .gguf path whose 'conversion' loads a tiny model folder; returns (path, list of conversions)."""
    source = tiny_folder(tmp_path / "source")
    (tmp_path / "g").mkdir()
    gguf = tmp_path / "g" / name
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    conversions = []
    real = module._from_pretrained

    def convert(folder, gguf_file, dtype):
        if gguf_file:
            conversions.append(gguf_file)
            return real(str(source), None, dtype)
        return real(folder, gguf_file, dtype)

    monkeypatch.setattr(module, "_from_pretrained", convert)
    return str(gguf), conversions


def test_corrupt_weights_give_a_model_load_error(tmp_path, model_module):
    folder = tiny_folder(tmp_path / "m")
    next(folder.glob("*.safetensors")).write_bytes(b"\0" * 100)
    with pytest.raises(model_module.ModelLoadError, match="Could not load model"):
        model_module.load_model(str(folder), "cpu", "float32")


def test_a_damaged_conversion_folder_is_repaired(tmp_path, model_module, monkeypatch):
    gguf, conversions = _fake_gguf(tmp_path, model_module, monkeypatch)
    cached = model_module._gguf_cache_dir(str(Path(gguf).parent), Path(gguf).name)
    cached.mkdir(parents=True)
    (cached / "leftover.bin").write_bytes(b"x")  # an interrupted copy: no config.json
    model_module.load_model(gguf, "cpu", "float32")
    model_module.load_model(gguf, "cpu", "float32")
    assert conversions == ["m.gguf"] and (cached / "config.json").is_file()


def test_a_failed_save_leaves_no_temporary_folder(tmp_path, model_module, monkeypatch):
    gguf, _ = _fake_gguf(tmp_path, model_module, monkeypatch)

    def refuse(self, *args, **kwargs):
        raise ValueError("cannot serialize this model")

    monkeypatch.setattr(LlamaForCausalLM, "save_pretrained", refuse)
    model_module.load_model(gguf, "cpu", "float32")  # still loads: only the cache is lost
    models = tmp_path / "cache" / "models"
    assert not [p.name for p in models.iterdir() if p.name.startswith(".tmp-")]


def test_an_uppercase_gguf_suffix_is_a_gguf_file(tmp_path, model_module):
    (tmp_path / "M.GGUF").write_bytes(b"GGUF")
    assert model_module._resolve(str(tmp_path / "M.GGUF")) == (str(tmp_path), "M.GGUF")


def test_load_tokenizer_rebuilds_a_corrupt_cached_tokenizer(tmp_path, model_module):
    from rest_lsp.engine.model import DEFAULT_MODEL

    if not DEFAULT_MODEL:
        pytest.skip("the default model is not installed")
    gguf = Path(DEFAULT_MODEL)
    cached = model_module._gguf_cache_dir(str(gguf.parent), gguf.name)
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")  # a conversion whose tokenizer files alone are damaged
    (cached / "tokenizer_config.json").write_text("{oops")
    (cached / "tokenizer.json").write_text("{oops")
    tok = model_module.load_tokenizer(DEFAULT_MODEL)
    assert tok.encode("def add(a, b):")
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(cached), local_files_only=True)("x")["input_ids"]  # repaired


@pytest.mark.parametrize("temperature", ["1e-40", "nan", "inf", "-1"])
def test_generate_refuses_temperatures_that_break_sampling(tmp_path, capsys, temperature):
    from rest_lsp.cli import main

    prompt = tmp_path / "p.txt"
    prompt.write_text("def add(a, b):\n")
    assert main(["generate", str(prompt), "--model", str(tmp_path / "never-loaded"),
                 f"--temperature={temperature}"]) == 2
    err = capsys.readouterr().err
    assert "--temperature must be 0 (greedy) or from" in err and "Traceback" not in err
