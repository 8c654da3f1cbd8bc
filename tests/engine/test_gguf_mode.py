"""The gguf mode (`--dtype gguf`): a .gguf's own Q8_0, Q5_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K blocks on rest-lsp's
integer kernel (panels of each format), its other tensors requantized to Q8_0.

A tiny GGUF is written here (gguf's GGUFWriter, from the tiny random models) with tensors of every kind: Q5_0, Q8_0
and Q4_0 blocks, a fused q/k/v whose parts differ in width, an F16 tensor, llama's permuted q/k rows, a tied and an
untied LM head; and one of K-quant and Q4_1 blocks (random raw blocks: gguf-py writes no K-quants). Loaded with
`--dtype gguf`, every block tensor runs on the file's blocks exactly as they are, and greedy REST writes what plain
decoding in the same mode writes, with any drafts.
"""

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from support import tiny_model
from test_exactness import assert_rest_is_plain_decoding, plain_tokens

from rest_lsp.engine import gguf_blocks, runmode
from rest_lsp.kernels import levels, quant_matmul
from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.engine.lean_llama import LeanLlama
from rest_lsp.engine.matmuls import GgufMatmul
from rest_lsp.errors import ModelLoadError

# each module's GGUF tensor type: (layer, name) first, then name; layer 0's v is Q8_0 and layer 1's Q5_0 (the
# fused q/k/v runs as two parts in layer 0, one in layer 1), layer 0's down an F16 tensor (requantized to Q8_0)
TYPES = {"attn_q": "Q5_0", "attn_k": "Q5_0", (0, "attn_v"): "Q8_0", (1, "attn_v"): "Q5_0", "attn_output": "Q4_0",
         "ffn_gate": "Q5_0", "ffn_up": "Q5_0", (0, "ffn_down"): "F16", (1, "ffn_down"): "Q4_0",
         "token_embd": "Q4_0", "output": "Q8_0"}
MODULES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj"}


def llama_permuted(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf order of a q or k weight's rows (transformers undoes it on load)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, arch: str, tied: bool) -> Path:
    """A tiny model of `arch` as a .gguf of the TYPES above (no output.weight where `tied`), with a small BPE
    tokenizer, as llama.cpp's converter lays one out."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    model = tiny_model(arch).model
    cfg = model.config
    state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    tokens = [chr(33 + i) for i in range(cfg.vocab_size - 3)] + ["ab", "cd", "ef"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(["a b", "c d", "e f"])

    def put(name: str, array: np.ndarray, kind: str = "F32") -> None:
        if kind in ("F32", "F16"):
            writer.add_tensor(name, array.astype(np.float32 if kind == "F32" else np.float16))
        else:
            kind = GGMLQuantizationType[kind]
            writer.add_tensor(name, quantize(array.astype(np.float32), kind), raw_dtype=kind)

    put("token_embd.weight", state["model.embed_tokens.weight"], TYPES["token_embd"])
    put("output_norm.weight", state["model.norm.weight"])
    if not tied:
        put("output.weight", state["lm_head.weight"], TYPES["output"])
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", state[prefix + "input_layernorm.weight"])
        put(f"blk.{i}.ffn_norm.weight", state[prefix + "post_attention_layernorm.weight"])
        for name, module in MODULES.items():
            w = state[prefix + module + ".weight"]
            if arch == "llama" and name in ("attn_q", "attn_k"):
                w = llama_permuted(w, cfg.num_attention_heads if name == "attn_q" else cfg.num_key_value_heads)
            put(f"blk.{i}.{name}.weight", w, TYPES.get((i, name), TYPES.get(name)))
            if prefix + module + ".bias" in state:
                put(f"blk.{i}.{name}.bias", state[prefix + module + ".bias"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REST_LSP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def needs_kernel():
    if not quant_matmul.available():
        pytest.skip("no C compiler here builds the quantized kernel")


# llama: permuted q/k rows, an untied head (output.weight, Q8_0); qwen2: q/k/v biases, the head tied to token_embd
@pytest.fixture(scope="module", params=[("llama", False), ("qwen2", True)], ids=["llama-untied", "qwen2-tied"])
def tiny_gguf(request, tmp_path_factory) -> Path:
    arch, tied = request.param
    return write_gguf(tmp_path_factory.mktemp("gguf") / f"tiny-{arch}.gguf", arch, tied)


@pytest.fixture(scope="module")
def gguf_decoder(tiny_gguf):
    from rest_lsp.engine.model import load_model

    needs_kernel()
    loaded = load_model(str(tiny_gguf), "cpu", "gguf")
    return Decoder(loaded)


def widths(mm) -> list[tuple[int, int]]:
    assert isinstance(mm, GgufMatmul)
    return [(part.bits, part.out_features) for part in mm.parts]


def test_dtype_gguf_runs_each_tensor_on_its_own_blocks(gguf_decoder, tiny_gguf):
    """Q5_0, Q8_0 and Q4_0 tensors keep their blocks (5, 8, 4-bit panels), the F16 one is requantized to Q8_0; each
    block tensor's panels are its file blocks repacked, and those blocks dequantize to the loaded weight exactly."""
    from gguf import GGUFReader

    d = gguf_decoder
    assert (d.mode, d.engine, d.run.packing) == ("gguf", "lean-gguf", "gguf")
    row = runmode.PACKINGS["gguf"]
    assert d.run.step_cost == row.step_cost and d.run.step_cost != runmode.PACKINGS["q8"].step_cost
    assert (d.run.head_batch, d.run.miss_rows) == (row.head_batch, row.miss_rows)
    assert d.lean.score_scale == d.lean.head_dim**-0.5  # the query blocks stay as they are
    cfg = d.model.config
    q_rows, kv_rows, ffn = cfg.hidden_size, cfg.num_key_value_heads * d.lean.head_dim, cfg.intermediate_size
    layers = d.lean.layers
    assert widths(layers[0].qkv) == [(5, q_rows + kv_rows), (8, kv_rows)]  # Q5_0 q and k, Q8_0 v
    assert widths(layers[1].qkv) == [(5, q_rows + 2 * kv_rows)]
    assert widths(layers[0].o) == widths(layers[1].o) == [(4, cfg.hidden_size)]
    assert widths(layers[0].gate_up) == [(5, 2 * ffn)]
    assert widths(layers[0].down) == [(8, cfg.hidden_size)] and widths(layers[1].down) == [(4, cfg.hidden_size)]
    tied = cfg.tie_word_embeddings
    assert widths(d.lean.head) == [(4 if tied else 8, cfg.vocab_size)]  # token_embd (Q4_0) or output (Q8_0)

    from transformers import AutoModelForCausalLM

    assert type(d.model).__name__ == "GgufModel"  # loaded from the blocks: the weights below come from transformers
    hf = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32,
                                              local_files_only=True)
    tensors = {t.name: t for t in GGUFReader(tiny_gguf).tensors}
    arch = cfg.model_type
    for i, layer in enumerate(hf.model.layers):
        for name, module in MODULES.items():
            tensor = tensors[f"blk.{i}.{name}.weight"]
            if tensor.tensor_type.name not in gguf_blocks.BITS:
                continue
            weight = layer.get_submodule(module).weight
            blocks = gguf_blocks.decode(tensor.data, tensor.tensor_type.name, weight.shape[1])
            if arch == "llama" and name in ("attn_q", "attn_k"):
                assert not torch.equal(blocks.dequantized(), weight)  # stored permuted
                blocks = gguf_blocks.llama_rows(blocks, cfg.num_attention_heads if name == "attn_q"
                                                else cfg.num_key_value_heads)
            assert torch.equal(blocks.dequantized(), weight), (i, name)  # lossless: d x q is the loaded weight
    # the panels are those blocks, repacked: layer 1's q, k, v (all Q5_0) and its down (Q4_0)
    blocks = []
    for name in ("attn_q", "attn_k", "attn_v"):
        tensor = tensors[f"blk.1.{name}.weight"]
        found = gguf_blocks.decode(tensor.data, "Q5_0", cfg.hidden_size)
        if arch == "llama" and name != "attn_v":
            found = gguf_blocks.llama_rows(found, cfg.num_attention_heads if name == "attn_q"
                                           else cfg.num_key_value_heads)
        blocks.append(found)
    want = quant_matmul.pack_blocks(torch.cat([b.quants for b in blocks]), torch.cat([b.scales for b in blocks]), 5)
    assert torch.equal(layers[1].qkv.parts[0].panels, want)
    down = gguf_blocks.decode(tensors["blk.1.ffn_down.weight"].data, "Q4_0", ffn)
    assert torch.equal(layers[1].down.parts[0].panels, quant_matmul.pack_blocks(down.quants, down.scales, 4))


def test_greedy_rest_equals_plain_decoding_in_the_gguf_mode(gguf_decoder):
    """Perfect, useless, partly right and branchy drafts, trees of 4-16 nodes (one and two tiles of rows): every
    step's accepted tokens are the ones a one-token step of the gguf mode picks."""
    assert_rest_is_plain_decoding(gguf_decoder, gguf_decoder.vocab_size, budgets=(4, 16))


def test_the_gguf_step_is_close_to_the_fp32_one(gguf_decoder, tiny_gguf):
    """Its logits are the fp32 model's (the same dequantized weights) to within the input rows' quantization."""
    from rest_lsp.engine.model import load_model

    exact = Decoder(load_model(str(tiny_gguf), "cpu", "float32"))  # the machine's fp32 packing
    ids, pos = torch.tensor([3, 14, 15, 92, 65, 35]), torch.arange(6)
    a = gguf_decoder.logits(gguf_decoder.lean.forward(ids, pos, gguf_decoder.lean.new_cache()))
    b = exact.logits(exact.lean.forward(ids, pos, exact.lean.new_cache()))
    assert 0 < (a - b).abs().max() < 0.05 * b.abs().max()


def test_blocks_that_do_not_match_the_loaded_weight_are_requantized_and_said_once(tiny_gguf, caplog):
    from transformers import AutoModelForCausalLM

    needs_kernel()
    model = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32,
                                                 local_files_only=True).eval()
    gguf_blocks.attach(model, tiny_gguf)
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight[0, 0] += 1e-3  # no longer the file's d x q
    with caplog.at_level(logging.INFO, logger="rest_lsp.engine.gguf_blocks"):
        lean = LeanLlama(model, 64, pack="gguf")
    assert widths(lean.layers[1].o) == [(8, model.config.hidden_size)] and widths(lean.layers[0].o)[0][0] == 4
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "blk.1.attn_output.weight" in warnings[0].getMessage()


def test_a_model_that_is_not_a_gguf_is_refused(tmp_path):
    from support import tiny_folder

    from rest_lsp.engine.model import load_model

    needs_kernel()
    with pytest.raises(ModelLoadError, match="not a .gguf file") as err:
        load_model(str(tiny_folder(tmp_path / "m")), "cpu", "gguf")
    assert ". " not in str(err.value) and str(err.value).endswith(".")  # one sentence
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        runmode.decide("cpu", runmode.GGUF_WEIGHTS, gguf=False)
    with pytest.raises(ValueError, match="not loaded from one"):
        LeanLlama(tiny_model("qwen2").model, 64, pack="gguf")


def test_dtype_gguf_on_a_model_the_lean_engine_does_not_run_says_so(tmp_path, caplog):
    """A Qwen3 .gguf (q and k norms: not a model the lean engine runs) asked for in the gguf mode runs float32 on
    transformers' path, and one sentence says so."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from rest_lsp.engine.model import load_model

    needs_kernel()
    path, rng = tmp_path / "tiny-qwen3.gguf", np.random.default_rng(0)
    w = GGUFWriter(str(path), "qwen3")
    hidden, ffn, heads, kv, hd, vocab = 64, 128, 4, 2, 128, 97  # transformers' Qwen3 head width: 128
    for add, value in ((w.add_block_count, 1), (w.add_context_length, 256), (w.add_embedding_length, hidden),
                       (w.add_feed_forward_length, ffn), (w.add_head_count, heads), (w.add_head_count_kv, kv),
                       (w.add_layer_norm_rms_eps, 1e-6)):
        add(value)
    tokens = [chr(33 + i) for i in range(vocab - 3)] + ["ab", "cd", "ef"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * vocab)
    w.add_token_merges(["a b", "c d", "e f"])
    w.add_eos_token_id(0)
    shapes = {"token_embd": (vocab, hidden), "output_norm": (hidden,), "output": (vocab, hidden),
              "blk.0.attn_norm": (hidden,), "blk.0.ffn_norm": (hidden,), "blk.0.attn_q": (heads * hd, hidden),
              "blk.0.attn_k": (kv * hd, hidden), "blk.0.attn_v": (kv * hd, hidden),
              "blk.0.attn_output": (hidden, heads * hd), "blk.0.attn_q_norm": (hd,), "blk.0.attn_k_norm": (hd,),
              "blk.0.ffn_gate": (ffn, hidden), "blk.0.ffn_up": (ffn, hidden), "blk.0.ffn_down": (hidden, ffn)}
    for name, shape in shapes.items():
        a = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if len(shape) == 2:
            w.add_tensor(f"{name}.weight", quantize(a, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(f"{name}.weight", np.ones(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with caplog.at_level(logging.WARNING):
        loaded = load_model(str(path), "cpu", "gguf")
    said = [r.getMessage() for r in caplog.records if "lean engine" in r.getMessage()]
    assert len(said) == 1 and "does not run this model (model type 'qwen3')" in said[0]
    assert "float32 on transformers' path" in said[0] and said[0] in loaded.notes
    assert Decoder(loaded).mode == "float32"


def test_dtype_gguf_is_a_mode_of_its_own_named_gguf(monkeypatch):
    """The run mode, its name and cost row; on a machine without the kernel, fp32 with a sentence that says so."""
    from rest_lsp.settings import Settings

    needs_kernel()
    mode = runmode.decide("cpu", runmode.GGUF_WEIGHTS, gguf=True)
    assert (mode.packing, mode.dtype, mode.name, mode.notes) == ("gguf", torch.float32, "gguf", ())
    assert mode.step_cost == runmode.PACKINGS["gguf"].step_cost and mode.head_batch == 12
    assert runmode.mode_name(torch.float32, "gguf") == "gguf"
    assert Settings().update({"dtype": "gguf"})[1] == []
    monkeypatch.setattr(quant_matmul.KERNEL, "_libraries", dict.fromkeys(levels.LEVELS))  # no kernel here
    mode = runmode.decide("cpu", "gguf", gguf=True)
    assert mode.dtype == torch.float32 and mode.packing != "gguf" and "float32 instead" in mode.notes[0]


def test_gguf_blocks_decode_as_gguf_dequantizes():
    """Q8_0, Q5_0, Q4_0 and Q4_1 blocks as gguf-py quantizes a weight -> blocks whose formula is gguf-py's
    (transformers') dequantization."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((48, 96)) * 0.05).astype(np.float32)
    for kind in ("Q8_0", "Q5_0", "Q4_0", "Q4_1"):
        bits = gguf_blocks.BITS[kind]
        raw = quantize(weight, GGMLQuantizationType[kind])
        blocks = gguf_blocks.decode(raw, kind, 96)
        assert blocks.bits == bits and blocks.quants.shape == (48, 3, 32)
        off = quant_matmul.OFFSETS[bits]
        assert -off <= int(blocks.quants.min()) and int(blocks.quants.max()) < (1 << quant_matmul.WIDTHS[bits]) - off
        assert torch.equal(blocks.dequantized(), torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind])))


def test_every_kept_kind_decodes_as_gguf_dequantizes_its_raw_blocks():
    """Random raw blocks of every kept type (every quant, 6-bit scale and min bit pattern; gguf-py writes no
    K-quants) -> Blocks whose formula, computed as gguf-py computes it, is gguf-py's (transformers') dequantization
    bit for bit, their quants in the range of their panels."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from gguf_writer import random_raw

    for kind, bits in gguf_blocks.BITS.items():
        raw = random_raw(kind, 40, 512, seed=bits)
        blocks = gguf_blocks.decode(raw, kind, 512)
        assert blocks.bits == bits and blocks.quants.shape == (40, 16, 32), kind
        off, width = quant_matmul.OFFSETS[bits], quant_matmul.WIDTHS[bits]
        assert int(blocks.quants.min()) == -off and int(blocks.quants.max()) == (1 << width) - off - 1, kind
        assert torch.equal(blocks.dequantized(), torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind]))), kind
        quant_matmul.pack_blocks(**blocks.fields(), bits=bits)  # in range for its panels


def transformers_model(path: Path):
    """The .gguf as transformers loads it: fp32 weights, dequantized by gguf-py."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                local_files_only=True).eval()


# each module's type in a file of K-quant and Q4_1 blocks (K a multiple of 256): a fused q/k/v of Q4_K and Q6_K,
# a gate/up of Q4_K and Q4_1, Q5_K o, Q6_K down and head, Q4_1 embeddings
K_TYPES = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q5_K", "ffn_gate": "Q4_K",
           "ffn_up": "Q4_1", "ffn_down": "Q6_K", "token_embd": "Q4_1", "output": "Q6_K"}


@pytest.fixture(scope="module")
def kquant_gguf(tmp_path_factory) -> Path:
    from gguf_writer import write_gguf

    return write_gguf(tmp_path_factory.mktemp("kq") / "tiny-kquant.gguf", hidden=256, ffn=512, heads=4, kv=2,
                      layers=2, kinds=K_TYPES, eos=None)


@pytest.fixture(scope="module")
def kquant_decoder(kquant_gguf):
    from rest_lsp.engine.model import load_model

    needs_kernel()
    return Decoder(load_model(str(kquant_gguf), "cpu", "gguf"))


def test_k_quant_and_q4_1_tensors_run_on_their_own_blocks(kquant_decoder, kquant_gguf, caplog):
    """Q4_K, Q5_K, Q6_K and Q4_1 tensors keep their blocks (none requantized to Q8_0, the llama q and k rows
    un-permuted), each part's panels the file's blocks repacked, and the load says which kinds it kept."""
    from gguf import GGUFReader

    d = kquant_decoder
    assert d.mode == "gguf"
    q_rows, kv_rows, ffn, hidden = 256, 128, 512, 256
    codes = quant_matmul.FORMATS
    for layer in d.lean.layers:
        assert widths(layer.qkv) == [(codes["Q4_K"], q_rows + kv_rows), (codes["Q6_K"], kv_rows)]
        assert widths(layer.o) == [(codes["Q5_K"], hidden)]
        assert widths(layer.gate_up) == [(codes["Q4_K"], ffn), (codes["Q4_1"], ffn)]
        assert widths(layer.down) == [(codes["Q6_K"], hidden)]
    assert widths(d.lean.head) == [(codes["Q6_K"], d.vocab_size)]
    tensors = {t.name: t for t in GGUFReader(kquant_gguf).tensors}
    down = gguf_blocks.decode(tensors["blk.1.ffn_down.weight"].data, "Q6_K", ffn)
    assert torch.equal(d.lean.layers[1].down.parts[0].panels, quant_matmul.pack_blocks(**down.fields(), bits=62))
    hf = transformers_model(kquant_gguf)  # transformers' own dequantization of the file
    assert torch.equal(down.dequantized(), hf.model.layers[1].mlp.down_proj.weight)
    weights = gguf_blocks.GgufWeights(kquant_gguf)
    with caplog.at_level(logging.INFO, logger="rest_lsp.engine.gguf_blocks"):
        for i, layer in enumerate(hf.model.layers):
            for name, module in MODULES.items():
                assert weights.blocks(f"blk.{i}.{name}.weight", layer.get_submodule(module).weight) is not None
        weights.report()
    assert weights.unmatched == [] and "(Q4_1 2, Q4_K 6, Q5_K 2, Q6_K 4)" in caplog.records[-1].getMessage()


def test_greedy_rest_equals_plain_decoding_with_k_quant_blocks(kquant_decoder):
    """REST over Q4_K, Q5_K, Q6_K and Q4_1 panels accepts what a one-token step picks, with any drafts, in trees of
    4-16 nodes."""
    assert_rest_is_plain_decoding(kquant_decoder, kquant_decoder.vocab_size, budgets=(4, 16))


def test_the_k_quant_step_is_close_to_the_fp32_one(kquant_decoder, kquant_gguf):
    """The K-quant panels compute the dequantized weights' product, to within the rows' quantization."""
    from rest_lsp.engine.model import load_model

    exact = Decoder(load_model(str(kquant_gguf), "cpu", "float32"))  # the machine's fp32 packing
    ids, pos = torch.tensor([3, 14, 15, 92, 65, 35]), torch.arange(6)
    a = kquant_decoder.logits(kquant_decoder.lean.forward(ids, pos, kquant_decoder.lean.new_cache()))
    b = exact.logits(exact.lean.forward(ids, pos, exact.lean.new_cache()))
    assert 0 < (a - b).abs().max() < 0.05 * b.abs().max()


def code_model_path() -> Path:
    import os

    path = Path(os.environ.get("REST_LSP_CODE_MODEL") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                / "rest-lsp/models/qwen2.5-coder/qwen2.5-coder-0.5b-instruct.gguf")
    if not path.is_file():
        pytest.skip(f"no code model at {path} (../shared/models/get_qwen_coder.sh)")
    return path


@pytest.fixture(scope="module")
def code_decoder():
    from rest_lsp.engine.model import load_model, load_tokenizer

    path = code_model_path()
    needs_kernel()
    return Decoder(load_model(str(path), "cpu", "gguf")), load_tokenizer(str(path))


@pytest.mark.slow
def test_the_code_models_tensors_run_on_their_own_blocks(code_decoder):
    """Qwen2.5-Coder-0.5B Q4_K_M: its Q5_0 tensors on 5-bit panels, its Q8_0 ones (half the v, the LM head) on
    8-bit ones, its Q4_K and Q6_K ones (down) on Q4_K and Q6_K panels; every block tensor kept (none unmatched)."""
    from gguf import GGUFReader

    decoder, _ = code_decoder
    assert decoder.mode == "gguf"
    tensors = {t.name: t.tensor_type.name for t in GGUFReader(code_model_path()).tensors}
    cfg = decoder.model.config
    q_rows, kv_rows = cfg.hidden_size, cfg.num_key_value_heads * decoder.lean.head_dim
    for i, layer in enumerate(decoder.lean.layers):
        v_bits = gguf_blocks.BITS[tensors[f"blk.{i}.attn_v.weight"]]
        want = [(5, q_rows + 2 * kv_rows)] if v_bits == 5 else [(5, q_rows + kv_rows), (8, kv_rows)]
        assert widths(layer.qkv) == want, i
        assert widths(layer.o)[0][0] == widths(layer.gate_up)[0][0] == 5
        assert widths(layer.down)[0][0] == gguf_blocks.BITS[tensors[f"blk.{i}.ffn_down.weight"]] in (42, 62)
    assert widths(decoder.lean.head) == [(8, cfg.vocab_size)]


@pytest.mark.slow
def test_the_code_model_in_the_gguf_mode_rest_equals_plain(code_decoder):
    """Greedy REST writes what plain decoding writes on a few code prompts, with perfect and partly right drafts."""
    from rest_lsp.drafting.drafts import ContextLookup, NgramDrafts

    decoder, tokenizer = code_decoder
    for text in ("def fibonacci(n):\n    ", "import os\n\n\ndef list_python_files(folder):\n",
                 "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"):
        prompt = tokenizer.encode(text)
        truth = plain_tokens(decoder, prompt, 24)
        wrong = [t if i % 3 else (t + 1) % decoder.vocab_size for i, t in enumerate(truth)]
        for source in (ContextLookup(), NgramDrafts([prompt + truth]), NgramDrafts([prompt + wrong])):
            assert decoder.generate(prompt, source, DecodeConfig(max_new_tokens=24, budget=16)).tokens == truth


@pytest.fixture(scope="module")
def default_gguf_decoder():
    from rest_lsp.engine.model import DEFAULT_MODEL, load_model, load_tokenizer

    needs_kernel()
    return Decoder(load_model(DEFAULT_MODEL, "cpu", "gguf")), load_tokenizer(DEFAULT_MODEL)


@pytest.mark.slow
def test_the_default_models_q4_1_tensors_run_on_their_own_blocks_and_rest_equals_plain(default_gguf_decoder):
    """SmolLM2-135M Q4_1: every linear layer on Q4_1 panels (none requantized to Q8_0), the head (its Q8_0 token
    embeddings) on 8-bit ones; greedy REST writes what plain decoding writes, with perfect and partly right drafts."""
    from rest_lsp.drafting.drafts import ContextLookup, NgramDrafts

    decoder, tokenizer = default_gguf_decoder
    assert decoder.mode == "gguf"
    q4_1 = quant_matmul.FORMATS["Q4_1"]
    for layer in decoder.lean.layers:
        assert {bits for mm in (layer.qkv, layer.o, layer.gate_up, layer.down) for bits, _ in widths(mm)} == {q4_1}
    assert widths(decoder.lean.head) == [(8, decoder.vocab_size)]
    text = "import os\n\n\ndef list_python_files(folder):\n"
    prompt = tokenizer.encode(text)
    truth = plain_tokens(decoder, prompt, 24)
    wrong = [t if i % 3 else (t + 1) % decoder.vocab_size for i, t in enumerate(truth)]
    for source in (ContextLookup(), NgramDrafts([prompt + truth]), NgramDrafts([prompt + wrong])):
        assert decoder.generate(prompt, source, DecodeConfig(max_new_tokens=24, budget=16)).tokens == truth
