"""Credentials open in the editor (a .env, an id_rsa, a file below ~/.ssh) are never fed into the datastore, so never
drafted, and a workspace root inside a folder of credentials is not indexed: the indexer's rule (ignore.is_secret)
applied to the feed (rest_lsp/service/feeding.py)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest
from support import wait_for

from rest_lsp.service.feeding import DatastoreFeed
from rest_lsp.settings import Settings

SECRETS = [".env", "deploy/id_rsa", ".ssh/config", "app/.env.production", "certs/tls.key"]


@pytest.fixture()
def feed(tmp_path):
    quiet = lambda *args: None  # noqa: E731
    host = SimpleNamespace(
        _lock=threading.RLock(), settings=Settings(cache_dir=str(tmp_path / "cache")),
        _loaded=SimpleNamespace(tokenizer=SimpleNamespace(key="bytes")), _ready=threading.Event(),
        events=SimpleNamespace(index_begin=quiet, index_progress=quiet, index_end=quiet),
        _tokenize_batch=lambda texts: [list(t.encode()) for t in texts], _report=quiet, _spawn=quiet)
    feed = DatastoreFeed(host)
    with host._lock:
        feed.reset()
    host._ready.set()
    yield feed
    for thread in feed.close():
        thread.join(10)
    feed.datastore.close()


def test_an_open_credential_never_reaches_the_datastore(feed, tmp_path):
    secrets = [str(tmp_path / rel) for rel in SECRETS]
    secrets += ["buffer:untitled:.env", "buffer:vscode-remote://ssh-remote%2Bbox/home/u/.aws/credentials"]
    for doc_id in secrets:
        feed.open_buffer(doc_id, "AWS_SECRET_ACCESS_KEY=hunter2hunter2\n")
    code = str(tmp_path / "main.py")
    feed.open_buffer(code, "def main():\n    pass\n")  # fed after the ones opened before it, in the same pass
    wait_for(lambda: code in feed.datastore.doc_ids(), what="the code buffer to be fed")
    assert set(feed.datastore.doc_ids()) == {code}


def test_a_root_inside_a_folder_of_credentials_is_not_indexed(feed, tmp_path, caplog):
    home = tmp_path / "home"
    for rel in (".aws/cli/alias.py", ".ssh/helper.py", "project/main.py"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text("def helper():\n    return 1\n")
    feed.roots = [home / ".aws" / "cli", home / ".ssh", home / "project"]
    caplog.set_level(logging.WARNING, logger="rest_lsp.service.feeding")
    feed.index_roots()
    assert set(feed.datastore.doc_ids()) == {str((home / "project" / "main.py").resolve())}
    said = [r.getMessage() for r in caplog.records if "Not indexing" in r.getMessage()]
    assert len(said) == 2 and all("credentials" in line for line in said)
