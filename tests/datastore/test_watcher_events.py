"""Watcher events: one for a path nobody indexed costs O(1), and a folder that becomes (or stops being) a virtual
environment is taken out of (or back into) the index."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from rest_lsp.datastore import Datastore, WorkspaceIndex
from rest_lsp.datastore import known as known_module
from rest_lsp.datastore.known import KnownPaths

WAIT_S = 20.0


def byte_tokenize(texts: list[str]) -> list[list[int]]:
    return [list(t.encode("utf-8")) for t in texts]


class Indexed:
    """Waits, on the index's own change reports, until a path is in (or out of) the datastore."""

    def __init__(self):
        self.cond = threading.Condition()
        self.ds: Datastore | None = None

    def __call__(self, ids: list[str]) -> None:
        with self.cond:
            self.cond.notify_all()

    def wait(self, path: Path, present: bool) -> None:
        with self.cond:
            ok = self.cond.wait_for(lambda: (str(path) in self.ds) == present, WAIT_S)
        assert ok, f"{path} never {'indexed' if present else 'removed'}"


def test_known_paths_list_what_is_at_or_below_a_path_like_a_scan():
    rng = random.Random(0)
    names = [f"/r/{a}/{b}/{c}" for a in "xyz" for b in "pq" for c in ("f.py", "g.py", "h")] + ["/r/x", "/r/x/p"]
    known, plain = KnownPaths(), {}
    for _ in range(3000):
        path = rng.choice(names)
        if rng.random() < 0.5:
            known[path] = plain[path] = 1
        else:
            known.pop(path, None), plain.pop(path, None)
        probe = rng.choice([*names, "/r", "/r/y", "/r/w"])
        want = sorted(p for p in plain if p == probe or p.startswith(probe + "/"))
        assert sorted(known.at_or_below(probe)) == want
    assert dict(known) == plain


def test_events_for_paths_nobody_indexed_scan_no_table(tmp_path, monkeypatch):
    root = tmp_path.resolve()
    for i in range(40):
        (root / f"p{i % 4}").mkdir(exist_ok=True)
        (root / f"p{i % 4}" / f"m{i}.py").write_text(f"x = {i}\n")
    ds = Datastore(background_merges=False)
    index = WorkspaceIndex(root, ds, byte_tokenize, "bytes", persist=False)
    index.build()
    cache = root / "p1" / "__pycache__"
    cache.mkdir()
    (cache / "m1.cpython-311.pyc").write_bytes(b"\0pyc")
    walks = []
    monkeypatch.setattr(known_module.KnownPaths, "__iter__", lambda self: walks.append(1) or dict.__iter__(self))
    index._on_paths({str(cache), str(cache / "m1.cpython-311.pyc"), str(cache / "m1.cpython-311.pyc.123"),
                     str(root / "p2" / ".m5.py.swp"), str(root / "p3" / "new.py")})
    assert walks == []
    assert str(root / "p3" / "new.py") not in ds and len(ds.doc_ids()) == 40
    ds.close()


@pytest.fixture
def watched(tmp_path, monkeypatch):
    root = (tmp_path / "ws").resolve()
    (root / "tools").mkdir(parents=True)
    (root / "tools" / "make.py").write_text("MAKE = 1\n")
    (root / "old_env").mkdir()
    (root / "old_env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "old_env" / "keep.py").write_text("KEEP = 1\n")
    indexed = Indexed()
    ds = indexed.ds = Datastore(background_merges=False)
    index = WorkspaceIndex(root, ds, byte_tokenize, "bytes", persist=False, on_change=indexed)
    index.build()
    assert str(root / "tools" / "make.py") in ds and str(root / "old_env" / "keep.py") not in ds
    caught_up = threading.Event()  # the watcher's first rescan would see the changes without any event
    real_rescan = index.rescan
    monkeypatch.setattr(index, "rescan", lambda: (real_rescan(), caught_up.set())[0])
    index.start_watching()
    assert caught_up.wait(WAIT_S)
    yield root, ds, indexed
    index.stop()
    ds.close()


def test_a_folder_that_becomes_a_venv_leaves_the_index(watched):
    root, ds, indexed = watched
    (root / "tools" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    indexed.wait(root / "tools" / "make.py", present=False)
    site = root / "tools" / "lib" / "site-packages" / "somepkg"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("THIRD_PARTY = 1\n")
    (root / "after.py").write_text("AFTER = 1\n")  # events are applied in order: once it is in, so is the venv file
    indexed.wait(root / "after.py", present=True)
    assert str(site / "__init__.py") not in ds


def test_a_folder_that_stops_being_a_venv_joins_the_index(watched):
    root, ds, indexed = watched
    (root / "old_env" / "pyvenv.cfg").unlink()
    indexed.wait(root / "old_env" / "keep.py", present=True)
