"""A .gguf loaded straight from its blocks (engine/gguf_direct.py): the gguf mode without transformers' fp32 model.

What it builds is what the gguf mode built from that model (the same panels, logits and tokens: the reference here
is LeanLlama over transformers' model of the same file), its tokenizer comes from the file and is kept for the next
load, a load with no dtype takes this path without timing modes, bad files are refused in one sentence before it,
and its peak memory stays near the file's size (a subprocess measures VmHWM)."""

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_writer import write_gguf as write_random_gguf
from test_exactness import assert_rest_is_plain_decoding
from test_gguf_mode import needs_kernel, write_gguf

from rest_lsp.engine import gguf_blocks, gguf_direct, mode_choice, model, runmode
from rest_lsp.engine.decoding import Decoder
from rest_lsp.engine.model import LoadedModel, ModelLoadError, Tokenizer, load_model

SMOLLM = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(runmode.DTYPE_ENV, raising=False)
    return tmp_path / "cache"


def todays_gguf_mode(path: Path, hf=None) -> Decoder:
    """The gguf mode as it ran before: transformers' fp32 model of the file (`hf` where the caller has it), its
    blocks matched against it."""
    from transformers import AutoModelForCausalLM

    if hf is None:
        hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                  local_files_only=True).eval()
    gguf_blocks.attach(hf, path)
    return Decoder(LoadedModel(model=hf, tokenizer=None, device=torch.device("cpu"), dtype=torch.float32,
                               name=str(path), packing="gguf"))


def assert_same_as_todays(direct: Decoder, today: Decoder, prompt: list[int], steps: int = 8) -> None:
    """The same panels in every matmul, the same logits for a prefill and for greedy steps after it."""
    for mine, theirs in zip([direct.lean.head] + direct.lean.layers, [today.lean.head] + today.lean.layers):
        for name in ("qkv", "o", "gate_up", "down") if hasattr(mine, "qkv") else ("",):
            a, b = (getattr(m, name) if name else m for m in (mine, theirs))
            assert [(p.bits, p.out_features) for p in a.parts] == [(p.bits, p.out_features) for p in b.parts]
            for pa, pb in zip(a.parts, b.parts):
                assert torch.equal(pa.panels, pb.panels), name
                assert (pa.bias is None) == (pb.bias is None) and (pa.bias is None or torch.equal(pa.bias, pb.bias))
    caches = [d.lean.new_cache() for d in (direct, today)]
    ids = torch.tensor(prompt)
    for step in range(steps):
        pos = torch.arange(caches[0].length, caches[0].length + len(ids))
        a, b = (d.logits(d.lean.forward(ids, pos, c)) for d, c in zip((direct, today), caches))
        assert torch.equal(a, b), step
        ids = a[-1:].argmax(-1)


@pytest.mark.parametrize("arch, tied", [("llama", False), ("qwen2", True)], ids=["llama-untied", "qwen2-tied"])
def test_the_direct_load_is_todays_gguf_mode_on_a_file_of_every_block_kind(tmp_path, arch, tied):
    """Q5_0, Q8_0 and Q4_0 blocks, an F16 tensor, llama's permuted q/k rows, q/k/v biases, a tied and an untied head:
    the same panels, logits and greedy tokens; and REST is plain decoding there."""
    needs_kernel()
    path = write_gguf(tmp_path / f"tiny-{arch}.gguf", arch, tied)
    loaded = load_model(str(path), "cpu", "gguf")
    assert isinstance(loaded.model, gguf_direct.GgufModel) and loaded.mode == "gguf"
    direct = Decoder(loaded)
    today = todays_gguf_mode(path)
    assert loaded.eos_token_ids >= today.eos and direct.vocab_size == today.vocab_size
    assert direct.max_context == today.max_context and direct.engine == today.engine == "lean-gguf"
    assert_same_as_todays(direct, today, [3, 14, 15, 92, 65, 35, 8, 9])
    assert_rest_is_plain_decoding(direct, direct.vocab_size, budgets=(4, 16), seeds=range(1))


def test_a_fused_matmul_whose_parts_end_inside_a_panel_is_todays_too(tmp_path):
    """q rows (72) that end inside a panel of 16: q, k and v are packed together, as GgufMatmul.of_blocks packs."""
    needs_kernel()
    path = write_random_gguf(tmp_path / "odd.gguf", hidden=72, heads=4, kv=2, ffn=136)
    direct = Decoder(load_model(str(path), "cpu", "gguf"))
    assert [(p.bits, p.out_features) for p in direct.lean.layers[0].qkv.parts] == [(8, 72 + 2 * 36)]
    assert_same_as_todays(direct, todays_gguf_mode(path), [1, 2, 3, 50, 60])


def test_the_embedding_stays_in_the_file_and_reads_transformers_values(tmp_path):
    """Rows looked up per step (any kind, here Q4_0 and F16) are transformers' fp32 embedding rows bit for bit."""
    from transformers import AutoModelForCausalLM

    needs_kernel()
    for kind in ("Q4_0", "F16", "Q4_1"):
        path = write_random_gguf(tmp_path / f"embd-{kind}.gguf", kinds={"token_embd": kind}, vocab=97)
        loaded = load_model(str(path), "cpu", "gguf")
        embed = loaded.model.get_input_embeddings()
        assert not [t for t in loaded.model.parameters() if t.numel() >= embed.num_embeddings]  # no [V, H] copy
        want = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                    local_files_only=True).get_input_embeddings().weight
        ids = torch.tensor([0, 96, 5, 5, 40])
        assert torch.equal(embed[ids], want[ids]), kind
        with pytest.raises(IndexError):
            embed[torch.tensor([97])]


def test_a_load_without_a_dtype_takes_the_blocks_and_times_no_mode(tmp_path, monkeypatch):
    needs_kernel()
    monkeypatch.setattr(mode_choice, "measure", lambda *a, **k: pytest.fail("timed modes on an fp32 model"))
    monkeypatch.setattr(model, "_from_pretrained", lambda *a, **k: pytest.fail("built transformers' model"))
    path = write_gguf(tmp_path / "tiny-qwen2.gguf", "qwen2", True)
    loaded = load_model(str(path), "cpu")
    assert isinstance(loaded.model, gguf_direct.GgufModel) and loaded.mode == "gguf" and loaded.packing == "gguf"
    assert Decoder(loaded).mode == "gguf"
    with pytest.raises(ModelLoadError, match="lean engine"):
        Decoder(loaded, lean=False)


def test_other_dtypes_and_files_the_lean_engine_does_not_run_keep_transformers_path(tmp_path):
    needs_kernel()
    path = write_gguf(tmp_path / "tiny-llama.gguf", "llama", False)
    assert not isinstance(load_model(str(path), "cpu", "float32").model, gguf_direct.GgufModel)
    scaled = write_random_gguf(tmp_path / "scaled.gguf", metadata={"llama.rope.scaling.type": "linear"})
    assert gguf_direct.refusal(model.check_gguf(scaled)) == "scaled RoPE"
    assert not isinstance(load_model(str(scaled), "cpu", "gguf").model, gguf_direct.GgufModel)


def test_the_tokenizer_is_read_from_the_file_once_and_kept(tmp_path, monkeypatch, cache):
    """The first load reads it from the .gguf (transformers' GGUF tokenizer, FIM tokens and all) and keeps it; the
    next one reads the kept copy, the same tokenizer, and never the file's vocabulary."""
    from transformers import AutoTokenizer

    needs_kernel()
    path = write_random_gguf(tmp_path / "tok.gguf", vocab=100, extra_tokens=3)
    first = load_model(str(path), "cpu").tokenizer
    real = AutoTokenizer.from_pretrained

    def no_gguf(*args, **kwargs):
        assert "gguf_file" not in kwargs, "read the tokenizer from the .gguf again"
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", no_gguf)
    second = load_model(str(path), "cpu").tokenizer
    assert second.key == first.key and second.encode("ab cd <x1>") == first.encode("ab cd <x1>")
    kept = [p for p in (cache / "models").iterdir() if (p / "tokenizer_config.json").is_file()]
    assert len(kept) == 1 and not (kept[0] / "config.json").exists()
    # a float32 load later converts over the tokenizer-only entry and keeps its conversion there
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", real)
    assert load_model(str(path), "cpu", "float32").mode == "float32" and (kept[0] / "config.json").is_file()


@pytest.mark.parametrize("damage", ["truncated", "offset past the end", "unknown type", "absurd dims"])
def test_a_bad_file_is_refused_in_one_sentence_before_any_block_is_read(tmp_path, monkeypatch, damage):
    import struct

    needs_kernel()
    monkeypatch.setattr(gguf_direct, "load", lambda *a: pytest.fail("built from a bad file"))
    path = write_random_gguf(tmp_path / "bad.gguf")
    data = bytearray(path.read_bytes())
    header = model.check_gguf(path)
    tensor = header.tensors["blk.0.ffn_down.weight"]
    name = tensor.name.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)  # its dims count, dims, type, offset
    if damage == "truncated":
        data = data[: len(data) - 100]
    elif damage == "offset past the end":
        struct.pack_into("<Q", data, at + 4 + 8 * 2 + 4, len(data))
    elif damage == "unknown type":
        struct.pack_into("<I", data, at + 4 + 8 * 2, 250)
    else:
        struct.pack_into("<Q", data, at + 4, 1 << 40)
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as err:
        load_model(str(path), "cpu")
    text = str(err.value)
    assert text.endswith(".") and text.count(". ") == 0 and "\n" not in text, text


PEAK_SCRIPT = textwrap.dedent("""
    import json, sys
    def status(key):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(key + ":")) / 1024
    import torch, transformers
    from rest_lsp.engine.model import load_model
    from rest_lsp.engine.decoding import Decoder
    torch.set_num_threads(1)
    from pathlib import Path
    from rest_lsp.engine import gguf_direct, gguf_header, model
    path = Path(sys.argv[1])
    model._gguf_tokenizer(str(path.parent), path.name, keep=True)  # read from the file and kept: a warm load next
    # what any model costs, loaded before: transformers' config modules, the kernels' libraries and native ops
    gguf_direct.config_of(gguf_header.read(str(path)))
    from rest_lsp.kernels import quant_matmul, row_attention, step_ops
    quant_matmul.library(), row_attention.library(), step_ops.ready()
    with open("/proc/self/clear_refs", "w") as f:  # the peak so far forgotten: VmHWM starts again at VmRSS
        f.write("5")
    base = status("VmRSS")
    decoder = Decoder(load_model(sys.argv[1], "cpu", "gguf"))
    ids = torch.arange(64)
    decoder.logits(decoder.lean.forward(ids, ids, decoder.lean.new_cache()))
    print(json.dumps({"base": base, "peak": status("VmHWM")}))
""")


def test_the_peak_memory_of_a_load_and_a_step_stays_near_the_file(tmp_path):
    """A Q8_0 file of ~80 MB (blocks the kernel keeps): what the warm load and a 64-token prefill add to the process's
    peak RSS, over its RSS with what every model costs already loaded (transformers' config modules, the kernels'
    libraries), is at most 1.5x the file (transformers' fp32 model alone would be ~3.8x). The base is VmRSS after
    the peak is reset, not an earlier peak: a peak set before (building the tokenizer) would hide the load's."""
    needs_kernel()
    path = write_random_gguf(tmp_path / "big.gguf", vocab=16384, hidden=768, ffn=3072, heads=12, kv=4, layers=6,
                             kinds={k: "Q8_0" for k in ("token_embd", "output", "attn_q", "attn_k", "attn_v",
                                                        "attn_output", "ffn_gate", "ffn_up", "ffn_down")})
    size_mb = path.stat().st_size / 2**20
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2])] + sys.path)}
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(path)], capture_output=True, text=True, env=env,
                         timeout=600, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["peak"] - got["base"] <= 1.5 * size_mb, (got, size_mb)


@pytest.mark.slow
def test_the_default_model_loads_from_its_blocks_as_todays_gguf_mode(default_model, pytestconfig, monkeypatch):
    """SmolLM2-135M Q4_1 (its Q4_1 tensors requantized to Q8_0 until the kernel keeps Q4_1, its Q8_0 embedding the
    tied head's own blocks): the same panels, logits and greedy tokens as the gguf mode over transformers' model."""
    from rest_lsp.engine.model_source import resolve

    needs_kernel()
    folder, name = resolve(None)
    assert name == SMOLLM
    path = Path(folder) / name
    loaded = load_model(None, "cpu", "gguf")
    assert isinstance(loaded.model, gguf_direct.GgufModel)
    # transformers' fp32 model of the file, a fresh one (attach changes it), read from the conversion the session's
    # default_model keeps rather than converted again in this test's own cache: the same weights as
    # from_pretrained(gguf_file=...), test_model_cache
    with monkeypatch.context() as session:
        session.setenv("REST_LSP_CACHE_DIR", str(pytestconfig.rest_lsp_cache_dir))
        hf = load_model(None, "cpu", "float32").model
    direct, today = Decoder(loaded), todays_gguf_mode(path, hf)
    prompt = loaded.tokenizer.encode("def fibonacci(n):\n    ")
    assert_same_as_todays(direct, today, prompt, steps=6)
    assert loaded.eos_token_ids == {2} and loaded.tokenizer.decode(prompt) == "def fibonacci(n):\n    "
