"""What the replica's app refuses before a workspace is touched (edge.py): bodies past their route's size (413),
bodies that do not validate (one sentence naming the field, never the input: 422), and calls without their
workspace's key (400); and how keys keep workspaces apart (workspaces.Owner)."""

from __future__ import annotations

import json

import pytest
from conftest import WORKSPACE_KEY

from rest_lsp.team.protocol import API, KEY_HEADER

OTHER_KEY = "o" * 40


def sentence_of(reply) -> str:
    detail = reply.json()["detail"]
    assert isinstance(detail, str) and detail.endswith(".") and "\n" not in detail and len(detail) <= 300, detail
    return detail


def post(client, route, raw: bytes, ws="ws1"):
    return client.post(f"{API}/workspaces/{ws}/{route}", content=raw, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("big", [2 ** 31, 2 ** 63, 2 ** 70])
def test_token_ids_past_any_vocabulary_are_a_422_not_a_500(client, shared, big):
    body = {"epoch": "e1", "tokenizer_key": shared.tokenizer_key, "docs": [{"doc_id": "a", "tokens": [1, big]}]}
    reply = client.post(f"{API}/workspaces/ws1/snapshot", json=body)
    assert reply.status_code == 422 and "docs[0].tokens[1]" in sentence_of(reply)
    assert client.post(f"{API}/workspaces/ws1/snapshot", json={**body, "docs": []}).status_code == 200
    named = {**body, "docs": [{"doc_id": "secret-name.py", "tokens": [shared.vocab_size]}]}
    reply = client.post(f"{API}/workspaces/ws1/snapshot", json=named)
    assert reply.status_code == 422 and "docs[0].tokens" in sentence_of(reply) and "secret" not in reply.text
    delta = {"epoch": "e1", "seq": 1, "puts": [{"doc_id": "b", "tokens": [big]}]}
    reply = client.post(f"{API}/workspaces/ws1/delta", json=delta)
    assert reply.status_code == 422 and "puts[0].tokens[0]" in sentence_of(reply)


@pytest.mark.parametrize("route,raw", [
    ("complete", '{"request_id":"r1","doc_id":"file:///u.py","text":"x = \\ud800","offset":5}'),
    ("accept", '{"id":null,"text":"z = \\ud800"}'),
    ("drafts", '{"text":"z = \\udfff"}'),
    ("events", '{"seq":1,"events":[{"kind":"change","doc_id":"a","text":"\\ud800","offset":0}]}'),
])
def test_a_lone_surrogate_is_a_422_on_every_route(client, shared, route, raw):
    client.post(f"{API}/workspaces/ws1/complete", json={"request_id": "w", "doc_id": "a", "text": "x", "offset": 1})
    reply = post(client, route, raw.encode())
    assert reply.status_code == 422, reply.text
    assert "text" in sentence_of(reply)


@pytest.mark.parametrize("route,raw,field", [
    ("complete", '{"request_id":"r","doc_id":"x","text":"abc","offset":NaN}', "offset"),
    ("complete", '{"request_id":"r","doc_id":"x","text":"abc","offset":Infinity}', "offset"),
    ("complete", '{"request_id":"r","doc_id":"x","text":"abc","offset":1.5}', "offset"),
    ("events", '{"seq":1e400,"events":[]}', "seq"),
    ("snapshot", '{"epoch":"e","tokenizer_key":"k","docs":[{"doc_id":"a","tokens":[1,NaN]}]}', "docs[0].tokens[1]"),
    ("snapshot", '{"epoch":"e","tokenizer_key":"k","settings":{"maxNewTokens":-Infinity}}', "settings"),
    ("complete", '{"request_id":"r","doc_id":"x","text":"abc","offset":true}', "offset"),
])
def test_non_finite_or_non_integer_numbers_are_a_422_naming_the_field(client, route, raw, field):
    reply = post(client, route, raw.encode())
    assert reply.status_code == 422, reply.text
    assert field in sentence_of(reply)


def test_a_wrong_shaped_body_gets_one_short_sentence_never_its_input(client):
    big = "x" * 3_000_000
    for body, field in (({"epoch": "e", "tokenizer_key": "k", "docs": big}, "docs"),
                        ({"epoch": "e", "tokenizer_key": "k", "docs": [{"doc_id": "a", "tokens": ["one"]}]},
                         "docs[0].tokens[0]"),
                        ({"epoch": "e", "tokenizer_key": "k", "surprise": big[:80]}, "surprise"),
                        ({"epoch": big, "tokenizer_key": "k"}, "epoch")):
        reply = client.post(f"{API}/workspaces/ws1/snapshot", json=body)
        assert reply.status_code == 422 and len(reply.content) < 1000
        said = sentence_of(reply)
        assert field in said and "xxxx" not in said
    assert sentence_of(post(client, "snapshot", b"{not json")) == "The request's body is not valid JSON."


def test_a_body_past_its_routes_limit_is_a_413_and_the_replica_keeps_serving(client, shared):
    from rest_lsp.team import edge

    assert edge.body_limit(f"{API}/workspaces/w/snapshot") == edge.SNAPSHOT_BYTES
    assert edge.body_limit(f"{API}/workspaces/w/snapshot/chunks/u1/3") == edge.CHUNK_BYTES
    assert edge.body_limit(f"{API}/workspaces/w/snapshot/chunks/u1/commit") == edge.DEFAULT_BYTES
    assert edge.body_limit(f"{API}/workspaces/w/drafts") == edge.DEFAULT_BYTES
    raw = b'{"text": "' + b"y" * edge.DEFAULT_BYTES + b'"}'
    reply = post(client, "drafts", raw)
    assert reply.status_code == 413 and "1 MiB" in sentence_of(reply)

    def streamed():  # no Content-Length: counted as it arrives
        yield b'{"epoch": "e1", "tokenizer_key": "k", "docs": [{"doc_id": "a", "tokens": ['
        for _ in range(edge.SNAPSHOT_BYTES // (1 << 20) + 1):
            yield b"1," * (1 << 19)
        yield b"1]}]}"

    reply = client.post(f"{API}/workspaces/ws1/snapshot", content=streamed(),
                        headers={"Content-Type": "application/json"})
    assert reply.status_code == 413 and "48 MiB" in sentence_of(reply)
    body = {"epoch": "e1", "tokenizer_key": shared.tokenizer_key, "docs": [{"doc_id": "a", "tokens": [1, 2]}]}
    assert client.post(f"{API}/workspaces/ws1/snapshot", json=body).status_code == 200


def test_every_workspace_route_wants_the_workspaces_key(client):
    routes = [("post", "snapshot", {}), ("post", "delta", {}), ("post", "complete", {}), ("post", "drafts", {}),
              ("get", "stats", None), ("post", "accept", {}), ("post", "cancel", {}), ("post", "events", {}),
              ("delete", "", None), ("get", "snapshot/chunks/u1", None), ("post", "snapshot/chunks/u1/0", None)]
    for key in ("", "short", "x" * 129, "has space " + "x" * 30, "ключ".encode() * 10):
        for method, route, body in routes:
            kwargs = {"json": body} if body is not None else {}
            reply = client.request(method, f"{API}/workspaces/w/{route}".rstrip("/"), headers={KEY_HEADER: key},
                                   **kwargs)
            assert reply.status_code == 400, (route, key, reply.text)
            assert KEY_HEADER in sentence_of(reply)


def test_another_key_is_another_workspace_it_reads_nothing_replaces_nothing_closes_nothing(client, shared, replica):
    secret = "def partner_discount(order):\n    return order.total * 0.37\n"
    body = {"epoch": "e1", "tokenizer_key": shared.tokenizer_key,
            "docs": [{"doc_id": "/p/pricing.py", "tokens": shared.base.loaded.tokenizer.encode(secret)}]}
    assert client.post(f"{API}/workspaces/victim/snapshot", json=body).status_code == 200
    mine = client.post(f"{API}/workspaces/victim/drafts", json={"text": "def partner_discount"}).json()
    assert any("order" in d["text"] for d in mine)
    other = {KEY_HEADER: OTHER_KEY}
    unknown = {KEY_HEADER: "u" * 40}
    for route, payload in (("drafts", {"text": "def partner_discount"}), ("accept", {"text": "x = 1"}),
                           ("cancel", {"request_id": "q"}), ("delta", {"epoch": "e1", "seq": 1}),
                           ("events", {"seq": 1})):
        theirs = client.post(f"{API}/workspaces/victim/{route}", json=payload, headers=other)
        nobodys = client.post(f"{API}/workspaces/never-made/{route}", json=payload, headers=unknown)
        assert (theirs.status_code, theirs.json()) == (nobodys.status_code, nobodys.json()), route
    stats = client.get(f"{API}/workspaces/victim/stats", headers=other).json()
    assert stats == client.get(f"{API}/workspaces/never-made/stats", headers=unknown).json()
    assert "victim" not in json.dumps(stats)
    assert client.delete(f"{API}/workspaces/victim", headers=other).json() == {"dropped": False}
    taken = client.post(f"{API}/workspaces/victim/snapshot", json={**body, "docs": []}, headers=other)
    assert taken.status_code == 200  # another editor's own workspace of that id: the victim's is untouched
    assert client.post(f"{API}/workspaces/victim/drafts", json={"text": "def partner_discount"}).json() == mine
    assert len(replica.workspaces) == 2
    assert client.delete(f"{API}/workspaces/victim").json() == {"dropped": True}


def test_a_workspace_id_is_percent_decoded_and_bounded(client, replica):
    reply = client.post(f"{API}/workspaces/my%20project%23%E2%9C%93/complete",
                        json={"request_id": "q", "doc_id": "a", "text": "x = ", "offset": 4})
    assert reply.status_code == 200
    assert replica.workspaces.names() == ["my project#✓"]
    reply = client.get(f"{API}/workspaces/{'w' * 201}/stats")
    assert reply.status_code == 422 and "workspace" in sentence_of(reply)


def test_the_key_binds_by_its_sha256_compared_in_constant_time():
    from rest_lsp.team.workspaces import Owner

    a = Owner.of("ws", WORKSPACE_KEY)
    assert a.digest != WORKSPACE_KEY.encode() and len(a.digest) == 32
    assert a.matches(Owner.of("ws", WORKSPACE_KEY)) and not a.matches(Owner.of("ws", OTHER_KEY))
    assert not a.matches(Owner.of("ws2", WORKSPACE_KEY))


def test_a_client_that_sends_its_whole_body_first_reads_the_413(live):
    """http.client sends all of a body before it reads the answer: the replica reads the rest (dropping it) and
    answers, rather than cutting the connection under it (a broken pipe, no answer)."""
    import http.client
    from urllib.parse import urlsplit

    from conftest import TOKEN

    url = urlsplit(live[0])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request("POST", f"{API}/workspaces/ws1/drafts", body=b'{"text": "' + b"y" * (24 << 20) + b'"}',
                     headers={"Authorization": f"Bearer {TOKEN}", KEY_HEADER: WORKSPACE_KEY,
                              "Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 413 and b"1 MiB" in reply.read()
    finally:
        conn.close()
