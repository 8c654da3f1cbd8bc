"""`rest-lsp index`, with a byte-level tokenizer standing in for the model's."""

from __future__ import annotations

import argparse
import json

import pytest

import rest_lsp.engine.model
import rest_lsp.engine.saved_tokenizer
from rest_lsp.commands import index as index_command


class ByteTokenizer:
    key = "bytes-test"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(ids).decode("utf-8", "replace")


@pytest.fixture
def cli(monkeypatch, tmp_path):
    monkeypatch.setattr(rest_lsp.engine.saved_tokenizer, "load", lambda spec=None: None)  # none saved: the slow path,
    monkeypatch.setattr(rest_lsp.engine.model, "load_tokenizer", lambda spec=None: ByteTokenizer())  # stood in for
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))

    def run(*argv: str) -> int:
        parser = argparse.ArgumentParser()
        index_command.add_arguments(parser)
        return index_command.run(parser.parse_args(list(argv)))
    return run


def test_index_then_query(cli, tmp_path, capsys):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("import os\nimport sys\nimport os.path\n")
    assert cli(str(ws), "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["files"] == 1 and out["tokens"] == 36 and out["bytes_per_token"] > 0 and out["seconds"] >= 0
    assert (tmp_path / "cache" / "index").is_dir()

    assert cli(str(ws), "--query", "x = 1\nimport ", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["match_length"] == 8                      # "\nimport "
    # The first "import" has no newline before it; a continuation stops at the end of its file.
    assert sorted(out["continuations"], key=lambda c: c["text"]) == [
        {"text": "os.path\n", "count": 1}, {"text": "sys\nimport", "count": 1}]

    assert cli(str(ws)) == 0
    assert "1 files, 36 tokens" in capsys.readouterr().out


def test_bad_folder_is_one_sentence(cli, tmp_path, capsys):
    assert cli(str(tmp_path / "missing")) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_a_save_that_fails_is_an_error(cli, tmp_path, capsys, monkeypatch):
    import errno

    import numpy as np

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(np, "save", disk_full)
    assert cli(str(ws)) == 1
    assert "could not save the index" in capsys.readouterr().err
