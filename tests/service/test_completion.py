"""The completion service without LSP: greedy equality, type-through, latest-wins, feedback; model switches, loads
and closes that must not deadlock or leak; a failing forward pass; bad settings that keep the old model serving."""

import dataclasses
import json
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import chain_model as _chain_model, greedy, wait_for
from step_gate import StepGate
import rest_lsp.service.completion as completion_module
from rest_lsp.engine.lean_llama import LayerStack
from rest_lsp.engine.model import Tokenizer
from rest_lsp.service.completion import CompletionService, NoEvents
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
    settings = Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=12, debounce_ms=0,
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
    settings = Settings(dtype="float32", model=str(tiny_models["constant"]), max_new_tokens=2000, draft_budget=0,
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
    svc = CompletionService(Settings(dtype="float32", model=str(tmp_path / "missing"), index_workspace=False))
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
    settings = Settings(dtype="float32", model=str(tiny_models["random"]), debounce_ms=0, index_workspace=False)
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
def bare_service(tiny_models):
    svc = _service(Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=12, debounce_ms=0,
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
    settings = Settings(dtype="float32", model=str(tiny_models["random"]), debounce_ms=0,
                        cache_dir=str(tmp_path / "cache"))
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


def test_a_failure_inside_the_forward_pass_does_not_poison_later_completions(bare_service, tiny_models):
    # no work ahead: a prefetch still running when the failure is set up would meet it instead of the request
    bare_service.update_settings(Settings(**{**bare_service.settings.__dict__, "prefetch": False}))
    base = "import os\n\ndef add(a, b):\n    return a + b\n\nresult = add(1, 2)\n"
    first = base + "value = add("
    assert bare_service.submit("mem://p14.py", first + "\n", len(first)).future.result(60) is not None
    handle = _fail_once(bare_service)
    try:
        failing = base + "total = mul("
        assert bare_service.submit("mem://p14.py", failing + "\n", len(failing)).future.result(60) is None
    finally:
        handle.remove()
    for tail in ("value = add(", "value = add(3", "x = os.path.join("):
        c = bare_service.submit("mem://p14.py", base + tail + "\n", len(base + tail)).future.result(60)
        assert (c.text if c else "") == greedy(tiny_models["random"], base + tail, "\n", 12), tail


def test_a_listener_that_raises_does_not_kill_the_worker(tiny_models):
    class Raising(NoEvents):
        def message(self, level, text):
            raise RuntimeError("the client is gone")

    svc = _service(Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=8, debounce_ms=0,
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


def test_the_draft_source_comes_from_the_same_snapshot_as_the_model(bare_service, monkeypatch):
    from rest_lsp.datastore import Datastore

    class Poisoned(Datastore):  # what a model switch could put in place while a job runs
        def continuations(self, context):
            raise AssertionError("drafts from a datastore the job's model does not own")

    real = completion_module.build_prompt
    kept = bare_service._datastore
    poisoned = Poisoned()

    def swap_meanwhile(*args, **kwargs):
        bare_service._datastore = poisoned
        return real(*args, **kwargs)

    monkeypatch.setattr(completion_module, "build_prompt", swap_meanwhile)
    try:
        c = bare_service.submit("mem://snap.py", BEFORE + "2" + AFTER, len(BEFORE) + 1).future.result(60)
    finally:
        bare_service._datastore = kept
        poisoned.close()
    assert c is not None


def test_a_suggestion_cut_inside_a_character_ends_before_it(tiny_models, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    chain = tok("ab😀", add_special_tokens=False)["input_ids"]  # the emoji is several byte-level tokens
    assert len(chain) >= 4
    folder = _chain_model(tmp_path / "chain", tok, chain)
    svc = _service(Settings(dtype="float32", model=str(folder), max_new_tokens=3, draft_budget=0, debounce_ms=0,
                            index_workspace=False))
    try:
        before, after = 'label = "', '"\nprint(label)\n'
        c = svc.submit("mem://u.py", before + after, len(before)).future.result(60)
        assert c is not None and c.text == "ab"
    finally:
        svc.close()


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
        new, errors = cli.update({"model": str(tiny_models["random"]), "dtype": "float32", "indexWorkspace": False})
        assert not errors
        svc.update_settings(new)  # then the initializationOptions,
        svc.start([])  # then initialized
        assert svc.wait_ready(120), svc.load_error
    finally:
        svc.close()  # joins every loader
    assert calls == [str(tiny_models["random"])]


def test_feeding_a_buffer_never_holds_what_prompt_building_needs(tiny_models, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real_encode, real_batch = Tokenizer.encode, Tokenizer.encode_batch

    def gate(texts):  # a slow re-tokenization of a big buffer, held until released
        if any("BLOCK_MARKER" in t for t in texts):
            entered.set()
            release.wait(60)

    monkeypatch.setattr(Tokenizer, "encode", lambda self, text: (gate([text]), real_encode(self, text))[1])
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda self, texts: (gate(texts), real_batch(self, texts))[1])
    svc = _service(Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=4, draft_budget=0,
                            debounce_ms=0,
                            index_workspace=False))
    try:
        svc.change_buffer("/tmp/rest-lsp-test/big.py", "BLOCK_MARKER = 1\n" + "x = 1\n" * 1000)
        assert entered.wait(30), "the buffer was never fed"
        c = svc.submit("mem://small.py", BEFORE + AFTER, len(BEFORE)).future.result(30)
        assert c is not None
    finally:
        release.set()
        svc.close()


def test_requests_for_the_same_text_and_cursor_share_one_computation(tiny_models):
    svc = _service(Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=12,
                            index_workspace=False))
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
    svc = CompletionService(Settings(dtype="float32", model=str(tiny_models["random"]), debounce_ms=0,
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


def test_a_device_that_cannot_load_keeps_the_old_model_serving(tiny_models):
    events = Events()
    settings = Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=8, debounce_ms=0,
                        index_workspace=False)
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
    settings = Settings(dtype="float32", model=str(small), debounce_ms=0, index_workspace=False)
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
    settings = Settings(dtype="float32", model=str(tiny_models["random"]), debounce_ms=0,
                        cache_dir=str(tmp_path / "cache"))
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


def test_stop_checks_decode_only_the_new_tokens(tiny_models, monkeypatch):
    sizes = []
    real = Tokenizer.decode

    def recording(self, ids):
        sizes.append(len(ids))
        return real(self, ids)

    monkeypatch.setattr(Tokenizer, "decode", recording)
    svc = _service(Settings(dtype="float32", model=str(tiny_models["constant"]), max_new_tokens=40, draft_budget=0,
                            debounce_ms=0,
                            index_workspace=False))
    try:
        c = svc.submit("mem://s.py", "x = ", 4).future.result(60)
        assert c is not None and c.text == "x" * 40
    finally:
        svc.close()
    # one decode of the whole text at the end (and a check of its last character), not one per step
    assert len([n for n in sizes if n > 8]) <= 2, sizes


def test_shown_suggestions_keep_no_copy_of_the_document(bare_service):
    big = "".join(f"def function_{i}(value):\n    return value * {i}\n\n" for i in range(3000))  # ~100 KB
    before = big + BEFORE
    c = bare_service.submit("mem://big.py", before + AFTER, len(before)).future.result(60)
    assert c is not None and c.source == "model"
    for shown in bare_service._shown:
        sizes = {k: len(v) for k, v in vars(shown).items() if isinstance(v, str) and k != "text"}
        assert max(sizes.values()) <= 1024, sizes
    typed = c.text[:2]
    t = bare_service.submit("mem://big.py", before + typed + AFTER, len(before) + 2).future.result(10)
    assert t is not None and t.source == "type-through" and t.text == c.text[2:]


def test_accepted_suggestions_in_the_datastore_are_bounded(bare_service, monkeypatch):
    import rest_lsp.service.feeding as feeding

    monkeypatch.setattr(feeding, "ACCEPTED_DOCUMENTS", 4)
    datastore = bare_service._datastore
    for i in range(7):
        assert bare_service.accept(None, f"zebra_{i} = compute(limit={i})")
    accepted = sorted(d for d in datastore.doc_ids() if d.startswith("accepted:"))
    assert len(accepted) == 4
    assert not any("limit=0" in t for t, _ in bare_service.drafts("zebra_0 = compute"))
    assert any("limit=6" in t for t, _ in bare_service.drafts("zebra_6 = compute"))
