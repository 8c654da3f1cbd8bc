"""The quantized mode (q8: Q8_0 weights on rest-lsp's integer kernel, input rows quantized per block of 32).

Not fp32's numerics: the weights are Q8_0 blocks and each matmul's input is quantized per block. What it promises
is REST's own: a row's result does not depend on the rows beside it, so greedy REST output is what plain decoding
in the same mode writes, with any drafts.
"""


import pytest
import torch

from rest_lsp.kernels import levels, quant_matmul
from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.engine.lean_llama import LeanLlama
from test_exactness import assert_rest_is_plain_decoding, plain_tokens


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


def test_greedy_rest_equals_plain_decoding_in_the_quantized_mode(cpu_tiny):
    """Perfect, useless, partly right and branchy drafts, trees of 4-24 nodes (one to three tiles of rows):
    every step's accepted tokens are the ones a one-token step of the quantized mode picks."""
    decoder = Decoder(cpu_tiny, pack="q8")
    assert decoder.engine == "lean-q8" and decoder.lean.layers[0].qkv.packing == "q8"
    assert_rest_is_plain_decoding(decoder, cpu_tiny.model.config.vocab_size, budgets=(4, 16, 24))


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


def code_model_path():
    """The code model's GGUF (../shared/models/get_qwen_coder.sh puts it there), or a skip."""
    import os
    from pathlib import Path

    path = Path(os.environ.get("REST_LSP_CODE_MODEL") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                / "rest-lsp/models/qwen2.5-coder/qwen2.5-coder-0.5b-instruct.gguf")
    if not path.is_file():
        pytest.skip(f"no code model at {path} (../shared/models/get_qwen_coder.sh)")
    return path


@pytest.mark.slow
def test_the_code_models_q8_0_tensors_run_as_the_files_own_blocks_and_rest_equals_plain():
    """A real Q4_K_M GGUF (its Q8_0 tensors, among Q5_0, Q4_K, Q6_K ones) in the quantized mode: the Q8_0 tensors'
    panels hold the file's own blocks (what transformers dequantized quantizes back to them), the others are
    requantized to Q8_0; greedy REST writes what plain decoding writes."""
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    from rest_lsp.drafting.drafts import ContextLookup, NgramDrafts
    from rest_lsp.engine.model import LoadedModel

    path = code_model_path()
    if not quant_matmul.available():
        pytest.skip("no C compiler here builds the quantized kernel")
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 local_files_only=True).eval()
    loaded = LoadedModel(model=model, tokenizer=None, device=torch.device("cpu"), dtype=torch.float32, name="code")
    decoder = Decoder(loaded, pack="q8")
    v = tensors["blk.0.attn_v.weight"]
    assert v.tensor_type.name == "Q8_0"
    qkv = decoder.lean.layers[0].qkv.panels  # rows: 896 query, 128 key, 128 value: the value rows are panels 64..71
    own = quant_matmul.pack_blocks(*quant_matmul.from_gguf_q8_0(torch.from_numpy(v.data.copy()), 896))
    assert torch.equal(qkv[64:72], own)
    prompt = list(range(1000, 1040)) * 3 + [198, 750, 912]
    truth = plain_tokens(decoder, prompt, 24)
    for source in (ContextLookup(), NgramDrafts([prompt + truth])):
        assert decoder.generate(prompt, source, DecodeConfig(max_new_tokens=24, budget=16)).tokens == truth


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
    monkeypatch.setattr(quant_matmul.KERNEL, "_libraries", dict.fromkeys(levels.LEVELS))  # no kernel here
    mode = runmode.decide("cpu", "q8_0")
    assert mode.dtype == torch.float32 and mode.packing != "q8" and "float32 instead" in mode.notes[0]


def test_the_quantized_mode_is_named_in_what_the_decoder_reports(cpu_tiny):
    decoder = Decoder(cpu_tiny, pack="q8")
    assert decoder.mode == "q8_0" and decoder.run.head_batch == 12
