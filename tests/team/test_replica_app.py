"""The replica's app without Ray: the sync protocol, auth, bad bodies, isolation of workspaces, the LRU."""

from __future__ import annotations

import pytest

from rest_lsp.team.protocol import API

LIB = "def frobnicate_widget(count):\n    return count * 7\n"
OTHER = "def zebra_quux_total(limit):\n    return limit + 99\n"


def encode(shared, text):
    return shared.base.loaded.tokenizer.encode(text)


def snapshot(client, shared, ws="ws1", epoch="e1", docs=None, key=None):
    docs = docs if docs is not None else {"/p/lib.py": LIB}
    body = {"epoch": epoch, "tokenizer_key": key or shared.tokenizer_key,
            "docs": [{"doc_id": d, "tokens": encode(shared, t)} for d, t in docs.items()]}
    return client.post(f"{API}/workspaces/{ws}/snapshot", json=body)


def delta(client, shared, seq, ws="ws1", epoch="e1", puts=None, removes=()):
    body = {"epoch": epoch, "seq": seq, "removes": list(removes),
            "puts": [{"doc_id": d, "tokens": encode(shared, t)} for d, t in (puts or {}).items()]}
    return client.post(f"{API}/workspaces/{ws}/delta", json=body)


def drafts(client, text, ws="ws1"):
    return [d["text"] for d in client.post(f"{API}/workspaces/{ws}/drafts", json={"text": text}).json()]


def complete(client, text, offset=None, ws="ws1", request_id="q1"):
    body = {"request_id": request_id, "doc_id": "file:///p/main.py", "text": text,
            "offset": len(text) if offset is None else offset}
    return client.post(f"{API}/workspaces/{ws}/complete", json=body)


def test_snapshot_then_deltas_feed_the_workspace(client, shared):
    reply = snapshot(client, shared)
    assert reply.status_code == 200 and reply.json()["seq"] == 0 and not reply.json()["need_snapshot"]
    assert any(t.startswith("(count") for t in drafts(client, "def frobnicate_widget"))
    assert delta(client, shared, 1, puts={"/p/other.py": OTHER}).json()["need_snapshot"] is False
    assert any("(limit" in t for t in drafts(client, "def zebra_quux_total"))
    assert delta(client, shared, 2, removes=["/p/lib.py"]).json()["seq"] == 2
    assert drafts(client, "def frobnicate_widget") == []
    # a delta sent again (its answer was lost) is not applied twice and asks for nothing
    again = delta(client, shared, 2, removes=["/p/lib.py"]).json()
    assert again["seq"] == 2 and not again["need_snapshot"]


def test_a_gap_in_the_sequence_asks_for_a_snapshot(client, shared):
    snapshot(client, shared)
    assert delta(client, shared, 1, puts={"/p/a.py": OTHER}).json()["seq"] == 1
    gap = delta(client, shared, 3, puts={"/p/b.py": OTHER}).json()
    assert gap["need_snapshot"] and gap["seq"] == 1 and "gap" in gap["reason"]


def test_a_new_epoch_replaces_the_workspace_and_ends_the_old_one(client, shared):
    snapshot(client, shared, epoch="e1")
    snapshot(client, shared, epoch="e2", docs={"/p/other.py": OTHER})
    assert drafts(client, "def frobnicate_widget") == []
    assert any("(limit" in t for t in drafts(client, "def zebra_quux_total"))
    stale = delta(client, shared, 1, epoch="e1", puts={"/p/lib.py": LIB}).json()
    assert stale["need_snapshot"] and stale["epoch"] == "e2"
    assert drafts(client, "def frobnicate_widget") == []


def test_a_delta_for_an_unknown_workspace_asks_for_a_snapshot(client, shared):
    reply = delta(client, shared, 1, ws="never-seen", puts={"/p/a.py": LIB}).json()
    assert reply["need_snapshot"] and reply["reason"] == "unknown workspace"


def test_another_tokenizer_is_refused_with_a_sentence(client, shared):
    reply = snapshot(client, shared, key="0123456789abcdef")
    assert reply.status_code == 409
    assert reply.json()["kind"] == "tokenizer" and "0123456789abcdef" in reply.json()["detail"]
    assert drafts(client, "def frobnicate_widget") == []


def test_auth_on_every_route_but_health(client, shared):
    from rest_lsp.team.app import create_app  # noqa: F401 - the fixture built it

    routes = [("get", f"{API}/tokenizer", None), ("post", f"{API}/workspaces/w/snapshot", {}),
              ("post", f"{API}/workspaces/w/delta", {}), ("post", f"{API}/workspaces/w/complete", {}),
              ("post", f"{API}/workspaces/w/drafts", {"text": "x"}), ("get", f"{API}/workspaces/w/stats", None),
              ("post", f"{API}/workspaces/w/accept", {}), ("post", f"{API}/workspaces/w/cancel", {}),
              ("post", f"{API}/workspaces/w/events", {}), ("delete", f"{API}/workspaces/w", None)]
    for header in ({}, {"Authorization": "Bearer wrong-token-wrong-token-000"}, {"Authorization": "Basic x"},
                   {"Authorization": "Bearer"}):
        for method, path, body in routes:
            kwargs = {"json": body} if body is not None else {}
            reply = client.request(method, path, headers={"Authorization": ""} | header, **kwargs)
            assert reply.status_code == 401, (path, header)
            assert reply.headers["www-authenticate"] == "Bearer"
    assert client.get("/health", headers={"Authorization": ""}).json() == {"status": "ok"}
    right = client.get(f"{API}/tokenizer").json()
    assert right["key"] == shared.tokenizer_key and right["vocab_size"] == shared.vocab_size


@pytest.mark.parametrize("body", [
    {"epoch": "e1"},                                                         # no tokenizer key
    {"epoch": "e1", "tokenizer_key": "k", "docs": [{"doc_id": "a", "tokens": ["x"]}]},
    {"epoch": "e1", "tokenizer_key": "k", "docs": "all of them"},
    {"epoch": "e1", "tokenizer_key": "k", "surprise": 1},
])
def test_a_bad_body_is_a_clear_4xx_and_the_replica_keeps_serving(client, shared, body):
    reply = client.post(f"{API}/workspaces/ws1/snapshot", json=body)
    assert reply.status_code == 422 and reply.json()["detail"]
    assert client.post(f"{API}/workspaces/ws1/snapshot", content=b"{not json").status_code == 422
    assert complete(client, "x = 1\n", offset=10**6).status_code == 200  # an offset past the end is clamped
    assert snapshot(client, shared).status_code == 200


def test_token_ids_outside_the_vocabulary_are_refused(client, shared):
    body = {"epoch": "e1", "tokenizer_key": shared.tokenizer_key,
            "docs": [{"doc_id": "/p/a.py", "tokens": [1, shared.vocab_size]}]}
    reply = client.post(f"{API}/workspaces/ws1/snapshot", json=body)
    assert reply.status_code == 422 and "outside" in reply.json()["detail"]
    assert snapshot(client, shared).status_code == 200


def test_a_workspace_the_replica_lacks_is_answered_and_asks_for_a_snapshot(client, shared):
    first = complete(client, "def f(x):\n    return ", ws="fresh").json()
    assert first["need_snapshot"] and first["replica"] == "r0"
    snapshot(client, shared, ws="fresh")
    second = complete(client, "def f(x):\n    return ", ws="fresh", request_id="q2").json()
    assert not second["need_snapshot"] and second["text"] == first["text"]


def test_one_workspace_never_drafts_from_another(client, shared):
    snapshot(client, shared, ws="alice", docs={"/p/lib.py": LIB})
    snapshot(client, shared, ws="bob", docs={"/p/other.py": OTHER})
    assert drafts(client, "def frobnicate_widget", ws="bob") == []
    assert drafts(client, "def zebra_quux_total", ws="alice") == []
    assert client.post(f"{API}/workspaces/alice/accept", json={"text": "alice_only_name = 4242"}).json()["accepted"]
    assert any("4242" in t for t in drafts(client, "alice_only_name", ws="alice"))
    assert drafts(client, "alice_only_name", ws="bob") == []


def test_an_editor_that_closes_frees_its_workspace(client, shared, replica):
    snapshot(client, shared, ws="gone")
    assert "gone" in replica.workspaces.names()
    assert client.delete(f"{API}/workspaces/gone").json() == {"dropped": True}
    assert "gone" not in replica.workspaces.names()
    assert delta(client, shared, 1, ws="gone", puts={"/p/x.py": OTHER}).json()["need_snapshot"]
    assert client.delete(f"{API}/workspaces/gone").json() == {"dropped": False}


def test_the_least_recently_used_workspace_goes_over_the_budget(client, shared, replica):
    from rest_lsp.team.workspaces import WORKSPACE_OVERHEAD_BYTES

    replica.workspaces.budget = 2 * WORKSPACE_OVERHEAD_BYTES + (1 << 20)
    for ws in ("a", "b", "c"):
        snapshot(client, shared, ws=ws)
    assert replica.workspaces.names() == ["b", "c"]
    assert delta(client, shared, 1, ws="a", puts={"/p/x.py": OTHER}).json()["need_snapshot"]


def test_every_setting_is_forwarded_kept_by_the_server_or_local_to_the_editor():
    import dataclasses

    from rest_lsp.settings import Settings
    from rest_lsp.team.protocol import CLIENT_SETTINGS, LOCAL_SETTINGS, SERVER_SETTINGS

    fields = {"".join(w.capitalize() if i else w for i, w in enumerate(f.name.split("_")))
              for f in dataclasses.fields(Settings)}
    groups = [CLIENT_SETTINGS, SERVER_SETTINGS, LOCAL_SETTINGS]
    assert set().union(*groups) == fields  # a new setting must be placed in one of them
    assert sum(map(len, groups)) == len(fields)  # and in one only


def test_the_editors_suggestion_settings_reach_its_workspace(client, shared, replica):
    """extraContextTokens (and every other forwarded setting) rides with a completion and is the workspace's."""
    from rest_lsp.settings import Settings
    from rest_lsp.team.remote import _client_settings

    editor = Settings(extra_context_tokens=192, context_tokens=512, max_lines=3, draft_exclude=("outputs",))
    sent = _client_settings(editor)
    assert sent["extraContextTokens"] == 192
    body = {"request_id": "q1", "doc_id": "file:///p/main.py", "text": "x = 1\n", "offset": 6, "settings": sent}
    assert client.post(f"{API}/workspaces/ws1/complete", json=body).status_code == 200
    [state] = replica.workspaces.states()
    got = state.service.settings
    assert (got.extra_context_tokens, got.context_tokens, got.max_lines, got.draft_exclude) == (
        192, 512, 3, ("outputs",))


def test_each_log_line_of_a_request_names_its_workspace(client, shared, replica):
    import logging
    import threading

    from rest_lsp.team import workspaces
    from rest_lsp.team.workspaces import WorkspaceTag, thread_workspace

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append((record.getMessage(), threading.current_thread().name))

    handler = Keep()
    handler.addFilter(WorkspaceTag())
    ours = logging.getLogger("rest_lsp")
    level = ours.level
    ours.addHandler(handler)
    ours.setLevel(logging.DEBUG)
    try:
        for ws in ("alice", "bob"):
            assert snapshot(client, shared, ws=ws).status_code == 200
            assert complete(client, "def f(x):\n    return ", ws=ws).status_code == 200
        # each workspace's decoding thread is known as its own, and a line logged on such a thread names it
        for ws in ("alice", "bob"):
            assert [t.name for t in threading.enumerate() if thread_workspace(t) == ws].count("rest-lsp-decoder") == 1
        probe = threading.Thread(target=lambda: logging.getLogger("rest_lsp.service").warning("probe"))
        with workspaces._THREADS_LOCK:
            workspaces._THREADS[probe] = "bob"  # as bob's decoding thread is
        probe.start()
        probe.join(10)
    finally:
        ours.removeHandler(handler)
        ours.setLevel(level)
    said = [m for m, _ in lines]
    for ws in ("alice", "bob"):
        assert any(m.startswith(f"[{ws}] new on this replica") for m in said), said
        assert any(m.startswith(f"[{ws}] snapshot e1") for m in said), said
        assert any(m.startswith(f"[{ws}] completion q1") for m in said), said
    assert "[bob] probe" in said
    untagged = [(m, t) for m, t in lines if not m.startswith(("[alice] ", "[bob] "))]
    assert untagged == []
