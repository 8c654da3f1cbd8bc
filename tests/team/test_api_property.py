"""Property-based test of the replica's HTTP API against its own OpenAPI schema (schemathesis strategies, run by
hypothesis in-process on the FastAPI app: no Ray): every route gets generated bodies, paths and headers that fit
the schema and ones that do not (schemathesis' negative mode), each sent once with the generated headers and once
with the workspace's key; none may get a 5xx or a reply past REPLY_BYTES (but /v1/tokenizer, whose reply is the
tokenizer). Hostile bodies the schema cannot express (NaN, ids past int64, lone surrogates, deep nesting) go to
every route that takes a body too."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import TOKEN, WORKSPACE_KEY

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from rest_lsp.team.protocol import KEY_HEADER  # noqa: E402

EXAMPLES = 20  # per route and mode
REPLY_BYTES = 16 << 10
SENT: Counter = Counter()  # bodies sent, by route


def _schema():
    from rest_lsp.team.app import create_app

    return schemathesis.openapi.from_dict(create_app(lambda: None).openapi())


OPERATIONS = [result.ok() for result in _schema().get_all_operations()]
# (a route, a mode): requests that do not fit need something to get wrong (a path or a body)
CASES = [pytest.param(o, m, id=f"{o.label}-{m.value}") for o in OPERATIONS
         for m in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
         if m is GenerationMode.POSITIVE or len(o.body) or any(p.location == "path" for p in o.iter_parameters())]


@pytest.fixture()
def app(replica):
    from rest_lsp.team.app import create_app
    from rest_lsp.team.workspaces import WORKSPACE_OVERHEAD_BYTES

    replica.workspaces.budget = 2 * WORKSPACE_OVERHEAD_BYTES  # the generated workspaces come and go
    return create_app(lambda: replica)


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print("\nbodies sent per route:", ", ".join(f"{k} {v}" for k, v in sorted(SENT.items())))


def _check(label: str, status: int, content: bytes) -> None:
    assert status < 500, (label, status, content[:300])
    if not label.endswith("/tokenizer"):
        assert len(content) <= REPLY_BYTES, (label, status, len(content))


@pytest.mark.parametrize("operation,mode", CASES)
def test_no_generated_request_gets_a_5xx_or_a_big_reply(app, operation, mode):
    from fastapi.testclient import TestClient

    client = TestClient(app, raise_server_exceptions=True)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        kwargs = case.as_transport_kwargs(base_url="http://testserver")
        for extra in ({"Authorization": f"Bearer {TOKEN}"},
                      {"Authorization": f"Bearer {TOKEN}", KEY_HEADER: WORKSPACE_KEY}):
            headers = {**(kwargs.get("headers") or {}), **extra}
            reply = client.request(kwargs["method"], kwargs["url"], headers=headers, params=kwargs.get("params"),
                                   content=_content(kwargs))
            SENT[operation.label] += 1
            _check(operation.label, reply.status_code, reply.content)

    run()


def _content(kwargs: dict) -> bytes | None:
    if "json" in kwargs:
        return json.dumps(kwargs["json"]).encode()
    data = kwargs.get("data", kwargs.get("content"))
    return data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data


HOSTILE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-0", "1.5",
                                                          str(2 ** 63), str(2 ** 70), "-1"]).map(lambda r: ("raw", r)),
              st.text(max_size=20).map(json.dumps), st.just('"\\ud800 lone"'), st.just('"\\udfff"')),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(
        st.sampled_from(["epoch", "tokenizer_key", "docs", "doc_id", "tokens", "seq", "puts", "removes", "text",
                         "offset", "request_id", "events", "kind", "settings", "id", "count", "sha256",
                         "maxNewTokens", "source"]), inner, max_size=6)),
    max_leaves=30)


def _raw(value) -> str:
    """JSON text, with NaN, huge numbers and lone surrogates as they come over the wire."""
    if isinstance(value, tuple):
        return value[1]
    if isinstance(value, list):
        return "[" + ",".join(_raw(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f'"{k}":{_raw(v)}' for k, v in value.items()) + "}"
    return value if isinstance(value, str) else json.dumps(value)


BODY_ROUTES = ["snapshot", "delta", "events", "complete", "cancel", "accept", "drafts",
               "snapshot/chunks/u1/commit"]


@pytest.mark.parametrize("route", BODY_ROUTES)
def test_hostile_json_gets_a_4xx_sentence_on_every_route(client, route):
    deep = "[" * 5000 + "]" * 5000

    @settings(max_examples=EXAMPLES * 2, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=HOSTILE)
    def run(body):
        for raw in (_raw(body), deep):
            reply = client.post(f"/v1/workspaces/hostile/{route}", content=raw.encode("utf-8", "surrogatepass"),
                                headers={"Content-Type": "application/json"})
            SENT[f"POST /v1/workspaces/{{workspace}}/{route} (hostile)"] += 1
            _check(route, reply.status_code, reply.content)
            if reply.status_code >= 400:
                assert isinstance(reply.json()["detail"], str)

    run()
