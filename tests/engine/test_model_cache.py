"""The README's "a .gguf is dequantized once and kept under the user's cache folder": the first load of a .gguf
(a small random one: the default model's conversion is slow, and the suite's default_model fixture makes it anyway)
into an empty cache converts it, the second reads the converted copy and converts nothing. And the edges of loading:
corrupt weights, a damaged or half-written conversion folder, a damaged cached tokenizer."""

import os
from pathlib import Path

import pytest
import torch
from gguf_writer import write_gguf
from support import tiny_folder
from transformers import LlamaForCausalLM

from rest_lsp.engine import model
from rest_lsp.engine.model import load_model


def test_a_gguf_is_converted_once(tmp_path, monkeypatch):
    (tmp_path / "files").mkdir()
    gguf = write_gguf(tmp_path / "files" / "m.gguf", hidden=128, ffn=256, layers=2, kinds={"attn_q": "Q8_0"})
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    loads = []  # the gguf file name of each transformers load (None: a plain model folder)
    from_pretrained = model._from_pretrained

    def counted(folder, gguf_file, dtype):
        loads.append(gguf_file)
        return from_pretrained(folder, gguf_file, dtype)

    monkeypatch.setattr(model, "_from_pretrained", counted)
    first = load_model(str(gguf), "cpu", "float32")
    assert loads == [gguf.name], loads  # dequantized from the .gguf
    kept = [p for p in (tmp_path / "cache" / "models").iterdir()]
    assert len(kept) == 1 and (kept[0] / "config.json").is_file(), kept  # one converted folder, no leftovers
    written = {p: p.stat().st_mtime_ns for p in kept[0].rglob("*")}

    loads.clear()
    second = load_model(str(gguf), "cpu", "float32")
    assert loads == [None], loads  # the converted folder, not the .gguf
    assert {p: p.stat().st_mtime_ns for p in kept[0].rglob("*")} == written  # nothing written again
    assert list((tmp_path / "cache" / "models").iterdir()) == kept
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


# -- the conversion cache: keyed by content, this user's alone, capped (issue 39) --------------------------------
def _embedding_of(path: Path):
    """The token embeddings the .gguf at `path` holds (F32), as transformers' [vocab, hidden]."""
    import numpy as np
    from gguf import GGUFReader

    t = next(t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    return torch.from_numpy(np.array(t.data, np.float32).reshape(int(t.shape[1]), int(t.shape[0])))


def _conversions(cache: Path) -> list[Path]:
    models = cache / "models"
    return sorted(p for p in models.iterdir() if not p.name.startswith(".")) if models.is_dir() else []


def _loads_its_own_weights(path: Path) -> bool:
    loaded = load_model(str(path), "cpu", "float32")
    return torch.equal(loaded.model.get_input_embeddings().weight.detach(), _embedding_of(path))


def test_a_file_replaced_with_its_size_and_time_kept_is_converted_again(tmp_path, model_module):
    """cp -p, rsync -a, tar and curl -R keep a replacement's modification time: the bytes name the conversion."""
    path = write_gguf(tmp_path / "model.gguf", seed=0)
    assert _loads_its_own_weights(path)
    st = path.stat()
    path.write_bytes(write_gguf(tmp_path / "other.gguf", seed=1).read_bytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert _loads_its_own_weights(path)


def test_a_file_keeps_one_conversion_touched_or_replaced(tmp_path, model_module):
    path = write_gguf(tmp_path / "model.gguf")
    load_model(str(path), "cpu", "float32")
    os.utime(path, (1e9, 1e9))  # touch: the same bytes
    load_model(str(path), "cpu", "float32")
    assert len(_conversions(tmp_path / "cache")) == 1
    path.write_bytes(write_gguf(tmp_path / "other.gguf", seed=1).read_bytes())  # a new version of the file
    load_model(str(path), "cpu", "float32")
    (kept,) = _conversions(tmp_path / "cache")  # the old version's conversion went
    assert kept == model._conversion_dir(str(path.parent), path.name)


def test_the_conversions_are_capped_and_only_rest_lsps_own_entries_go(tmp_path, model_module, monkeypatch):
    from rest_lsp import cache_dir

    first = write_gguf(tmp_path / "m0.gguf", seed=10)
    load_model(str(first), "cpu", "float32")
    (one,) = _conversions(tmp_path / "cache")
    size = sum(f.stat().st_size for f in one.rglob("*"))
    monkeypatch.setattr(cache_dir, "MODELS_BYTES", int(2.5 * size))  # room for two
    mine = tmp_path / "cache" / "models" / "qwen2.5-coder"  # a user's own file in the folder: never removed
    mine.mkdir()
    (mine / "model.gguf").write_bytes(b"GGUF")
    models = [first] + [write_gguf(tmp_path / f"m{i}.gguf", seed=10 + i) for i in (1, 2)]
    for m in models[1:]:
        load_model(str(m), "cpu", "float32")
    kept = _conversions(tmp_path / "cache")
    assert mine in kept and len(kept) == 3
    assert {p.name.split("-")[0] for p in kept if p != mine} == {"m1", "m2"}  # the least recently used went


def _planted(tmp_path: Path, victim: Path) -> Path:
    """The victim's conversion folder, filled with another model's conversion (what a local attacker writes)."""
    (tmp_path / "attacker").mkdir()
    other = write_gguf(tmp_path / "attacker" / "model.gguf", seed=7)
    cached = model._conversion_dir(str(victim.parent), victim.name)
    load_model(str(other), "cpu", "float32")
    planted = next(p for p in _conversions(cached.parent.parent) if p != cached and p.name.startswith("model-"))
    import shutil

    shutil.rmtree(cached, ignore_errors=True)
    shutil.copytree(planted, cached)
    return cached


@pytest.mark.parametrize("how", ["group-writable", "another owner", "unreadable"])
def test_a_conversion_another_user_could_write_or_this_user_cannot_read_is_not_used(tmp_path, model_module, how,
                                                                                     caplog):
    victim = write_gguf((tmp_path / "victim").mkdir() or tmp_path / "victim" / "model.gguf", seed=0)
    cached = _planted(tmp_path, victim)
    if how == "group-writable":
        cached.chmod(0o777)
    elif how == "another owner":
        if os.geteuid() != 0:
            pytest.skip("only root can give a folder to another user")
        os.chown(cached, 65534, 65534)
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads a folder of mode 000")
        cached.chmod(0)
    try:
        with caplog.at_level("WARNING", logger="rest_lsp.engine.model"):
            assert _loads_its_own_weights(victim)
    finally:
        if cached.exists():
            cached.chmod(0o700)
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1, caplog.text
    assert "is not used" in caplog.text


@pytest.mark.parametrize("where", ["root", "models"])
def test_a_cache_folder_others_may_write_is_not_used_at_all(tmp_path, model_module, where, caplog):
    victim = write_gguf((tmp_path / "victim").mkdir() or tmp_path / "victim" / "model.gguf", seed=0)
    _planted(tmp_path, victim)
    folder = tmp_path / "cache" if where == "root" else tmp_path / "cache" / "models"
    folder.chmod(0o777)
    before = sorted(p.name for p in folder.rglob("*"))
    with caplog.at_level("WARNING"):
        assert _loads_its_own_weights(victim)
        assert _loads_its_own_weights(victim)
    assert sorted(p.name for p in folder.rglob("*")) == before  # nothing read, nothing written there
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1, caplog.text
    assert f"The cache folder {folder} is not used: it is writable by group or others" in caplog.text


def test_a_files_digest_is_hashed_once_and_again_when_the_file_changes(tmp_path, model_module, monkeypatch):
    from rest_lsp import cache_dir

    path = write_gguf(tmp_path / "model.gguf", seed=0)
    hashed = []
    real = cache_dir._hash

    def counted(p, st):
        hashed.append(p)
        return real(p, st)

    monkeypatch.setattr(cache_dir, "_hash", counted)
    first = cache_dir.content_digest(path)
    cache_dir._digests.clear()  # a new process: the kept record answers
    assert cache_dir.content_digest(path) == first and len(hashed) == 1
    st = path.stat()
    path.write_bytes(write_gguf(tmp_path / "other.gguf", seed=1).read_bytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and time; ctime moved
    cache_dir._digests.clear()
    assert cache_dir.content_digest(path) != first and len(hashed) == 2
    (record,) = (tmp_path / "cache" / "digests").iterdir()
    record.chmod(0o666)  # anyone may have written the digest: hashed again
    cache_dir._digests.clear()
    cache_dir.content_digest(path)
    assert len(hashed) == 3
