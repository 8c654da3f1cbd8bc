"""A workspace file the indexer may not read (PermissionError) is skipped; the other files are indexed and the
build goes on. The tests run as root, where chmod 0 does not stop a read, so the reader's open() is made to fail
the way it does for a user without the permission."""

import errno
import os

from rest_lsp.datastore import Datastore, WorkspaceIndex


def byte_tokenize(texts: list[str]) -> list[list[int]]:
    return [list(t.encode("utf-8")) for t in texts]


def follows(ds: Datastore, context: str) -> set[str]:
    """Texts that follow `context` when it is matched in full."""
    ids = list(context.encode("utf-8"))
    got = ds.lookup(ids)
    if got.match_length < len(ids):
        return set()
    return {bytes(c).decode("utf-8", "replace") for c, _ in got.continuations}


def test_an_unreadable_file_is_skipped_and_the_rest_indexed(tmp_path, monkeypatch):
    root = (tmp_path / "ws").resolve()
    root.mkdir()
    (root / "readable.py").write_text("def alpha_marker(): return 1\n")
    locked = root / "locked.py"
    locked.write_text("nu_marker = 2\n")
    denied = []
    real_open = os.open

    def open_without_permission(path, flags, *args, **kwargs):
        if os.fspath(path) == str(locked):
            denied.append(path)
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_without_permission)
    ds = Datastore(background_merges=False, continuation_length=8)
    index = WorkspaceIndex(root, ds, byte_tokenize, "bytes-v1", cache_dir=tmp_path / "cache")
    index.build()

    assert denied, "the indexer never tried to read the locked file: the test would prove nothing"
    assert follows(ds, "def alpha_mark") == {"er(): re"}
    assert follows(ds, "nu_mark") == set()
    assert str(locked) not in ds.doc_ids()
