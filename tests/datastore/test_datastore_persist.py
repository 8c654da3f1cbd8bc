"""The index folder on disk: a damaged cache is rebuilt with one log line, a save that fails (a full disk) stops
nothing and is done again once there is space."""

from __future__ import annotations

import errno
import json
import logging

import numpy as np
import pytest
from test_datastore_store import assert_consistent
from test_datastore_workspace import Changes, follows, make_index, write_whole


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve(), tmp_path / "cache"


def _damage_meta(folder):
    p = next(folder.glob("*.meta.npz"))
    p.write_bytes(p.read_bytes()[:40])


def _damage_tokens(folder):
    next(folder.glob("*.tokens.npy")).write_bytes(b"")


def _damage_manifest_list(folder):
    (folder / "manifest.json").write_text("[]")


def _damage_manifest_json(folder):
    (folder / "manifest.json").write_text('{"format": ')


def _damage_dead(folder):
    m = json.loads((folder / "manifest.json").read_text())
    m["segments"][0]["dead"] = [5]
    (folder / "manifest.json").write_text(json.dumps(m))


def _damage_rsa_values(folder):
    p = next(folder.glob("*.rsa.npy"))
    a = np.load(p)
    np.save(p, a[::-1].copy())               # right shape and type, wrong content


def _damage_tokens_values(folder):
    p = next(folder.glob("*.tokens.npy"))
    a = np.load(p)
    a[3] = a[3] + 1
    np.save(p, a)


def _damage_docs(folder):
    next(folder.glob("*.docs.json")).write_text("{}")


DAMAGES = [_damage_meta, _damage_tokens, _damage_manifest_list, _damage_manifest_json, _damage_dead,
           _damage_rsa_values, _damage_tokens_values, _damage_docs]


@pytest.mark.parametrize("damage", DAMAGES, ids=[d.__name__[8:] for d in DAMAGES])
def test_a_damaged_cache_is_rebuilt_with_one_log_line(ws, damage, caplog):
    root, cache = ws
    (root / "a.txt").write_text("KEY hello there\n")
    index, ds = make_index(root, cache)
    index.build()
    folder = next((cache / "index").iterdir())
    damage(folder)
    caplog.set_level(logging.INFO, logger="rest_lsp.datastore")
    index2, ds2 = make_index(root, cache)
    stats = index2.build()
    assert not stats["loaded"] and stats["reindexed"] == 1 and stats["saved"]
    assert follows(ds2, "KEY") == {" hello t"}
    assert_consistent(ds2)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "rebuilding" in warnings[0].getMessage(), warnings
    index3, ds3 = make_index(root, cache)          # the rebuilt cache loads at the next start
    assert index3.build()["loaded"] and follows(ds3, "KEY") == {" hello t"}


def test_a_save_that_fails_does_not_stop_watching(ws, monkeypatch):
    root, cache = ws
    (root / "a.txt").write_text("KEY hello\n")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    real_save = np.save
    monkeypatch.setattr(np, "save", disk_full)
    changes = Changes()
    index, ds = make_index(root, cache, on_change=changes)
    stats = index.build()
    assert not stats["saved"] and "No space" in index.save_error and follows(ds, "KEY") == {" hello\n"}
    folder = next((cache / "index").iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["lock"]      # no half-written segment left behind
    index.start_watching()
    try:
        write_whole(root / "b.txt", "WATCHED still\n")
        changes.wait_for(root / "b.txt")
        assert follows(ds, "WATCHED") == {" still\n"}
    finally:
        monkeypatch.setattr(np, "save", real_save)                  # space again: stop() saves it all
        index.stop()
    index2, ds2 = make_index(root, cache)
    assert index2.build()["loaded"] and follows(ds2, "WATCHED") == {" still\n"}
