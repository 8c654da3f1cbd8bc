"""The index folder: merges of loaded segments are saved, and a folder that cannot be used leaves the index in memory."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rest_lsp.datastore import Datastore, WorkspaceIndex
from rest_lsp.datastore import indexer as indexer_module
from rest_lsp.datastore.persist import index_folder


def byte_tokenize(texts: list[str]) -> list[list[int]]:
    return [list(t.encode("utf-8")) for t in texts]


def saved_segments(cache: Path, root: Path) -> int:
    return len(json.loads((index_folder(cache, root) / "manifest.json").read_text())["segments"])


def one_segment_per_file(root: Path, cache: Path, files: int, monkeypatch) -> None:
    """A saved index of `files` files in as many segments (one merge tier), built without merges."""
    for i in range(files):
        (root / f"m{i}.py").write_text(f"value_{i} = {i}\n")
    monkeypatch.setattr(indexer_module, "TOKENIZE_BATCH_FILES", 1)
    monkeypatch.setattr(indexer_module, "SEGMENT_TOKENS", 1)
    ds = Datastore(background_merges=False)
    WorkspaceIndex(root, ds, byte_tokenize, "bytes", cache_dir=cache).build()
    ds.close()
    assert saved_segments(cache, root) == files


def test_a_merge_of_loaded_segments_is_saved_at_stop_and_not_done_again(tmp_path, monkeypatch):
    root, cache = tmp_path / "ws", tmp_path / "cache"
    root.mkdir()
    root = root.resolve()
    one_segment_per_file(root, cache, 4, monkeypatch)

    ds = Datastore(merge_factor=4)
    index = WorkspaceIndex(root, ds, byte_tokenize, "bytes", cache_dir=cache)
    assert index.build()["reindexed"] == 0
    ds.wait_for_merges()
    index.stop()
    ds.close()
    assert saved_segments(cache, root) == 1

    ds = Datastore(merge_factor=4)
    index = WorkspaceIndex(root, ds, byte_tokenize, "bytes", cache_dir=cache)
    index.build()
    assert len(ds.segments()) == 1 and len(ds.doc_ids()) == 4
    ds.close()


def test_an_index_folder_that_cannot_be_locked_leaves_the_index_in_memory(tmp_path, caplog):
    root, cache = tmp_path / "ws", tmp_path / "cache"
    root.mkdir()
    (root / "a.py").write_text("ROMARK = 1\n")
    ds = Datastore(background_merges=False)
    WorkspaceIndex(root, ds, byte_tokenize, "bytes", cache_dir=cache).build()
    ds.close()
    # Its lock cannot be opened for writing (as on a read-only mount, or a lock of another user); a folder in
    # its place does that even for root, whom permissions do not stop.
    lock = index_folder(cache, root.resolve()) / "lock"
    lock.unlink()
    lock.mkdir()

    ds = Datastore(background_merges=False)
    index = WorkspaceIndex(root, ds, byte_tokenize, "bytes", cache_dir=cache)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.datastore.indexer"):
        stats = index.build()
        (root / "b.py").write_text("LATER = 2\n")
        index.rescan()
        index.stop()
    assert set(ds.doc_ids()) == {str(root.resolve() / "a.py"), str(root.resolve() / "b.py")}
    assert not stats["saved"] and index.save_error
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    ds.close()
