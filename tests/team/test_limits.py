"""The server's limits (limits.py, shared_model.LockedDecoder): an editor's settings may ask for less, never more;
every workspace counts against the replica's budget however it was made; a completion ends at the server's time
limit; work nobody waits for yields the decoder to a caller that waits."""

from __future__ import annotations

import threading

import pytest

from rest_lsp.team.protocol import API


def complete(client, ws, text="def f(x):\n    return ", settings=None, request_id="q1"):
    body = {"request_id": request_id, "doc_id": "file:///p/m.py", "text": text, "offset": len(text)}
    if settings is not None:
        body["settings"] = settings
    return client.post(f"{API}/workspaces/{ws}/complete", json=body)


def test_an_editor_may_ask_for_less_never_more(client, replica):
    from rest_lsp.team.limits import Limits

    limits = Limits()
    greedy = {"maxNewTokens": 4096, "timeBudgetMs": 0, "waitBudgetMs": 600000, "documentCacheMb": 100000}
    assert complete(client, "greedy", settings=greedy).status_code == 200
    assert complete(client, "modest", settings={"maxNewTokens": 3, "documentCacheMb": 8,
                                                "timeBudgetMs": 300}).status_code == 200
    got = {s.workspace: s.service.settings for s in replica.workspaces.states()}
    assert (got["greedy"].max_new_tokens, got["greedy"].document_cache_mb) == (limits.max_new_tokens,
                                                                              limits.kv_cache_mb)
    assert (got["greedy"].time_budget_ms, got["greedy"].wait_budget_ms) == (limits.completion_ms,
                                                                           limits.completion_ms)
    assert (got["modest"].max_new_tokens, got["modest"].document_cache_mb, got["modest"].time_budget_ms) == (3, 8, 300)


def test_workspaces_made_by_completions_count_against_the_budget(client, replica):
    from rest_lsp.team.workspaces import WORKSPACE_OVERHEAD_BYTES

    replica.workspaces.budget = 2 * WORKSPACE_OVERHEAD_BYTES + (1 << 20)
    for i in range(4):
        assert complete(client, f"editor-{i}").status_code == 200  # no snapshot: made by /complete alone
    assert replica.workspaces.names() == ["editor-2", "editor-3"]


@pytest.fixture()
def most_s(shared):
    """Sets the replica decoder's time limit for one test."""
    decoder = shared.decoder
    before = decoder._most_s

    def set_to(seconds: float) -> None:
        decoder._most_s = seconds

    yield set_to
    decoder._most_s = before


def test_a_completion_ends_at_the_servers_time_limit(client, most_s):
    text = "values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]\nfor v in values:\n    print(v"
    settings = {"maxNewTokens": 32, "maxLines": 0, "timeBudgetMs": 0, "draftBudget": 0}
    free = complete(client, "ws", text, settings).json()
    assert free["steps"] > 1
    most_s(0.0)  # every step is past the limit: the first one ends it
    capped = complete(client, "ws", text + " ", settings, request_id="q2").json()
    assert capped["steps"] == 1


def test_a_speculative_decoding_yields_to_a_caller_that_waits(shared):
    from rest_lsp.drafting.drafts import NoDrafts
    from rest_lsp.engine.decoding import DecodeConfig
    from rest_lsp.service.scheduling import Job

    decoder = shared.decoder
    prompt = shared.base.loaded.tokenizer.encode("def f(x):\n    return x +")
    config = DecodeConfig(max_new_tokens=16, budget=0)
    prefetch, request = Job("d", "a", "", speculative=True), Job("d", "b", "")
    holder, waiting = threading.Event(), threading.Event()

    def wait_for_the_decoder():
        holder.wait(10)
        waiting.set()
        with decoder.turn():
            pass

    with decoder.turn():  # the decoder is busy: a caller comes and waits for it
        other = threading.Thread(target=wait_for_the_decoder)
        other.start()
        holder.set()
        waiting.wait(10)
        while not decoder.others_wait():
            pass
        # (re-entrant: this thread holds the decoder) with a caller waiting, the prefetch stops, a request does not
        assert len(decoder.generate(prompt, NoDrafts(), config, cancelled=prefetch.cancelled).tokens) == 0
        assert len(decoder.generate(prompt, NoDrafts(), config, cancelled=request.cancelled).tokens) == 16
        assert decoder.prefill(prompt, stop=None) is not None
    other.join(10)
    assert not decoder.others_wait()
    assert len(decoder.generate(prompt, NoDrafts(), config, cancelled=prefetch.cancelled).tokens) == 16
