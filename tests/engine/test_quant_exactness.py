"""The quantized mode (q8: Q8_0 weights on rest-lsp's integer kernel, input rows quantized per block of 32).

Not fp32's numerics: the weights are Q8_0 blocks and each matmul's input is quantized per block. What it promises
is REST's own: a row's result does not depend on the rows beside it, so greedy REST output is what plain decoding
in the same mode writes, with any drafts.
"""

import random

import pytest
import torch

from rest_lsp.engine import quant_matmul
from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.engine.lean_llama import LeanLlama
from test_exactness import N_NEW, draft_sources


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REST_LSP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture()
def cpu_tiny(tiny):
    if tiny.device.type != "cpu":
        pytest.skip("the quantized mode runs on a CPU")
    if not quant_matmul.available():
        pytest.skip("no C compiler here builds the quantized kernel")
    return tiny


def plain(decoder, prompt, n=N_NEW):
    from rest_lsp.drafting.drafts import NoDrafts

    return decoder.generate(prompt, NoDrafts(), DecodeConfig(max_new_tokens=n, budget=0)).tokens


def test_greedy_rest_equals_plain_decoding_in_the_quantized_mode(cpu_tiny):
    """Perfect, useless, partly right and branchy drafts, trees of 4-24 nodes (one to three tiles of rows):
    every step's accepted tokens are the ones a one-token step of the quantized mode picks."""
    decoder = Decoder(cpu_tiny, pack="q8")
    assert decoder.engine == "lean-q8" and decoder.lean.layers[0].qkv.packing == "q8"
    vocab = cpu_tiny.model.config.vocab_size
    for seed in range(3):
        rnd = random.Random(seed)
        prompt = [rnd.randrange(vocab) for _ in range(rnd.randrange(5, 30))]
        truth = plain(decoder, prompt)
        sources = draft_sources(prompt, truth, vocab, rnd)
        for name in ("perfect", "useless", "partly", "branchy", "all"):
            for budget in (4, 16, 24):
                result = decoder.generate(prompt, sources[name], DecodeConfig(max_new_tokens=N_NEW, budget=budget,
                                                                              fit_to_cost=False))
                assert result.tokens == truth, (name, seed, budget)
        assert decoder.generate(prompt, sources["perfect"], DecodeConfig(max_new_tokens=N_NEW, budget=16,
                                                                         fit_to_cost=False)).tokens_per_step > 3


def test_the_quantized_step_is_the_q8_0_product_of_the_models_weights(cpu_tiny):
    """Its logits are the fp32 model's to within Q8_0's rounding, and not equal to them (the weights did round)."""
    exact, quant = Decoder(cpu_tiny), Decoder(cpu_tiny, pack="q8")
    ids = torch.tensor([3, 14, 15, 92, 65, 35])
    pos = torch.arange(6)
    a = quant.logits(quant.lean.forward(ids, pos, quant.lean.new_cache()))
    b = exact.logits(exact.lean.forward(ids, pos, exact.lean.new_cache()))
    assert 0 < (a - b).abs().max() < 0.05 * b.abs().max()


def test_lean_engines_over_one_model_keep_their_own_packing(cpu_tiny):
    q8 = LeanLlama(cpu_tiny.model, 64, pack="q8")
    exact = LeanLlama(cpu_tiny.model, 64)
    assert q8.layers[0].qkv.packing == "q8" and exact.layers[0].qkv.packing != "q8"
    assert q8.head.packing == "q8" and q8.score_scale == q8.head_dim**-0.5  # the query blocks stay as they are
    assert LeanLlama(cpu_tiny.model, 64, pack="q8").layers is q8.layers  # packed once per model


def test_dtype_q8_0_loads_the_quantized_mode_and_elsewhere_says_why_not(monkeypatch):
    from rest_lsp.engine import runmode

    if not quant_matmul.available():
        pytest.skip("no C compiler here builds the quantized kernel")
    mode = runmode.decide("cpu", runmode.Q8_WEIGHTS, gguf=True)
    assert (mode.packing, mode.dtype, mode.name, mode.notes) == ("q8", torch.float32, "q8_0", ())
    assert (mode.head_batch, mode.miss_rows) == (12, 4) and mode.step_cost == runmode.PACKINGS["q8"].step_cost
    assert runmode.pick_weight_packing("q8_0", torch.device("cpu")) == ("q8", None)
    assert runmode.decide("cpu", None, gguf=True).packing != "q8"  # never the default: not the exact mode
    packing, note = runmode.pick_weight_packing("q8_0", torch.device("cuda"))
    assert packing is None and "float32 instead" in note
    monkeypatch.setattr(quant_matmul, "_libraries", {quant_matmul.NATIVE: None})  # no kernel here
    mode = runmode.decide("cpu", "q8_0")
    assert mode.dtype == torch.float32 and mode.packing != "q8" and "float32 instead" in mode.notes[0]


def test_the_quantized_mode_is_named_in_what_the_decoder_reports(cpu_tiny):
    decoder = Decoder(cpu_tiny, pack="q8")
    assert decoder.mode == "q8_0" and decoder.run.head_batch == 12
