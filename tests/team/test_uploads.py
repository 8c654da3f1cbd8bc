"""A snapshot sent in chunks (uploads.py): gzip slices in any order, resumed after a drop, committed with its
sha256, bounded per workspace and per replica, forgotten when idle; the one-shot snapshot route still works."""

from __future__ import annotations

import gzip
import hashlib
import json

import pytest

from rest_lsp.team.protocol import API, KEY_HEADER

LIB = "def frobnicate_widget(count):\n    return count * 7\n"


def snapshot_json(shared, text=LIB, epoch="e1") -> bytes:
    tokens = shared.base.loaded.tokenizer.encode(text)
    return json.dumps({"epoch": epoch, "tokenizer_key": shared.tokenizer_key,
                       "docs": [{"doc_id": "/p/lib.py", "tokens": tokens}]}).encode()


def chunks_of(data: bytes, n: int, members: bool) -> list[bytes]:
    """`n` chunks: slices of one gzip stream, or each slice a gzip stream of its own (`members`)."""
    if members:
        step = -(-len(data) // n)
        return [gzip.compress(data[i:i + step]) for i in range(0, len(data), step)]
    packed = gzip.compress(data)
    step = -(-len(packed) // n)
    return [packed[i:i + step] for i in range(0, len(packed), step)]


def put(client, index, data, ws="big", upload="u1"):
    return client.post(f"{API}/workspaces/{ws}/snapshot/chunks/{upload}/{index}", content=data,
                       headers={"Content-Type": "application/octet-stream"})


def commit(client, count, sha, ws="big", upload="u1"):
    return client.post(f"{API}/workspaces/{ws}/snapshot/chunks/{upload}/commit", json={"count": count, "sha256": sha})


@pytest.mark.parametrize("members", [False, True])
def test_chunks_in_any_order_resumed_then_committed_feed_the_workspace(client, shared, members):
    data = snapshot_json(shared)
    parts = chunks_of(data, 3, members)
    assert put(client, 2, parts[2]).status_code == 200
    assert put(client, 0, parts[0]).status_code == 200
    assert client.get(f"{API}/workspaces/big/snapshot/chunks/u1").json() == {"received": [0, 2]}
    early = commit(client, len(parts), hashlib.sha256(data).hexdigest())
    assert early.status_code == 409 and early.json()["kind"] == "snapshot"
    assert put(client, 1, parts[1]).status_code == 200  # the dropped one, sent again
    reply = commit(client, len(parts), hashlib.sha256(data).hexdigest())
    assert reply.status_code == 200 and reply.json()["epoch"] == "e1", reply.text
    found = client.post(f"{API}/workspaces/big/drafts", json={"text": "def frobnicate_widget"}).json()
    assert any(d["text"].startswith("(count") for d in found)
    assert client.get(f"{API}/workspaces/big/snapshot/chunks/u1").json() == {"received": []}  # gone once applied


def test_a_wrong_sha256_or_a_bad_snapshot_is_refused_in_one_sentence(client, shared):
    data = snapshot_json(shared)
    put(client, 0, gzip.compress(data))
    reply = commit(client, 1, "0" * 64)
    assert reply.status_code == 409 and "sha256" in reply.json()["detail"]
    bad = json.dumps({"epoch": "e1", "tokenizer_key": shared.tokenizer_key,
                      "docs": [{"doc_id": "a", "tokens": [2 ** 63]}]}).encode()
    put(client, 0, gzip.compress(bad))
    reply = commit(client, 1, hashlib.sha256(bad).hexdigest())
    assert reply.status_code == 422 and "docs[0].tokens[0]" in reply.json()["detail"]
    put(client, 0, b"not gzip at all")
    reply = commit(client, 1, hashlib.sha256(b"").hexdigest())
    assert reply.status_code == 422 and "gzip" in reply.json()["detail"]
    put(client, 0, gzip.compress(data)[:-12])
    reply = commit(client, 1, hashlib.sha256(data).hexdigest())
    assert reply.status_code == 422 and "cut short" in reply.json()["detail"]
    other = client.post(f"{API}/workspaces/big/snapshot/chunks/u2/commit", json={"count": 1, "sha256": "a" * 64})
    assert other.status_code == 409 and other.json()["kind"] == "snapshot"


def test_a_chunk_is_bounded_and_decompression_stops_at_the_snapshot_limit(client):
    from rest_lsp.team import edge, uploads

    assert put(client, 0, b"x" * (edge.CHUNK_BYTES + 1)).status_code == 413
    bomb = gzip.compress(b" " * (edge.SNAPSHOT_BYTES + 1))
    assert len(bomb) < edge.CHUNK_BYTES
    put(client, 0, bomb)
    reply = commit(client, 1, "0" * 64)
    assert reply.status_code == 413 and "MiB" in reply.json()["detail"]
    with pytest.raises(uploads.Refused):
        uploads.inflate(gzip.compress(b"a" * 1000) + gzip.compress(b"b" * 1000), 1500)
    assert uploads.inflate(gzip.compress(b"a" * 10) + gzip.compress(b"b" * 10), 20) == b"a" * 10 + b"b" * 10


def test_uploads_are_bounded_per_workspace_and_replica_and_expire():
    from rest_lsp.team.uploads import Refused, Uploads
    from rest_lsp.team.workspaces import Owner

    now = [0.0]
    held = Uploads(most_per_workspace=2, most_upload_bytes=100, most_bytes=250, idle_s=60, clock=lambda: now[0])
    a, b, a_other_key = Owner.of("a", "k" * 32), Owner.of("b", "k" * 32), Owner.of("a", "z" * 32)
    held.put(a, "u1", 0, b"x" * 60)
    held.put(a, "u2", 0, b"x" * 60)
    with pytest.raises(Refused) as err:
        held.put(a, "u3", 0, b"x")
    assert err.value.status == 429
    with pytest.raises(Refused) as err:
        held.put(a, "u1", 1, b"x" * 41)  # past one upload's bytes
    assert err.value.status == 413
    held.put(b, "u1", 0, b"x" * 100)
    with pytest.raises(Refused) as err:
        held.put(a_other_key, "u1", 0, b"x" * 40)  # past the replica's bytes
    assert err.value.status == 429
    assert held.received(a_other_key, "u1") == [] and held.received(a, "u1") == [0]
    now[0] = 61.0
    assert held.received(a, "u1") == [] and held.held() == 0
    held.put(a, "u1", 0, b"x")
    held.drop(a)
    assert held.received(a, "u1") == []


def test_another_key_neither_sees_nor_commits_an_upload(client, shared):
    data = snapshot_json(shared)
    put(client, 0, gzip.compress(data))
    other = {KEY_HEADER: "o" * 40}
    assert client.get(f"{API}/workspaces/big/snapshot/chunks/u1", headers=other).json() == {"received": []}
    reply = client.post(f"{API}/workspaces/big/snapshot/chunks/u1/commit", headers=other,
                        json={"count": 1, "sha256": hashlib.sha256(data).hexdigest()})
    assert reply.status_code == 409
    assert commit(client, 1, hashlib.sha256(data).hexdigest()).status_code == 200
