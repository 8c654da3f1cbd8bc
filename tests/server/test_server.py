"""The language server end to end over stdio (pytest-lsp), with the captured VS Code and
Neovim client capabilities and small real models (see conftest_server.py)."""

import asyncio
import socket
import subprocess
import time

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import make_test_lsp_client

from support import capabilities, command, cursor_at_end, greedy, inline, open_doc, server_command, start, wait_until
from step_gate import FileGate
from rest_lsp.lsp.server import ACCEPT_COMMAND, CURSOR_NOTIFICATION, DRAFTS_COMMAND, STATS_COMMAND

pytestmark = pytest.mark.asyncio(loop_scope="module")

BEFORE = "def scale(values, factor):\n    return [v * factor for v in values]\n\ntotal = scale("
AFTER = ")\nprint(total)\n"
MAX_NEW = 12


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["visual-studio-code", "neovim"])
async def session(request, tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("workspace")
    (root / "util.py").write_text("def frobnicate_widget(count):\n    return count * 7\n")
    options = {"model": str(tiny_models["random"]), "dtype": "float32", "maxNewTokens": MAX_NEW, "debounceMs": 0,
               "cacheDir": str(tmp_path_factory.mktemp("cache"))}
    # the server behind a step gate that never holds a step: it records what the service decided for each cursor
    # hint (step_gate.py), so that a test sees a hint that started nothing without waiting for nothing to happen
    gate = FileGate(tmp_path_factory.mktemp("gate"))
    gate.release.set()
    client, result = await start(gate.command("--stdio"), root, request.param, options, env=gate.env)
    client.gate = gate
    stats = await wait_until(lambda: _ready(client))
    assert stats, "the model did not load"
    yield client, result, root, tiny_models["random"]
    await client.shutdown_session()


async def _ready(client):
    stats = await command(client, STATS_COMMAND)
    return stats if stats["ready"] else None


async def test_initialize_advertises_inline_completion(session):
    client, result, _, _ = session
    caps = result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.completion_provider is not None
    assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    assert {ACCEPT_COMMAND, STATS_COMMAND} <= set(caps.execute_command_provider.commands)


async def test_inline_completion_is_the_greedy_continuation(session):
    client, _, root, model_dir = session
    uri = (root / "main.py").as_uri()
    open_doc(client, uri, BEFORE + AFTER)
    result = await inline(client, uri, *cursor_at_end(BEFORE))
    expected = greedy(model_dir, BEFORE, AFTER, MAX_NEW)
    assert expected, "the reference completion is empty: pick another prompt"
    assert [i.insert_text for i in result.items] == [expected]
    item = result.items[0]
    assert item.command.command == ACCEPT_COMMAND
    assert item.range.start == item.range.end == types.Position(*cursor_at_end(BEFORE))

    completion = await client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(*cursor_at_end(BEFORE))))
    assert [i.text_edit.new_text for i in completion.items] == [expected]
    assert completion.items[0].command.command == ACCEPT_COMMAND


async def test_accepted_text_is_proposed_as_draft(session):
    client, _, _, _ = session
    accepted = "gamma_ray_burst = detect_burst(window=37)"
    assert await command(client, ACCEPT_COMMAND, {"id": 0, "text": accepted})
    drafts = await command(client, DRAFTS_COMMAND, "gamma_ray_burst = detect_burst")
    assert any(d["text"].startswith("(window=37") for d in drafts)


async def test_file_written_in_workspace_shows_in_stats_and_drafts(session):
    client, _, root, _ = session
    before = (await command(client, STATS_COMMAND))["documents"]
    assert any(d["text"].startswith("(count") for d in await command(client, DRAFTS_COMMAND, "def frobnicate_widget"))
    (root / "later.py").write_text("def quasar_flux(level):\n    return level + 3\n")

    async def seen():
        stats = await command(client, STATS_COMMAND)
        drafts = await command(client, DRAFTS_COMMAND, "def quasar_flux")
        return stats["documents"] > before and any(d["text"].startswith("(level") for d in drafts)

    assert await wait_until(seen, timeout=20)


async def test_did_change_edits_applied_in_order(session):
    client, _, root, _ = session
    uri = (root / "edited.py").as_uri()
    open_doc(client, uri, "alpha = 1\n")
    edits = [  # (line, start, end, new text), each applied to the result of the one before
        (0, 0, 5, "omega_value"),  # omega_value = 1
        (0, 14, 15, "frob_it(2)"),  # omega_value = frob_it(2)
        (1, 0, 0, "beta = omega_value\n"),
        (0, 5, 5, "_prime"),  # omega_prime_value = frob_it(2)
    ]
    for version, (line, start, end, text) in enumerate(edits, start=2):
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line, start), end=types.Position(line, end)), text=text)]))

    async def seen():
        drafts = await command(client, DRAFTS_COMMAND, "omega_prime_value = frob")
        return any(d["text"].startswith("_it(2)") for d in drafts)

    assert await wait_until(seen, timeout=10)


async def test_an_edit_warms_the_prompt_of_a_request_there(session):
    client, _, root, model_dir = session
    uri = (root / "warm.py").as_uri()
    text = "".join(f"def step_{i}(x):\n    return x + {i}\n\n" for i in range(30))
    open_doc(client, uri, text)
    warmed = (await command(client, STATS_COMMAND))["prewarm_tokens"]
    line = text.count("\n") - 1  # the last line break: a new line at the end
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line + 1, 0), end=types.Position(line + 1, 0)), text="y = step_")]))

    async def warm_done():
        return (await command(client, STATS_COMMAND))["prewarm_tokens"] > warmed

    assert await wait_until(warm_done, timeout=60), "the edit warmed nothing"
    prefilled = (await command(client, STATS_COMMAND))["prefill_tokens"]
    result = await inline(client, uri, line + 1, len("y = step_"))
    assert (await command(client, STATS_COMMAND))["prefill_tokens"] == prefilled  # all of it computed ahead
    assert [i.insert_text for i in result.items] == [greedy(model_dir, text + "y = step_", "", MAX_NEW)]


def _cursor_hint(client, params) -> None:
    client.protocol.notify(CURSOR_NOTIFICATION, params)


def _at(uri: str, line: int, character: int) -> dict:
    return {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}


async def _stats_when(client, check, what: str, timeout: float = 60):
    async def met():
        stats = await command(client, STATS_COMMAND)
        return stats if check(stats) else None

    stats = await wait_until(met, timeout=timeout)
    assert stats, f"timed out waiting for {what}"
    return stats


async def test_a_cursor_hint_after_opening_has_the_suggestion_ready_before_it_is_asked(session):
    client, _, root, model_dir = session
    uri = (root / "hinted.py").as_uri()
    before = "def hinted(values):\n    return sum(values)\n\nresult = hinted("
    open_doc(client, uri, before + AFTER)
    start = await command(client, STATS_COMMAND)
    _cursor_hint(client, _at(uri, *cursor_at_end(before)))  # the person clicked where they will write
    await _stats_when(client, lambda s: s["guessed"] > start["guessed"], "the suggestion at the cursor")
    ahead = await command(client, STATS_COMMAND)
    result = await inline(client, uri, *cursor_at_end(before))
    assert [i.insert_text for i in result.items] == [greedy(model_dir, before, AFTER, MAX_NEW)]
    served = await command(client, STATS_COMMAND)
    assert served["prefetch_hits"] == ahead["prefetch_hits"] + 1, served  # the guess, without decoding
    assert served["completions_decoded"] == ahead["completions_decoded"]
    # the editor reports the cursor where it just asked: the answer is known, nothing is guessed again
    decided = len(client.gate.moves())
    _cursor_hint(client, _at(uri, *cursor_at_end(before)))
    moves = await wait_until(_async(lambda: client.gate.moves()[decided:]))
    assert moves == [{"doc": uri, "offset": len(before), "new": False}], moves
    assert (await command(client, STATS_COMMAND))["guessed"] == served["guessed"]


async def test_bad_cursor_hints_are_ignored(session):
    client, _, root, model_dir = session
    uri = (root / "hint-target.py").as_uri()
    before = "def halve(n):\n    return n // 2\n\nhalf = halve("
    open_doc(client, uri, before + AFTER)
    start = await command(client, STATS_COMMAND)
    decided = len(client.gate.moves())
    for params in (_at((root / "never-opened.py").as_uri(), 0, 0), _at(uri, 40, 0), _at(uri, 0, 500),
                   _at(uri, -1, 0), {"textDocument": {"uri": uri}}, {"position": {"line": 0, "character": 0}},
                   {"textDocument": {"uri": uri}, "position": {"line": "3", "character": None}}, None, [1, 2]):
        _cursor_hint(client, params)
    _cursor_hint(client, _at(uri, *cursor_at_end(before)))  # still heard after all of them
    await _stats_when(client, lambda s: s["guessed"] > start["guessed"], "the suggestion at the good hint")
    # none of the bad ones reached the service: the good hint is the only place it was told of
    assert client.gate.moves()[decided:] == [{"doc": uri, "offset": len(before), "new": True}]
    result = await inline(client, uri, *cursor_at_end(before))
    assert [i.insert_text for i in result.items] == [greedy(model_dir, before, AFTER, MAX_NEW)]
    assert (await command(client, STATS_COMMAND))["ready"]


async def _answer(request, what: str, timeout: float = 300):
    """A request's reply; fails with `what` when none comes in a generous time."""
    try:
        return await asyncio.wait_for(request, timeout)
    except asyncio.TimeoutError:
        pytest.fail(f"no reply in {timeout:.0f} s for {what}")


async def test_bad_input_never_kills_the_server(session):
    client, _, root, model_dir = session
    # a document never opened
    result = await inline(client, (root / "nowhere.py").as_uri(), 0, 0)
    assert not result.items
    # positions past the end of a line and of the file: clamped to the end
    uri = (root / "short.py").as_uri()
    open_doc(client, uri, "x = compute(")
    expected = greedy(model_dir, "x = compute(", "", MAX_NEW)
    assert expected.strip(), "the reference completion is empty: pick another text"
    for line, character in [(0, 500), (40, 3)]:
        result = await inline(client, uri, line, character)
        assert [i.insert_text for i in result.items] == [expected], (line, character)
        assert result.items[0].range.start == types.Position(0, 12)
    # binary content: served like any other text
    uri = (root / "blob.bin").as_uri()
    blob = "\x00\x01\x02\ufffd\x7f" * 2000 + "\nvalue = "
    open_doc(client, uri, blob)
    expected = greedy(model_dir, blob, "", MAX_NEW)
    assert expected.strip(), "the reference completion is empty: pick another text"
    result = await _answer(inline(client, uri, 1, 8), "the binary document")
    assert [i.insert_text for i in result.items] == [expected]
    assert result.items[0].range.start == types.Position(1, 8)
    # a 5 MB document: the prompt window is bounded, the reply comes and is the completion of that window
    uri = (root / "huge.py").as_uri()
    big = "".join(f"row_{i} = {i} * 3\n" for i in range(330_000))
    assert len(big) > 5_000_000
    open_doc(client, uri, big + "row_x = ")
    expected = greedy(model_dir, big + "row_x = ", "", MAX_NEW)
    assert expected.strip(), "the reference completion is empty: pick another text"
    result = await _answer(inline(client, uri, big.count("\n"), 8), "the 5 MB document")
    assert [i.insert_text for i in result.items] == [expected]
    # invalid settings: one message, defaults kept, still serving
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"maxNewTokens": -3, "debounceMs": "soon", "noSuchSetting": 1}))
    message = await wait_until(lambda: _message(client, "invalid settings"), timeout=10)
    assert "maxNewTokens" in message and "debounceMs" in message and "noSuchSetting" in message
    uri = (root / "after-bad-settings.py").as_uri()  # its own document: the test runs alone as in the module
    open_doc(client, uri, BEFORE + AFTER)
    result = await inline(client, uri, *cursor_at_end(BEFORE))
    assert len(result.items) == 1
    assert (await command(client, STATS_COMMAND))["ready"]


async def test_empty_configuration_change_pulls_our_section(session):
    client, _, _, _ = session
    # the pull model: the notification carries nothing, the server asks for its section
    client.set_configuration({"pulledSettingProbe": 1}, section="rest-lsp")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    assert await wait_until(lambda: _message(client, "pulledSettingProbe"), timeout=10)
    client.set_configuration({}, section="rest-lsp")
    assert (await command(client, STATS_COMMAND))["ready"]


async def _message(client, needle: str):
    return next((m.message for m in client.messages if needle in m.message), None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def constant_session(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("workspace-constant")
    gate = FileGate(tmp_path_factory.mktemp("gate"))  # holds the server's first decoding step (step_gate.py)
    # no prefetch: the gate's record of decodes must hold the requests' decodes only
    options = {"model": str(tiny_models["constant"]), "dtype": "float32", "maxNewTokens": 2000, "draftBudget": 0,
               "debounceMs": 0,
               "indexWorkspace": False, "prefetch": False}
    client, _ = await start(gate.command("--stdio"), root, "visual-studio-code", options, env=gate.env)
    assert await wait_until(lambda: _ready(client))
    yield client, root, gate
    gate.release.set()
    await client.shutdown_session()


async def test_cancel_request_stops_the_decoder(constant_session):
    client, root, gate = constant_session
    uri = (root / "c.py").as_uri()
    open_doc(client, uri, "x = \ny = \n")
    # this one writes "x" until max_new_tokens (2000) unless something stops it.
    # pytest-lsp's send_request_async is a coroutine: only a task sends the request now, before the cancel.
    slow = asyncio.ensure_future(client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(0, 4),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)), msg_id="slow-1"))
    assert await wait_until(_async(gate.started.is_set), timeout=120), "the request never started decoding"
    # the decoder is held inside its first step while the cancel arrives
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="slow-1"))
    with pytest.raises(JsonRpcRequestCancelled) as err:
        await asyncio.wait_for(slow, 120)
    assert err.value.code == -32800
    gate.release.set()
    # No other request is in flight, so only the cancel can have stopped the decoder (not latest-wins).
    stats = await wait_until(lambda: _cancelled(client), timeout=120)
    assert stats and stats["cancelled"] == 1 and stats["completions_decoded"] == 0, stats
    assert gate.results() == [{"steps": 1, "tokens": 1, "finish": "stopped"}]  # after the step it was in
    # the worker is free again: the next request decodes in full
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"maxNewTokens": 4}))
    other = (root / "d.py").as_uri()
    open_doc(client, other, "y = \n")
    result = await inline(client, other, 0, 4)
    assert [i.insert_text for i in result.items] == ["xxxx"]
    assert gate.results()[1:] == [{"steps": 4, "tokens": 4, "finish": "length"}]


def _async(check):
    async def run():
        return check()
    return run


async def _cancelled(client):
    stats = await command(client, STATS_COMMAND)
    return stats if stats["cancelled"] else None


async def test_a_model_that_fails_to_load(tmp_path):
    client, _ = await start(server_command(), tmp_path, "neovim", {"model": str(tmp_path / "no-such-model")})
    try:
        message = await wait_until(lambda: _message(client, "could not load the model"), timeout=60)
        assert message and "no-such-model" in message
        uri = (tmp_path / "a.py").as_uri()
        open_doc(client, uri, "x = ")
        assert not (await inline(client, uri, 0, 4)).items
        stats = await command(client, STATS_COMMAND)
        assert not stats["ready"] and "no-such-model" in stats["load_error"]
    finally:
        await client.shutdown_session()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_tcp(tiny_models, tmp_path):
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(*server_command()[:-1], "--tcp", f"127.0.0.1:{port}",
                                                stderr=asyncio.subprocess.PIPE)
    client = make_test_lsp_client()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                await client.start_tcp("127.0.0.1", port)
                break
            except OSError:  # not listening yet
                assert proc.returncode is None and time.monotonic() < deadline, "the server did not listen"
                await asyncio.sleep(0.2)
        await client.initialize_session(types.InitializeParams(
            capabilities=capabilities("neovim"), root_uri=tmp_path.as_uri(),
            initialization_options={"model": str(tiny_models["random"]), "dtype": "float32", "maxNewTokens": MAX_NEW,
                                    "debounceMs": 0,
                                    "indexWorkspace": False}))
        assert await wait_until(lambda: _ready(client))
        uri = (tmp_path / "main.py").as_uri()
        open_doc(client, uri, BEFORE + AFTER)
        result = await inline(client, uri, *cursor_at_end(BEFORE))
        assert len(result.items) == 1 and result.items[0].insert_text.strip()
        await client.shutdown_async(None)
        client.exit(None)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await client.stop()


@pytest.mark.parametrize("where", ["no-port-here", "127.0.0.1:{busy}"])
async def test_tcp_bad_address(where):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = where.format(busy=busy.getsockname()[1])
        done = await asyncio.to_thread(subprocess.run, [*server_command()[:-1], "--tcp", address],
                                       capture_output=True, text=True, timeout=60)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("rest-lsp: ") and address in err, err


async def test_a_change_during_a_completion_stops_it_and_answers_content_modified(tiny_models, tmp_path):
    from pygls.exceptions import JsonRpcException

    options = {"model": str(tiny_models["constant"]), "dtype": "float32", "maxNewTokens": 2000, "draftBudget": 0,
               "debounceMs": 0,
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
