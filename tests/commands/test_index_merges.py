"""`rest-lsp index` keeps the merges it waits for: a no-op run after one that merged merges nothing."""

from __future__ import annotations

import argparse
import json

import rest_lsp.datastore.store as store_module
from rest_lsp.commands import index as index_command
from rest_lsp.datastore import Datastore, WorkspaceIndex
from rest_lsp.datastore import indexer as indexer_module
from rest_lsp.datastore.persist import index_folder


class ByteTokenizer:
    key = "bytes-merges"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]


def test_a_no_op_run_saves_the_merge_it_waited_for(tmp_path, monkeypatch, capsys):
    root, cache = (tmp_path / "ws"), tmp_path / "cache"
    root.mkdir()
    root = root.resolve()
    for i in range(8):
        (root / f"m{i}.py").write_text(f"value_{i} = {i}\n")
    with monkeypatch.context() as m:  # a saved index of one segment per file, as a build cut short leaves it
        m.setattr(indexer_module, "TOKENIZE_BATCH_FILES", 1)
        m.setattr(indexer_module, "SEGMENT_TOKENS", 1)
        ds = Datastore(background_merges=False)
        WorkspaceIndex(root, ds, ByteTokenizer().encode_batch, ByteTokenizer.key, cache_dir=cache).build()
        ds.close()
    manifest = index_folder(cache, root) / "manifest.json"
    assert len(json.loads(manifest.read_text())["segments"]) == 8

    merges = []
    real_merged = store_module._merged
    monkeypatch.setattr(store_module, "_merged", lambda inputs: merges.append(len(inputs)) or real_merged(inputs))
    monkeypatch.setattr(index_command, "_tokenizer", lambda spec: ByteTokenizer())
    args = argparse.Namespace(dir=root, model=None, query=None, top=10, cache_dir=cache, max_file_bytes=1_000_000,
                              json=True)
    assert index_command.run(args) == 0
    assert merges and len(json.loads(manifest.read_text())["segments"]) < 8

    merges.clear()
    assert index_command.run(args) == 0
    assert merges == []
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["files"] == 8
