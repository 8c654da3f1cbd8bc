"""A snapshot goes gzip-compressed in bounded chunks (rest_lsp/team/upload_client.py): each chunk with a timeout of
its own, so an upload longer than any one timeout lands while it makes progress; a dropped connection resumes with
the chunks the server does not hold; an old server without the chunk routes gets it in one request."""

from __future__ import annotations

import gzip
import json
import random
import threading
import time

import pytest
from fake_team import FakeTeam
from support import TEAM_TOKEN as TOKEN
from support import Said, wait_for

from rest_lsp.settings import Settings
from rest_lsp.team import upload_client
from rest_lsp.team.http import Http, TimedOut
from rest_lsp.team.identity import new_key
from rest_lsp.team.remote import RemoteService
from rest_lsp.team.upload_client import ChunkedUpload

BASE = "/v1/workspaces/ws-1/snapshot"


@pytest.fixture()
def fake():
    team = FakeTeam()
    yield team
    team.close()


@pytest.fixture()
def small_chunks(monkeypatch):
    """Chunks of 100 kB (the link's rate would make them larger) and no wait before a resume."""
    monkeypatch.setattr(upload_client, "CHUNK_BYTES", 100_000)
    monkeypatch.setattr(upload_client, "FIRST_CHUNK_BYTES", 100_000)
    monkeypatch.setattr(upload_client, "RETRY_FIRST_S", 0.01)


def payload(docs: int = 40, tokens: int = 6000) -> dict:
    """A snapshot's JSON that gzip shrinks only so far (random token ids)."""
    rng = random.Random(0)
    body = {"epoch": "e1", "tokenizer_key": None, "settings": {},
            "docs": [{"doc_id": f"file:///m{d}.py", "tokens": [rng.randrange(50_000) for _ in range(tokens)],
                      "source": "workspace"} for d in range(docs)]}
    return body


def chunk_posts(team: FakeTeam) -> list:
    return [s for s in team.seen if s.method == "POST" and s.path.split("/")[-1].isdigit()]


def test_a_dropped_connection_resumes_with_the_chunks_the_server_lacks(fake, small_chunks):
    body = payload()
    body["tokenizer_key"] = fake.tokenizer["key"]
    data = json.dumps(body).encode()
    fake.drop = lambda seen: seen.path.endswith("/3") and sum(s.path.endswith("/3") for s in fake.seen) <= 2
    upload = ChunkedUpload(Http(fake.url, TOKEN, "ws-1", key=new_key()), BASE, data, threading.Event())
    reply = upload.send()
    assert reply["epoch"] == "e1" and fake.snapshots == [body]
    posts = chunk_posts(fake)
    count = len(upload.slices)
    assert count >= 5 and all(len(s.body) <= 100_000 for s in posts)
    assert gzip.decompress(b"".join(fake.uploads[upload.upload_id][i] for i in range(count))) == data
    sent = [int(s.path.split("/")[-1]) for s in posts]
    assert sent.count(3) == 3 and all(sent.count(i) == 1 for i in range(count) if i != 3)  # only the lost one again
    assert any(s.method == "GET" for s in fake.seen)  # it asked what arrived
    assert all(s.headers["Content-Type"] == "application/octet-stream" for s in posts)


def test_an_upload_longer_than_any_one_timeout_lands_while_each_chunk_makes_progress(fake, small_chunks,
                                                                                     monkeypatch):
    monkeypatch.setattr(upload_client, "SLACK_S", 0.6)
    monkeypatch.setattr(upload_client, "FIRST_RATE", 10_000_000)
    slow = fake.answer

    def answer(seen):
        if seen.path.split("/")[-1].isdigit():
            time.sleep(0.3)  # a slow link: every chunk takes its time
        return slow(seen)

    fake.answer = answer
    body = payload()
    body["tokenizer_key"] = fake.tokenizer["key"]
    started = time.monotonic()
    ChunkedUpload(Http(fake.url, TOKEN, "ws-1", key=new_key()), BASE, json.dumps(body).encode(),
                  threading.Event()).send()
    assert fake.snapshots == [body] and time.monotonic() - started > 1.5  # over twice any one chunk's timeout

    fake.answer = lambda seen: (time.sleep(3), slow(seen))[1]  # a link that stopped: found a chunk's time later
    upload = ChunkedUpload(Http(fake.url, TOKEN, "ws-1", key=new_key()), BASE, b"{}" * 100, threading.Event())
    started = time.monotonic()
    with pytest.raises(TimedOut):
        upload.send()
    assert time.monotonic() - started < 2 * upload_client.TRIES_WITHOUT_PROGRESS * 1.0 + 1


def editor(url, tmp_path):
    root = tmp_path / "ws"
    root.mkdir(exist_ok=True)
    for i in range(3):
        (root / f"m{i}.py").write_text("def count(x):\n    return x\n" * 50)
    settings = Settings(max_new_tokens=8, debounce_ms=0, prefetch=False, cache_dir=str(tmp_path / "client-cache"))
    said = Said()
    service = RemoteService(settings, said, url, TOKEN)
    service.start([root])
    return service, said


def test_the_editor_sends_its_snapshots_in_compressed_chunks(fake, tmp_path):
    service, said = editor(fake.url, tmp_path)
    try:
        wait_for(lambda: service.stats()["snapshots_sent"] >= 1, 30, "the snapshot")
        assert len(fake.snapshots[0]["docs"]) == 3
        posts = chunk_posts(fake)
        assert posts and all(s.body[:2] == b"\x1f\x8b" for s in posts)  # gzip
        assert not [s for s in fake.seen if s.path.endswith("/snapshot")]  # never the one-shot route
    finally:
        service.close()
    assert not said.messages


def test_an_old_server_without_the_chunk_routes_gets_each_snapshot_in_one_request(tmp_path):
    old = FakeTeam(chunks=False)
    service, said = editor(old.url, tmp_path)
    try:
        wait_for(lambda: service.stats()["snapshots_sent"] >= 1, 30, "the snapshot")
        old.need_snapshot = True
        service.submit("file:///m.py", "def count(", 10).future.result(30)
        wait_for(lambda: service.stats()["snapshots_sent"] >= 2, 30, "the second snapshot")
        one_shot = [s for s in old.seen if s.path.endswith("/snapshot")]
        assert len(one_shot) == 2 and all(s.headers["Content-Type"] == "application/json" for s in one_shot)
        assert len(chunk_posts(old)) == 1  # tried once; the 404 said it all
        assert service.stats()["status"] == "connected" and not said.messages
    finally:
        service.close()
        old.close()


def test_the_replica_app_takes_a_snapshot_in_chunks(live, tmp_path):
    """With the server's chunk routes (rest_lsp/team/uploads.py), the real app: no fallback, the workspace there."""
    pytest.importorskip("rest_lsp.team.uploads", reason="the replica app without the chunk routes")
    url, holder, _ = live
    service, said = editor(url, tmp_path)
    try:
        wait_for(lambda: service.stats()["snapshots_sent"] >= 1, 30, "the snapshot")
        assert service._chunked and service.drafts("def count") and not said.messages
    finally:
        service.close()
