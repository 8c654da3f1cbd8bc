"""The completion service without LSP: greedy equality, type-through, latest-wins, feedback."""

import shutil
import time

import pytest
from support import greedy
from step_gate import StepGate
from rest_lsp.service.completion import CompletionService
from rest_lsp.settings import Settings

BEFORE = "def add(a, b):\n    return a + b\n\nresult = add("
AFTER = ")\nprint(result)\n"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("ws")
    (root / "lib.py").write_text("def frobnicate_widget(count):\n    return count * 7\n")
    (root / ".gitignore").write_text("secret_*.py\n")
    (root / "secret_notes.py").write_text("def hidden_gadget(key):\n    return key\n")
    return root


@pytest.fixture(scope="module")
def service(tiny_models, tmp_path_factory, workspace):
    root = workspace
    settings = Settings(model=str(tiny_models["random"]), max_new_tokens=12, debounce_ms=0,
                        cache_dir=str(tmp_path_factory.mktemp("cache")))
    svc = CompletionService(settings)
    svc.start([root])
    assert svc.wait_ready(120), svc.load_error
    assert svc.wait_indexed(60)
    yield svc
    svc.close()


def test_completion_is_the_greedy_continuation_then_type_through(service, tiny_models):
    text = BEFORE + AFTER
    c = service.submit("mem://a.py", text, len(BEFORE)).future.result(60)
    assert c is not None and c.source == "model"
    assert c.text == greedy(tiny_models["random"], BEFORE, AFTER, 12)
    # the user types the first characters of the suggestion: the rest comes back without decoding
    typed = c.text[:3]
    decoded = service.stats()["completions_decoded"]
    future = service.submit("mem://a.py", BEFORE + typed + AFTER, len(BEFORE) + 3).future
    assert future.done()  # answered inside submit, never queued for the decoder
    t = future.result()
    assert t is not None and t.source == "type-through" and t.text == c.text[3:]
    stats = service.stats()
    assert stats["completions_decoded"] == decoded
    assert stats["completions_served"] >= 2 and stats["type_through"] >= 1
    assert stats["mean_tokens_per_step"] >= 1 and stats["last_latency_ms"] is not None


def test_workspace_file_and_accepted_text_become_drafts(service):
    assert service.stats()["documents"] >= 1
    assert any(t.startswith("(count") for t, _ in service.drafts("def frobnicate_widget"))
    assert service.accept(None, "zebra_quux_total = compute_zebra(limit=99)")
    assert any("(limit=99" in t for t, _ in service.drafts("zebra_quux_total = compute_zebra"))


def test_open_buffer_replaces_and_close_restores(service, tmp_path):
    doc = str(tmp_path / "buf.py")
    service.open_buffer(doc, "snark_value = hunt_the_snark(fit=8)\n")
    assert _wait_for(lambda: any("(fit=8" in t for t, _ in service.drafts("snark_value = hunt_the_snark"))), \
        "the open buffer never reached the datastore"
    service.close_buffer(doc)  # not in the workspace: it leaves the datastore
    assert _wait_for(lambda: service.drafts("snark_value = hunt_the_snark") == []), \
        "the closed buffer stayed in the datastore"


def test_latest_request_wins(tiny_models, monkeypatch):
    settings = Settings(model=str(tiny_models["constant"]), max_new_tokens=2000, draft_budget=0,
                        debounce_ms=0, index_workspace=False, prefetch=False)  # the gate records requests only
    gate = StepGate.in_process(monkeypatch)
    svc = CompletionService(settings)
    try:
        svc.start([])
        assert svc.wait_ready(120), svc.load_error
        # this one writes "x" until max_new_tokens (2000) unless something stops it
        first = svc.submit("mem://b.py", "x = ", 4)
        assert gate.started.wait(60), "the first request never started decoding"
        # the decoder is held inside its first step: the newer request arrives while it decodes
        svc.update_settings(Settings(**{**settings.__dict__, "max_new_tokens": 4}))
        second = svc.submit("mem://b.py", "y = ", 4)
        gate.release.set()
        assert first.future.result(120) is None  # stopped between steps, nothing shown
        c = second.future.result(120)
        assert c is not None and c.text == "xxxx"
        stopped, done = gate.results
        # the cancel, not the length limit, ended the first decode: after the one step it was in
        assert (stopped.finish, stopped.steps, len(stopped.tokens)) == ("stopped", 1, 1)
        assert (done.finish, len(done.tokens)) == ("length", 4)
        stats = svc.stats()
        assert stats["cancelled"] == 1 and stats["completions_decoded"] == 1
    finally:
        gate.release.set()
        svc.close()


def test_requests_before_the_model_is_ready_and_a_model_that_fails(tmp_path):
    svc = CompletionService(Settings(model=str(tmp_path / "missing"), index_workspace=False))
    try:
        # not started: answered at once (resolved before submit returns), empty, no error
        early = svc.submit("mem://c.py", "x = ", 4).future
        assert early.done() and early.result() is None
        svc.start([])
        assert not svc.wait_ready(60)
        assert "missing" in svc.load_error
        late = svc.submit("mem://c.py", "x = ", 4).future
        assert late.done() and late.result() is None
        assert svc.stats()["load_error"] == svc.load_error
    finally:
        svc.close()


def _wait_for(check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def test_closed_buffer_goes_back_to_what_the_indexer_keeps(service, workspace):
    def proposes(text, start):
        return any(t.startswith(start) for t, _ in service.drafts(text))

    # an indexed file: its buffer replaces it while open, the disk version comes back on close
    lib = str(workspace / "lib.py")
    service.open_buffer(lib, "def frobnicate_widget(size):\n    return size\n")
    assert _wait_for(lambda: proposes("def frobnicate_widget", "(size") and not proposes("def frobnicate_widget", "(count"))
    service.close_buffer(lib)
    assert _wait_for(lambda: proposes("def frobnicate_widget", "(count") and not proposes("def frobnicate_widget", "(size"))
    # a file the ignore rules skip: never indexed, and its closed buffer does not come back from disk
    secret = str(workspace / "secret_notes.py")
    assert not proposes("def hidden_gadget", "(")
    service.open_buffer(secret, "def hidden_gadget(value):\n    return value\n")
    assert _wait_for(lambda: proposes("def hidden_gadget", "(value"))
    service.close_buffer(secret)
    assert _wait_for(lambda: not proposes("def hidden_gadget", "("))


def test_a_new_tokenizer_replaces_the_datastore_and_closes_the_old_one(tiny_models, tmp_path):
    from transformers import AutoTokenizer

    # the same weights with one more token: another tokenizer key, so the datastore is rebuilt
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_models["random"], other)
    tok = AutoTokenizer.from_pretrained(str(other), local_files_only=True)
    tok.add_tokens(["zebra_quux_token"])
    tok.save_pretrained(other)
    settings = Settings(model=str(tiny_models["random"]), debounce_ms=0, index_workspace=False)
    svc = CompletionService(settings)
    try:
        svc.start([])
        assert svc.wait_ready(120), svc.load_error
        old = svc._datastore
        svc.accept(None, "gamma = compute_gamma(limit=3)")  # a write starts the old store's merge thread
        assert old._merger is not None and old._merger.is_alive()
        svc.update_settings(Settings(**{**settings.__dict__, "model": str(other)}))
        assert _wait_for(lambda: svc.ready and svc._datastore is not old, 120), svc.load_error
        assert _wait_for(lambda: not old._merger.is_alive())
        assert svc.drafts("gamma = compute_gamma") == []  # the new store starts empty
    finally:
        svc.close()
