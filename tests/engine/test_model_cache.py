"""The README's "a .gguf is dequantized once and kept under the user's cache folder": the first load of the default
model into an empty cache converts it, the second reads the converted copy and converts nothing. And the edges of
loading: corrupt weights, a damaged or half-written conversion folder, a damaged cached tokenizer."""

from pathlib import Path

import pytest
import torch
from gguf_writer import write_gguf
from support import tiny_folder
from transformers import LlamaForCausalLM

from rest_lsp.engine import model
from rest_lsp.engine.model import DEFAULT_GGUF_NAME, load_model


@pytest.mark.slow
def test_a_gguf_is_converted_once(tmp_path, monkeypatch):
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path))
    loads = []  # the gguf file name of each transformers load (None: a plain model folder)
    from_pretrained = model._from_pretrained

    def counted(folder, gguf_file, dtype):
        loads.append(gguf_file)
        return from_pretrained(folder, gguf_file, dtype)

    monkeypatch.setattr(model, "_from_pretrained", counted)
    first = load_model(None, "cpu", "float32")
    assert loads == [DEFAULT_GGUF_NAME], loads  # dequantized from the .gguf
    kept = [p for p in (tmp_path / "models").iterdir()]
    assert len(kept) == 1 and (kept[0] / "config.json").is_file(), kept  # one converted folder, no leftovers
    written = {p: p.stat().st_mtime_ns for p in kept[0].rglob("*")}

    loads.clear()
    second = load_model(None, "cpu", "float32")
    assert loads == [None], loads  # the converted folder, not the .gguf
    assert {p: p.stat().st_mtime_ns for p in kept[0].rglob("*")} == written  # nothing written again
    assert list((tmp_path / "models").iterdir()) == kept
    for (name, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.fixture
def model_module(tmp_path, monkeypatch):
    import rest_lsp.engine.model as module

    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    return module


def _fake_gguf(tmp_path: Path, module, monkeypatch, name="m.gguf") -> tuple[str, list]:
    """A .gguf path whose 'conversion' loads a tiny model folder; returns (path, list of conversions)."""
    source = tiny_folder(tmp_path / "source")
    (tmp_path / "g").mkdir()
    gguf = write_gguf(tmp_path / "g" / name)
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
