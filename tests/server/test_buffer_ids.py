"""An open buffer's datastore id is its file's id in the index, also under a workspace opened through a symlink."""

from __future__ import annotations

import os

from rest_lsp.datastore import Datastore, Source, WorkspaceIndex
from rest_lsp.lsp.server import _doc_id


def toks(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_a_buffer_replaces_its_file_under_a_symlinked_root(tmp_path):
    real = tmp_path / "data" / "proj"
    real.mkdir(parents=True)
    (real / "app.py").write_text("value = compute_old_name(x)\n")
    link = tmp_path / "src"
    os.symlink(real, link)  # the editor opened the workspace as .../src
    ds = Datastore(background_merges=False)
    index = WorkspaceIndex(link, ds, lambda texts: [toks(t) for t in texts], "bytes", persist=False)
    index.build()

    buffer_id = _doc_id((link / "app.py").as_uri())
    assert index.owns(buffer_id)
    ds.put(buffer_id, toks("value = compute_new_name(x)\n"), Source.OPEN_BUFFER)
    found = {bytes(c).decode() for c, _ in ds.lookup(toks("value = compute_")).continuations}
    assert len(ds.doc_ids()) == 1 and all(c.startswith("new_name") for c in found)
    ds.close()


def test_buffers_without_a_file_keep_their_uri():
    assert _doc_id("untitled:Untitled-1") == "buffer:untitled:Untitled-1"
