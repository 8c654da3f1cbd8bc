"""Prefill the person never waits for: warm-up while idle, a KV cache per document, a FIM prompt whose suffix
stays cached while typing. None of them may change an answer. Tiny random models; no sleeps: events and
conditions with generous timeouts."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from support import tiny_model
from support import greedy, wait_for
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from rest_lsp.service.completion import PREWARM_CHUNK, CompletionService
from rest_lsp.drafting.drafts import NoDrafts
from rest_lsp.engine.decoding import PREFILL_CHUNK, DecodeConfig, Decoder
from rest_lsp.service.document_caches import DocumentCaches
from rest_lsp.service.prompt import build_prompt, detect_fim
from rest_lsp.settings import Settings

QWEN_FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"]


def source(first: int, n: int) -> str:
    return "".join(f"def scale_{i}(value, factor={i}):\n    return value * factor + {i}\n\n"
                   for i in range(first, first + n))


def started(settings: Settings) -> CompletionService:
    svc = CompletionService(settings)
    svc.start([])
    assert svc.wait_ready(120), svc.load_error
    return svc


def prompt_ids(model_dir, before: str, after: str, fim: bool = False) -> list[int]:
    hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return build_prompt(hf, before, after, budget=1024, fim=detect_fim(hf) if fim else None).ids


def common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class HeldFirstPass:
    """Wraps the decoder's forward pass (its model, or its lean engine's forward): the first pass after `arm()` signals `started` and waits for
    `release`, so that a request can arrive while a warm-up chunk is being computed."""

    def __init__(self, model):
        self.model = model
        self.armed, self.started, self.release = False, threading.Event(), threading.Event()

    def arm(self) -> None:
        self.armed = True

    def __call__(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            self.started.set()
            assert self.release.wait(120), "the held pass was never released"
        return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def _hold(decoder) -> HeldFirstPass:
    """Hold the decoder's forward passes: our own engine's, or the transformers model's."""
    if decoder.lean is not None:
        held = decoder.lean.forward = HeldFirstPass(decoder.lean.forward)
    else:
        held = decoder.model = HeldFirstPass(decoder.model)
    return held


# -- 1. warm before asked -----------------------------------------------------------------------------------------


def test_a_request_arriving_during_a_warm_up_waits_at_most_the_chunk_in_flight(tiny_models):
    # no prefetch: it would run after the request, and this test counts the jobs the decoder runs
    svc = started(Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=6, debounce_ms=0,
                           index_workspace=False,
                           prefetch=False))
    held = _hold(svc._decoder)
    try:
        text = source(0, 40)
        at = text.index("def scale_30")
        ids = prompt_ids(tiny_models["random"], text[:at], text[at:])
        assert len(ids) - 1 > 4 * PREWARM_CHUNK  # a warm-up of several chunks
        # the user changed the text there: the worker warms the prompt a request there needs, held in chunk 1
        held.arm()
        svc.expect("mem://a.py", text, at)
        assert held.started.wait(60), "no warm-up began while the decoder was idle"
        at_arrival = svc.stats()["prewarm_chunks"]
        assert at_arrival == 1
        chunks_when_it_ran = []
        run = svc._requests._run

        def recorded(job):
            chunks_when_it_ran.append(svc.stats()["prewarm_chunks"])
            return run(job)

        svc._requests._run = recorded
        ticket = svc.submit("mem://a.py", text, at)
        held.release.set()
        c = ticket.future.result(60)
        # not one chunk begun after the request arrived: it waited for the one in flight only
        assert chunks_when_it_ran == [at_arrival]
        stats = svc.stats()
        assert stats["prewarm_tokens"] == PREWARM_CHUNK  # the chunk in flight was kept, and the request used it
        assert stats["prefill_tokens"] == len(ids) - 1 - PREWARM_CHUNK
        assert c is not None and c.text == greedy(tiny_models["random"], text[:at], text[at:], 6)
    finally:
        held.release.set()
        svc.close()


def test_an_idle_warm_up_leaves_the_next_request_nothing_to_prefill(tiny_models):
    svc = started(Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=6, debounce_ms=0,
                           index_workspace=False))
    try:
        text = source(0, 20)
        at = text.index("def scale_12") + len("def scale_12(val")
        ids = prompt_ids(tiny_models["random"], text[:at], text[at:])
        svc.expect("mem://b.py", text, at)
        wait_for(lambda: svc.stats()["prewarm_tokens"] == len(ids) - 1, what="the warm-up to finish")
        c = svc.submit("mem://b.py", text, at).future.result(60)
        assert svc.stats()["prefill_tokens"] == 0
        assert c is not None and c.text == greedy(tiny_models["random"], text[:at], text[at:], 6)
    finally:
        svc.close()


# -- 2. a KV cache per document -----------------------------------------------------------------------------------


# 1 MB holds this tiny model's cache of one document (one block of 512 rows: 256 KB); 1 KB would not
@pytest.mark.parametrize("cache_mb", [256, 1, 0])
def test_switching_back_to_a_document_prefills_only_what_changed(tiny_models, cache_mb):
    # no prefetch: one computed after A's answer would put more of A in its cache than A's prompt, by chance
    svc = started(Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=6, debounce_ms=0,
                           index_workspace=False,
                           document_cache_mb=cache_mb, prefetch=False))
    try:
        a, b = source(0, 12), source(100, 12).replace("value", "item")
        svc.submit("mem://a.py", a, len(a)).future.result(60)
        svc.submit("mem://b.py", b, len(b)).future.result(60)
        # back to A, one line added at its end
        a2 = a + "total = scale_3("
        before = svc.stats()["prefill_tokens"]
        c = svc.submit("mem://a.py", a2, len(a2)).future.result(60)
        computed = svc.stats()["prefill_tokens"] - before
        old, new = prompt_ids(tiny_models["random"], a, ""), prompt_ids(tiny_models["random"], a2, "")
        changed = len(new) - 1 - common_prefix(old, new)
        if cache_mb:
            assert computed == changed and svc.stats()["document_caches"] == 1
        else:  # no caches kept: A is prefilled again from the little it shares with B
            assert computed > len(new) // 2
        assert c is not None and c.text == greedy(tiny_models["random"], a2, "", 6)
    finally:
        svc.close()


def test_document_caches_keep_the_most_recent_within_the_memory_limit():
    decoder = Decoder(tiny_model("llama"))
    caches = DocumentCaches()
    prompts = {d: [(7 * i + n) % 97 for i in range(40)] for n, d in enumerate("abc")}
    decoder.prefill(prompts["a"])
    one = decoder.cache_bytes()
    assert one > 0
    for doc in "abc":
        caches.use(decoder, doc, limit_bytes=one)
        decoder.prefill(prompts[doc])
    assert caches.kept() == ["b"]  # "a" went first: only one other document's cache fits
    caches.use(decoder, "b", limit_bytes=one)
    assert decoder.prefill(prompts["b"]) == 0 and caches.kept() == ["c"]
    caches.use(decoder, "a", limit_bytes=one)
    assert decoder.prefill(prompts["a"]) == len(prompts["a"])  # evicted: a full prefill
    caches.use(decoder, "c", limit_bytes=0)  # a limit of 0 keeps nothing
    assert caches.kept() == []


# -- 3. a FIM layout that survives typing ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fim_model(tiny_models, tmp_path_factory):
    """A 2-layer Qwen2 with random weights and the default model's tokenizer plus Qwen's FIM tokens."""
    folder = tmp_path_factory.mktemp("qwen2-fim")
    tok = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": QWEN_FIM})
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_typing_in_a_fim_prompt_prefills_only_the_changed_tokens(fim_model, monkeypatch):
    calls = []  # (prompt, DecodeResult) of each generate call
    generate = Decoder.generate

    def recorded(decoder, prompt, *args, **kwargs):
        result = generate(decoder, prompt, *args, **kwargs)
        calls.append((list(prompt), result))
        return result

    monkeypatch.setattr(Decoder, "generate", recorded)
    # no prefetch: its decodes would sit between the keystrokes' and move the cache this test follows
    svc = started(Settings(dtype="float32", model=str(fim_model), max_new_tokens=5, debounce_ms=0,
                           index_workspace=False,
                           prefetch=False))
    try:
        assert svc.stats()["fim"] == "qwen"
        hf = AutoTokenizer.from_pretrained(str(fim_model), local_files_only=True)
        fim = detect_fim(hf)
        text = source(0, 30)
        at = text.index("    return value * factor + 14") + len("    return ")
        typed = "factor * value - 7"
        for n in range(len(typed) + 1):
            doc = text[:at] + typed[:n] + text[at:]
            svc.submit("mem://f.py", doc, at + n).future.result(60)
        assert len(calls) > len(typed) // 2  # the others were typed through: answered without decoding
        suffix_tokens = [len(p) - p.index(fim.suffix_id) for p, _ in calls]
        assert min(suffix_tokens) > 100  # what a hole at the cursor would prefill again at every keystroke
        for (old, _), (new, result) in zip(calls, calls[1:]):
            line_old, line_new = old[old.index(fim.middle_id):], new[new.index(fim.middle_id):]
            changed = len(line_new) - common_prefix(line_old, line_new)
            assert result.prefill_tokens <= changed + 1, (changed, result.prefill_tokens)
        # each completion is what plain greedy decoding writes after the same prompt
        model = AutoModelForCausalLM.from_pretrained(str(fim_model), dtype=torch.float32, local_files_only=True)
        for prompt, result in calls:
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=len(result.tokens), do_sample=False)[0, len(prompt):]
            assert out.tolist()[: len(result.tokens)] == result.tokens
    finally:
        svc.close()


def plain(loaded, prompt: list[int], n: int) -> list[int]:
    """The model's own greedy `generate`."""
    ids = torch.tensor([prompt])
    out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


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
    assert again.tokens == plain(loaded, prompt, 8)
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
    assert result.finish == "stopped" and result.steps == 3 and result.tokens == plain(loaded, prompt, 3)
