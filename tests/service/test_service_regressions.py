"""Regression tests of issue 13's service and server items: the completion service driven directly, the server's
document and cursor handling, and one end-to-end stale-reply check over stdio. Tiny models (conftest_server)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from support import chain_model as _chain_model, greedy, server_command, start, wait_for
from lsprotocol import types

import rest_lsp.service.completion as completion_module
from rest_lsp.service.completion import CompletionService, NoEvents, finish_text
from rest_lsp.engine.lean_llama import LayerStack
from rest_lsp.engine.model import Tokenizer
from rest_lsp.service.postprocess import stop_context
from rest_lsp.settings import Settings

BEFORE = "def add(a, b):\n    return a + b\n\nresult = add("
AFTER = ")\nprint(result)\n"


class Events(NoEvents):
    def __init__(self):
        self.messages: list[tuple[str, str]] = []

    def message(self, level: str, text: str) -> None:
        self.messages.append((level, text))

    def said(self, part: str) -> str | None:
        return next((text for _, text in self.messages if part in text), None)


def _service(settings: Settings, events=None, roots=()) -> CompletionService:
    svc = CompletionService(settings, events)
    svc.start(list(roots))
    assert svc.wait_ready(120), svc.load_error
    return svc


@pytest.fixture(scope="module")
def service(tiny_models):
    svc = _service(Settings(model=str(tiny_models["random"]), max_new_tokens=12, debounce_ms=0,
                            index_workspace=False))
    yield svc
    svc.close()


def _other_tokenizer(tiny_models, folder: Path) -> Path:
    """The same weights with one more token: another tokenizer key, so a switch replaces the datastore."""
    from transformers import AutoTokenizer

    shutil.copytree(tiny_models["random"], folder)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tok.add_tokens(["zebra_quux_token"])
    tok.save_pretrained(folder)
    return folder


def _loader_threads() -> set[threading.Thread]:
    """The threads that load the model and index the workspace (the loader starts the indexer and ends)."""
    return {t for t in threading.enumerate() if t.name in ("rest-lsp-loader", "rest-lsp-indexer") and t.is_alive()}


# -- 1. a model switch while the watcher indexes ----------------------------------------------------------------


def test_a_model_switch_while_the_watcher_indexes_does_not_deadlock(tiny_models, tmp_path, monkeypatch):
    other = _other_tokenizer(tiny_models, tmp_path / "other")
    root = tmp_path / "ws"
    root.mkdir()
    (root / "lib.py").write_text("def frobnicate(count):\n    return count * 7\n")
    entered, release = threading.Event(), threading.Event()
    real = CompletionService._tokenize_batch

    def gated(self, texts):  # the watcher's batch for big.py stays inside the tokenizer until released
        if any("GATE_MARKER" in t for t in texts):
            entered.set()
            release.wait(60)
        return real(self, texts)

    monkeypatch.setattr(CompletionService, "_tokenize_batch", gated)
    settings = Settings(model=str(tiny_models["random"]), debounce_ms=0, cache_dir=str(tmp_path / "cache"))
    svc = _service(settings, roots=[root])
    deadlocked = True
    try:
        assert svc.wait_indexed(60)
        index = svc._indexes[str(root)]
        stopping = threading.Event()
        real_stop = index.stop

        def stop():
            stopping.set()
            real_stop()

        index.stop = stop
        (root / "big.py").write_text("GATE_MARKER = 1\n")
        assert entered.wait(30), "the watcher did not index the new file"
        old = svc._datastore
        svc.update_settings(dataclasses.replace(settings, model=str(other)))
        assert stopping.wait(120), "the loader never stopped the old index"
        release.set()  # the watcher now commits big.py and calls back into the service
        answered = threading.Event()
        threading.Thread(target=lambda: (svc.submit("mem://a.py", "x = ", 4), svc.stats(), answered.set()),
                         daemon=True).start()
        assert answered.wait(30), "deadlock: submit() blocked on the service lock held across the watcher's join"
        deadlocked = False
        wait_for(lambda: svc.ready and svc._datastore is not old, 60, "the new model")
    finally:
        release.set()
        if not deadlocked:
            svc.close()


# -- 2. a failure inside the forward pass -------------------------------------------------------------------------


def _fail_once(svc: CompletionService):
    """The next forward pass fails in layer 1, as an out-of-memory would; returns a handle to `remove()`."""
    fired = []
    decoder = svc._decoder
    if decoder.lean is None:
        def boom(module, args, kwargs):
            if not fired:
                fired.append(1)
                raise RuntimeError("CUDA out of memory (simulated)")

        return decoder.model.model.layers[1].register_forward_pre_hook(boom, with_kwargs=True)
    lean = decoder.lean
    scripted = lean.stack

    def failing_layer(module, args):  # the lean layers, run in Python for this: a hook fails layer 1
        if not fired:
            fired.append(1)
            raise RuntimeError("CUDA out of memory (simulated)")

    hook = lean.layers[1].register_forward_pre_hook(failing_layer)
    lean.stack = LayerStack(lean.layers, lean.norm, lean.eps)

    def remove():
        hook.remove()
        lean.stack = scripted

    return SimpleNamespace(remove=remove)


def test_a_failure_inside_the_forward_pass_does_not_poison_later_completions(service, tiny_models):
    # no work ahead: a prefetch still running when the failure is set up would meet it instead of the request
    service.update_settings(Settings(**{**service.settings.__dict__, "prefetch": False}))
    base = "import os\n\ndef add(a, b):\n    return a + b\n\nresult = add(1, 2)\n"
    first = base + "value = add("
    assert service.submit("mem://p14.py", first + "\n", len(first)).future.result(60) is not None
    handle = _fail_once(service)
    try:
        failing = base + "total = mul("
        assert service.submit("mem://p14.py", failing + "\n", len(failing)).future.result(60) is None
    finally:
        handle.remove()
    for tail in ("value = add(", "value = add(3", "x = os.path.join("):
        c = service.submit("mem://p14.py", base + tail + "\n", len(base + tail)).future.result(60)
        assert (c.text if c else "") == greedy(tiny_models["random"], base + tail, "\n", 12), tail


# -- 3. line breaks -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sep", ["\x0c", "\u2028", "\x85", "\x0b"])
def test_positions_and_edits_follow_lsp_line_breaks_only(sep):
    from rest_lsp.server import LspTextDocument, _cursor

    uri = "file:///tmp/ff.py"
    text = f"import os\n{sep}\ndef f():\n    return 1\n\nvalue = f("
    doc = LspTextDocument(uri, text, sync_kind=types.TextDocumentSyncKind.Incremental)
    ls = SimpleNamespace(workspace=SimpleNamespace(text_documents={uri: doc}))
    lines = text.split("\n")  # what the client counts
    _, offset, pos = _cursor(ls, uri, types.Position(line=len(lines) - 1, character=len(lines[-1])))
    assert offset == len(text) and (pos.line, pos.character) == (5, len("value = f("))
    doc.apply_change(types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(2, 0), end=types.Position(2, 0)), text="@dec\n"))
    assert doc.source == text.replace("def f()", "@dec\ndef f()")
    crlf = LspTextDocument(uri, "a\r\nb\rc\nd", sync_kind=types.TextDocumentSyncKind.Incremental)
    assert crlf.lines == ["a\r\n", "b\r", "c\n", "d"]


# -- 4. no broken character -----------------------------------------------------------------------------------


def test_a_suggestion_cut_inside_a_character_ends_before_it(tiny_models, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    chain = tok("ab😀", add_special_tokens=False)["input_ids"]  # the emoji is several byte-level tokens
    assert len(chain) >= 4
    folder = _chain_model(tmp_path / "chain", tok, chain)
    svc = _service(Settings(model=str(folder), max_new_tokens=3, draft_budget=0, debounce_ms=0,
                            index_workspace=False))
    try:
        before, after = 'label = "', '"\nprint(label)\n'
        c = svc.submit("mem://u.py", before + after, len(before)).future.result(60)
        assert c is not None and c.text == "ab"
    finally:
        svc.close()


# -- 5. one load at start-up ----------------------------------------------------------------------------------


def test_a_model_in_the_initialization_options_is_loaded_once(tiny_models, monkeypatch):
    import rest_lsp.engine.model as model_module

    calls = []
    real = model_module.load_model

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(model_module, "load_model", counting)
    cli = Settings()
    svc = CompletionService(cli)  # the server's initialize: the CLI settings,
    try:
        new, errors = cli.update({"model": str(tiny_models["random"]), "indexWorkspace": False})
        assert not errors
        svc.update_settings(new)  # then the initializationOptions,
        svc.start([])  # then initialized
        assert svc.wait_ready(120), svc.load_error
    finally:
        svc.close()  # joins every loader
    assert calls == [str(tiny_models["random"])]


# -- 6. typing in a big buffer --------------------------------------------------------------------------------


def test_feeding_a_buffer_never_holds_what_prompt_building_needs(tiny_models, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real_encode, real_batch = Tokenizer.encode, Tokenizer.encode_batch

    def gate(texts):  # a slow re-tokenization of a big buffer, held until released
        if any("BLOCK_MARKER" in t for t in texts):
            entered.set()
            release.wait(60)

    monkeypatch.setattr(Tokenizer, "encode", lambda self, text: (gate([text]), real_encode(self, text))[1])
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda self, texts: (gate(texts), real_batch(self, texts))[1])
    svc = _service(Settings(model=str(tiny_models["random"]), max_new_tokens=4, draft_budget=0, debounce_ms=0,
                            index_workspace=False))
    try:
        svc.change_buffer("/tmp/rest-lsp-test/big.py", "BLOCK_MARKER = 1\n" + "x = 1\n" * 1000)
        assert entered.wait(30), "the buffer was never fed"
        c = svc.submit("mem://small.py", BEFORE + AFTER, len(BEFORE)).future.result(30)
        assert c is not None
    finally:
        release.set()
        svc.close()


# -- 7. identical requests ------------------------------------------------------------------------------------


def test_requests_for_the_same_text_and_cursor_share_one_computation(tiny_models):
    svc = _service(Settings(model=str(tiny_models["random"]), max_new_tokens=12, index_workspace=False))
    try:
        text = BEFORE + AFTER
        inline = svc.submit("file:///tmp/a.py", text, len(BEFORE))
        listed = svc.submit("file:///tmp/a.py", text, len(BEFORE))  # the same keystroke, another UI
        a, b = inline.future.result(60), listed.future.result(60)
        assert a is not None and b is not None and a.text == b.text
        assert svc.stats()["completions_decoded"] == 1
        # one of two sharers giving up does not stop the other
        again = BEFORE + "1"
        first = svc.submit("file:///tmp/a.py", again + AFTER, len(again))
        second = svc.submit("file:///tmp/a.py", again + AFTER, len(again))
        first.cancel()
        assert second.future.result(60) is not None
    finally:
        svc.close()


# -- 8. close() waits for the loader --------------------------------------------------------------------------


def test_close_stops_and_waits_for_the_loader_and_indexing(tiny_models, tmp_path, monkeypatch):
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(70):  # more than one tokenizer batch (64 files)
        (root / f"m{i}.py").write_text(f"def f_{i}(x):\n    return x * {i}\n")
    entered, release, closing = threading.Event(), threading.Event(), threading.Event()
    after_close = []
    real = CompletionService._tokenize_batch

    def gated(self, texts):
        if closing.is_set() and release.is_set():
            after_close.append(len(texts))
        if not entered.is_set():
            entered.set()
            release.wait(60)
        return real(self, texts)

    monkeypatch.setattr(CompletionService, "_tokenize_batch", gated)
    before = _loader_threads()
    svc = CompletionService(Settings(model=str(tiny_models["random"]), debounce_ms=0,
                                     cache_dir=str(tmp_path / "cache")))
    svc.start([root])
    assert entered.wait(120), "indexing never began"
    loaders = _loader_threads() - before
    alive_after_close = []

    def close():
        svc.close(timeout=60)
        alive_after_close.extend(t for t in loaders if t.is_alive())

    closer = threading.Thread(target=close, daemon=True)
    closing.set()
    closer.start()
    wait_for(lambda: svc._closed, 30, "close() to begin")
    release.set()
    closer.join(90)
    assert not closer.is_alive(), "close() did not return"
    assert loaders and not alive_after_close, "close() returned while the loader or the indexer still ran"
    assert after_close == [], "the tokenizer ran after close()"


# -- 9. bad settings --------------------------------------------------------------------------------------------


def test_a_device_that_cannot_load_keeps_the_old_model_serving(tiny_models):
    events = Events()
    settings = Settings(model=str(tiny_models["random"]), max_new_tokens=8, debounce_ms=0, index_workspace=False)
    svc = _service(settings, events)
    try:
        svc.update_settings(dataclasses.replace(settings, device="cdua"))
        message = wait_for(lambda: events.said("could not load the model"), 60, "the load error")
        assert "cdua" in message and "still using" in message
        c = svc.submit("mem://d.py", BEFORE + AFTER, len(BEFORE)).future.result(60)
        assert c is not None and c.text
    finally:
        svc.close()


def test_max_new_tokens_beyond_the_context_is_refused(tiny_models, tmp_path):
    small = tmp_path / "random-512"
    shutil.copytree(tiny_models["random"], small)
    config = json.loads((small / "config.json").read_text())
    config["max_position_embeddings"] = 512
    (small / "config.json").write_text(json.dumps(config))
    events = Events()
    settings = Settings(model=str(small), debounce_ms=0, index_workspace=False)
    svc = _service(settings, events)
    try:
        new, errors = settings.update({"maxNewTokens": 600})
        assert not errors  # settings alone cannot know the model's context
        svc.update_settings(new)
        message = events.said("maxNewTokens 600")
        assert message and "512" in message
        assert svc.settings.max_new_tokens == settings.max_new_tokens
        c = svc.submit("mem://e.py", BEFORE + AFTER, len(BEFORE)).future.result(60)
        assert c is not None and c.text
    finally:
        svc.close()


def test_workspace_settings_changed_at_run_time_take_effect(tiny_models, tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "lib.py").write_text("def frobnicate(count):\n    return count * 7\n")
    (root / "other.py").write_text("def quasar_flux(level):\n    return level + 3\n")
    settings = Settings(model=str(tiny_models["random"]), debounce_ms=0, cache_dir=str(tmp_path / "cache"))
    svc = _service(settings, roots=[root])

    def proposes(text, start):
        return any(t.startswith(start) for t, _ in svc.drafts(text))

    try:
        assert svc.wait_indexed(60)
        assert proposes("def frobnicate", "(count") and proposes("def quasar_flux", "(level")
        svc.update_settings(dataclasses.replace(settings, ignore=("lib.py",)))
        wait_for(lambda: svc.wait_indexed(0) and not proposes("def frobnicate", "(count"), 60, "lib.py to go")
        assert proposes("def quasar_flux", "(level")
        svc.update_settings(dataclasses.replace(settings, index_workspace=False))
        wait_for(lambda: not proposes("def quasar_flux", "(level"), 60, "the workspace to leave the datastore")
        assert svc._indexes == {}  # nothing watches the disk any more
    finally:
        svc.close()


# -- 10. end-of-block rule -----------------------------------------------------------------------------------------


def test_a_line_that_merely_starts_with_end_does_not_close_a_block():
    before, after = "import time\n\ndef elapsed(start):\n    ", "\n"
    text = "\n    return time.time() - start\nend_time = elapsed(0)\nprint(end_time)\n"
    assert finish_text(text, stop_context(before, after)) == "return time.time() - start"
    ruby = finish_text("\n  x = 1\nend\nputs x\n", stop_context("def f\n  ", "\n"))
    assert ruby == "x = 1\nend"  # the word `end` still closes the block


# -- 11. stale replies ----------------------------------------------------------------------------------------


async def test_a_change_during_a_completion_stops_it_and_answers_content_modified(tiny_models, tmp_path):
    from pygls.exceptions import JsonRpcException

    options = {"model": str(tiny_models["constant"]), "maxNewTokens": 2000, "draftBudget": 0, "debounceMs": 0,
               "indexWorkspace": False}
    client, _ = await start(server_command(), tmp_path, "visual-studio-code", options)
    try:
        async def stats():
            return await client.workspace_execute_command_async(
                types.ExecuteCommandParams(command="rest-lsp.stats", arguments=[]))

        deadline = time.monotonic() + 120
        while not (await stats())["ready"]:
            assert time.monotonic() < deadline, "the model did not load"
            await asyncio.sleep(0.1)
        uri = (tmp_path / "a.py").as_uri()
        client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
            uri=uri, language_id="python", version=1, text="y = \n")))
        # pygls' send_request writes the request now (pytest-lsp's async helpers send only once awaited)
        request = asyncio.wrap_future(client.protocol.send_request(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(0, 4),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))))
        # a round trip: the server has read the request (its handler has submitted the job) before the change
        await stats()
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), text="abc")]))
        with pytest.raises(JsonRpcException) as err:
            await asyncio.wait_for(request, 60)
        assert err.value.code == -32801  # ContentModified
        s = await stats()
        assert s["cancelled"] == 1 and s["completions_decoded"] == 0  # the decode of 2,000 tokens was stopped
    finally:
        await client.shutdown_session()


# -- 12. also seen ------------------------------------------------------------------------------------------------


def test_the_draft_source_comes_from_the_same_snapshot_as_the_model(service, monkeypatch):
    from rest_lsp.datastore import Datastore

    class Poisoned(Datastore):  # what a model switch could put in place while a job runs
        def continuations(self, context):
            raise AssertionError("drafts from a datastore the job's model does not own")

    real = completion_module.build_prompt
    kept = service._datastore
    poisoned = Poisoned()

    def swap_meanwhile(*args, **kwargs):
        service._datastore = poisoned
        return real(*args, **kwargs)

    monkeypatch.setattr(completion_module, "build_prompt", swap_meanwhile)
    try:
        c = service.submit("mem://snap.py", BEFORE + "2" + AFTER, len(BEFORE) + 1).future.result(60)
    finally:
        service._datastore = kept
        poisoned.close()
    assert c is not None


def test_a_listener_that_raises_does_not_kill_the_worker(tiny_models):
    class Raising(NoEvents):
        def message(self, level, text):
            raise RuntimeError("the client is gone")

    svc = _service(Settings(model=str(tiny_models["random"]), max_new_tokens=8, debounce_ms=0,
                            index_workspace=False), Raising())
    try:
        handle = _fail_once(svc)
        try:
            assert svc.submit("mem://r.py", BEFORE + AFTER, len(BEFORE)).future.result(60) is None
        finally:
            handle.remove()
        c = svc.submit("mem://r.py", BEFORE + "1" + AFTER, len(BEFORE) + 1).future.result(30)
        assert c is not None
    finally:
        svc.close()


def test_stop_checks_decode_only_the_new_tokens(tiny_models, monkeypatch):
    sizes = []
    real = Tokenizer.decode

    def recording(self, ids):
        sizes.append(len(ids))
        return real(self, ids)

    monkeypatch.setattr(Tokenizer, "decode", recording)
    svc = _service(Settings(model=str(tiny_models["constant"]), max_new_tokens=40, draft_budget=0, debounce_ms=0,
                            index_workspace=False))
    try:
        c = svc.submit("mem://s.py", "x = ", 4).future.result(60)
        assert c is not None and c.text == "x" * 40
    finally:
        svc.close()
    # one decode of the whole text at the end (and a check of its last character), not one per step
    assert len([n for n in sizes if n > 8]) <= 2, sizes


def test_shown_suggestions_keep_no_copy_of_the_document(service):
    big = "".join(f"def function_{i}(value):\n    return value * {i}\n\n" for i in range(3000))  # ~100 KB
    before = big + BEFORE
    c = service.submit("mem://big.py", before + AFTER, len(before)).future.result(60)
    assert c is not None and c.source == "model"
    for shown in service._shown:
        sizes = {k: len(v) for k, v in vars(shown).items() if isinstance(v, str) and k != "text"}
        assert max(sizes.values()) <= 1024, sizes
    typed = c.text[:2]
    t = service.submit("mem://big.py", before + typed + AFTER, len(before) + 2).future.result(10)
    assert t is not None and t.source == "type-through" and t.text == c.text[2:]


def test_accepted_suggestions_in_the_datastore_are_bounded(service, monkeypatch):
    import rest_lsp.service.feeding as feeding

    monkeypatch.setattr(feeding, "ACCEPTED_DOCUMENTS", 4)
    datastore = service._datastore
    for i in range(7):
        assert service.accept(None, f"zebra_{i} = compute(limit={i})")
    accepted = sorted(d for d in datastore.doc_ids() if d.startswith("accepted:"))
    assert len(accepted) == 4
    assert not any("limit=0" in t for t, _ in service.drafts("zebra_0 = compute"))
    assert any("limit=6" in t for t, _ in service.drafts("zebra_6 = compute"))
