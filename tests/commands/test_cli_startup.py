"""`rest-lsp index` starts without torch or transformers once transformers has loaded the model's tokenizer here,
and writes exactly the tokens (and tokenizer key) of the server's transformers tokenizer.

Each run is a subprocess that reports which heavy modules it imported; tokenizers are tiny and built here, in
shapes where a careless reader of tokenizer.json would differ from transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rest_lsp.engine import saved_tokenizer
from rest_lsp.datastore.persist import IndexFolder, index_folder

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "rest_lsp.service.completion")

# Runs the CLI, then writes the heavy modules it imported to the file named by its first argument.
WRAPPER = """
import json, sys
from rest_lsp.cli import main
code = main(sys.argv[2:])
heavy = [m for m in json.loads(sys.argv[1].split("::")[1]) if m in sys.modules]
open(sys.argv[1].split("::")[0], "w").write(json.dumps(heavy))
sys.exit(code)
"""

FILES = {
    "a.py": "def add(a, b):\n    return a + b\n",
    "b.py": "x = 1\n<|endoftext|>def  add(a, b):\n\timport os  # café\n",   # a special token's text in a file
    "c.py": " leading space\n\n\n   import sys\n",
}


def _tokenizer_folder(path: Path, kind: str, with_model: bool = False) -> Path:
    """A tiny byte-level BPE tokenizer folder that transformers loads. All add <s> when asked for special tokens
    and truncate unless told not to; `kind` picks what transformers does besides: 'bos' nothing, 'prefix-space'
    is a GPT2Tokenizer that transformers rebuilds with a prefix space (so its tokenizer.json alone gives other
    ids), 'split-specials' splits the text of special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(list(FILES.values()) * 5, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "<|endoftext|>", "<fim_prefix>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    raw.enable_truncation(max_length=8)  # transformers turns it off for a call without max_length
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="<|endoftext|>",
                            additional_special_tokens=["<fim_prefix>"]).save_pretrained(path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    if kind == "prefix-space":
        config.update(tokenizer_class="GPT2Tokenizer", add_prefix_space=True)
    elif kind == "split-specials":
        config.update(split_special_tokens=True)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if with_model:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1,
                                     max_position_embeddings=64)).save_pretrained(path)
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(cache))  # for load_model/load_tokenizer in this process
    env = dict(os.environ, REST_LSP_CACHE_DIR=str(cache), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return env


@pytest.fixture
def workspace(tmp_path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name, text in FILES.items():
        (ws / name).write_text(text)
    return ws


def index(env: dict, tmp_path: Path, *args) -> tuple[int, str, str, list[str]]:
    """(exit code, stdout, stderr, the heavy modules imported) of `rest-lsp index *args` in a subprocess."""
    report = tmp_path / "heavy.json"
    report.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-c", WRAPPER, f"{report}::{json.dumps(HEAVY)}", "index", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert report.is_file(), f"the CLI died: {proc.stderr}"
    return proc.returncode, proc.stdout, proc.stderr, json.loads(report.read_text())


def indexed_tokens(env: dict, ws: Path, key: str) -> dict[str, list[int]]:
    """The tokens of each file in the index saved for `ws`, read as the server would with tokenizer `key`."""
    root = ws.resolve()
    saved = IndexFolder(index_folder(Path(env["REST_LSP_CACHE_DIR"]), root), key, root).load()
    assert saved is not None, "no index saved under this tokenizer key: the server would rebuild it"
    return {Path(seg.doc_ids[i]).name: seg.doc_tokens(i).tolist()
            for seg in saved.segments for i in range(seg.doc_count) if seg.live[i]}


@pytest.mark.parametrize("kind", ["bos", "prefix-space", "split-specials"])
def test_index_with_a_saved_tokenizer_imports_no_torch_and_writes_the_servers_tokens(kind, tmp_path, env,
                                                                                   workspace):
    from rest_lsp.engine.model import load_tokenizer

    folder = _tokenizer_folder(tmp_path / "model", kind)
    server = load_tokenizer(str(folder))  # transformers, as the server loads it; this saves it for the CLI
    code, out, err, heavy = index(env, tmp_path, workspace, "--model", folder, "--json")
    assert code == 0, err
    assert heavy == [], f"`rest-lsp index` imported {heavy}"
    assert json.loads(out)["files"] == len(FILES)
    assert indexed_tokens(env, workspace, server.key) == {
        name: server.encode_batch([text])[0] for name, text in FILES.items()}

    code, out, err, heavy = index(env, tmp_path, workspace, "--model", folder, "--query", "def  add(", "--json")
    assert code == 0 and heavy == [], (err, heavy)
    assert json.loads(out)["match_length"] == len(server.encode("def  add("))


def test_the_servers_model_load_saves_the_tokenizer_for_the_cli(tmp_path, env, workspace):
    from rest_lsp.engine.model import load_model

    folder = _tokenizer_folder(tmp_path / "model", "bos", with_model=True)
    loaded = load_model(str(folder), "cpu", "float32")
    assert saved_tokenizer.load(str(folder)).key == loaded.tokenizer.key
    code, _, err, heavy = index(env, tmp_path, workspace, "--model", folder)
    assert code == 0 and heavy == [], (err, heavy)
    assert indexed_tokens(env, workspace, loaded.tokenizer.key)["b.py"] == loaded.tokenizer.encode(FILES["b.py"])


def test_without_a_saved_tokenizer_index_loads_transformers_once(tmp_path, env, workspace, monkeypatch):
    # a hub id in the local Hugging Face cache: its signature is the commit that refs/main names
    from transformers import LlamaConfig

    repo = tmp_path / "hub" / "models--tiny--tok"
    _tokenizer_folder(repo / "snapshots" / "abc123", "prefix-space")
    LlamaConfig(vocab_size=300).save_pretrained(repo / "snapshots" / "abc123")  # what AutoTokenizer reads first
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    env = dict(env, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")

    code, out, err, heavy = index(env, tmp_path, workspace, "--model", "tiny/tok")
    assert code == 0, err
    assert "transformers" in heavy and "3 files" in out
    code, out, err, heavy = index(env, tmp_path, workspace, "--model", "tiny/tok")
    assert code == 0 and heavy == [], (err, heavy)
    assert "loaded and updated" in out  # the same tokenizer key: the first run's index was reused

    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert saved_tokenizer.load("tiny/tok") is not None
    (repo / "refs" / "main").write_text("def456")  # another commit: not read from the old saved tokenizer
    assert saved_tokenizer.load("tiny/tok") is None


def test_a_damaged_saved_tokenizer_is_read_again_by_transformers_and_saved_again(tmp_path, env):
    from rest_lsp.engine.model import load_tokenizer

    folder = _tokenizer_folder(tmp_path / "model", "bos")
    key = load_tokenizer(str(folder)).key
    [path] = (Path(env["REST_LSP_CACHE_DIR"]) / "tokenizers").iterdir()
    path.write_text("{oops")
    assert saved_tokenizer.load(str(folder)) is None  # so `rest-lsp index` takes the transformers path,
    load_tokenizer(str(folder))                         # which saves it again
    assert saved_tokenizer.load(str(folder)).key == key


def test_a_changed_tokenizer_file_is_not_read_from_the_old_saved_one(tmp_path, env):
    from rest_lsp.engine.model import load_tokenizer

    folder = _tokenizer_folder(tmp_path / "model", "bos")
    load_tokenizer(str(folder))
    assert saved_tokenizer.load(str(folder)) is not None
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"split_special_tokens": True}))
    assert saved_tokenizer.load(str(folder)) is None


def test_a_bad_model_is_one_sentence_without_torch(tmp_path, env, workspace):
    code, _, err, heavy = index(env, tmp_path, workspace, "--model", tmp_path / "missing.gguf")
    assert code == 1 and heavy == []
    assert err.strip().count("\n") == 0 and "does not exist" in err, err
