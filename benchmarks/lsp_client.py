"""The benchmarks' side of the real language server: one `rest-lsp` process over stdio, driven with pygls'
LanguageClient as an editor would (didOpen, incremental didChange, textDocument/inlineCompletion, and the
`restLsp/cursor` notification that the editor extensions send when the cursor moves), plus the server's
`rest-lsp.stats` command to read what happened inside.

Shared by bench_replay.py and bench_typing_storm.py; no benchmark logic here.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from pathlib import Path

from concurrent.futures import Future

from lsprotocol import types
from pygls.lsp.client import LanguageClient

REPO = Path(__file__).resolve().parents[1]
STATS_COMMAND = "rest-lsp.stats"
CURSOR_NOTIFICATION = "restLsp/cursor"  # rest_lsp.lsp.server's: where the editor's cursor is now
STDERR_TAIL_BYTES = 64_000  # what is kept of the server's stderr, for the error messages
TRACEBACK = b"Traceback (most recent call last):"


class Pending:
    """A request sent without waiting for it: its id (for $/cancelRequest), and when, and in which order among
    all the session's replies, its reply arrived (results and errors alike)."""

    def __init__(self, msg_id: str, future: Future, arrivals: itertools.count):
        self.id, self.future = msg_id, future
        self.sent = time.perf_counter()
        self.arrived: float | None = None
        self.order: int | None = None  # replies are read in the order the server wrote them
        future.add_done_callback(lambda _: self._arrive(next(arrivals)))

    def _arrive(self, order: int) -> None:
        self.arrived, self.order = time.perf_counter(), order

    def outcome(self) -> tuple[object, int | None]:
        """(result, None), or (None, the JSON-RPC error code) for an error reply; only once `future` is done."""
        if self.future.cancelled():  # given up here: no reply was read
            return None, -1
        err = self.future.exception()
        if err is None:
            return self.future.result(), None
        return None, getattr(err, "code", -1)


def position_of(text: str) -> types.Position:
    """The LSP position at the end of `text` (characters counted in UTF-16 units, as LSP does by default)."""
    line = text.count("\n")
    last = text[text.rfind("\n") + 1:]
    return types.Position(line=line, character=utf16_len(last))


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def server_command(*flags: str) -> list[str]:
    """The command a user runs (`python -m rest_lsp.cli --stdio`), with extra CLI flags."""
    return [sys.executable, "-m", "rest_lsp.cli", "--stdio", *flags]


def server_env() -> dict[str, str]:
    """The environment of the server process: this checkout's `rest_lsp` first, whatever is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


class ServerSession:
    """One server process and the client talking to it; `await ServerSession.start(...)`, then `await stop()`."""

    def __init__(self, client: LanguageClient):
        self.client = client
        self.version = 0
        self.messages: list[str] = []  # window/showMessage texts, for the results
        self.indexing: set[str] = set()  # progress tokens begun and not ended
        self.indexed_roots = 0  # progress reports that ended
        self.stderr = bytearray()  # the tail of the server's stderr
        self.stderr_bytes = 0  # all it wrote there
        self.stderr_tracebacks = 0  # Python tracebacks among it
        self._arrivals = itertools.count()
        self._drain: asyncio.Task | None = None

    @classmethod
    async def start(cls, command: list[str], root: Path, options: dict | None = None,
                    timeout_s: float = 900) -> "ServerSession":
        """Start the server, initialize it on the workspace folder `root`, and wait until its model is ready."""
        client = LanguageClient("rest-lsp-bench", "1")
        session = cls(client)
        session._register_handlers()
        await client.start_io(*command, env=server_env())
        session._drain = asyncio.create_task(session._read_stderr())
        try:
            await client.initialize_async(types.InitializeParams(
                capabilities=types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True)),
                workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name or "workspace")],
                initialization_options=options or {}))
            client.initialized(types.InitializedParams())
            await session.wait_ready(timeout_s)
        except BaseException:
            await session.stop()
            raise
        return session

    @property
    def pid(self) -> int:
        return self.client._server.pid

    async def _read_stderr(self) -> None:
        """pygls pipes the server's stderr and never reads it: a server that logs a lot (a traceback per
        superseded request, say) would block on a full pipe. Read it, keeping the tail."""
        stream = self.client._server.stderr
        carry = b""  # the end of the previous chunk: a traceback's first line may straddle two
        while chunk := await stream.read(65536):
            self.stderr += chunk
            self.stderr_bytes += len(chunk)
            window = carry + chunk
            self.stderr_tracebacks += window.count(TRACEBACK)
            carry = window[-(len(TRACEBACK) - 1):]
            del self.stderr[:-STDERR_TAIL_BYTES]

    def _register_handlers(self) -> None:
        client = self.client
        client.feature(types.WINDOW_SHOW_MESSAGE)(lambda params: self.messages.append(params.message))
        client.feature(types.WINDOW_LOG_MESSAGE)(lambda params: None)
        client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)(lambda params: None)
        client.feature(types.PROGRESS)(lambda params: self._on_progress(params))

    def _on_progress(self, params: types.ProgressParams) -> None:
        value = params.value
        kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
        if kind == "begin":
            self.indexing.add(str(params.token))
        elif kind == "end":
            self.indexing.discard(str(params.token))
            self.indexed_roots += 1

    async def stats(self) -> dict:
        return await self.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=STATS_COMMAND, arguments=[]))

    async def wait_ready(self, timeout_s: float) -> None:
        t0 = time.perf_counter()
        while not (stats := await self.stats())["ready"]:
            if stats["load_error"]:
                raise SystemExit(f"the server could not load its model: {stats['load_error']}")
            if time.perf_counter() - t0 > timeout_s:
                raise SystemExit(f"the server's model did not load in {timeout_s:.0f} s.")
            await asyncio.sleep(0.2)

    async def wait_indexed(self, roots: int = 1, timeout_s: float = 900) -> None:
        """Until the server has reported the end of indexing for `roots` workspace folders (work-done progress)."""
        t0 = time.perf_counter()
        while self.indexed_roots < roots:
            if time.perf_counter() - t0 > timeout_s:
                raise SystemExit(f"the server did not finish indexing in {timeout_s:.0f} s "
                                 f"({self.indexed_roots} of {roots} folders).")
            await asyncio.sleep(0.2)

    def configure(self, settings: dict) -> None:
        self.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=settings))

    def open(self, uri: str, text: str) -> None:
        self.version += 1
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=self.version, text=text)))

    def insert(self, uri: str, at: types.Position, text: str) -> None:
        """An incremental didChange: `text` inserted at `at`."""
        self.version += 1
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=self.version),
            content_changes=[types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text=text)]))

    def cursor(self, uri: str, at: types.Position) -> None:
        """The editor's cursor moved to `at` without an edit (a click), as the editor extensions tell the server."""
        self.client.protocol.notify(CURSOR_NOTIFICATION, {
            "textDocument": {"uri": uri}, "position": {"line": at.line, "character": at.character}})

    def close(self, uri: str) -> None:
        self.client.text_document_did_close(types.DidCloseTextDocumentParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))

    def send(self, method: str, params) -> Pending:
        """Send a request without waiting for its reply."""
        msg_id = f"bench-{next(_ids)}"
        return Pending(msg_id, self.client.protocol.send_request(method, params, msg_id=msg_id), self._arrivals)

    def send_inline(self, uri: str, at: types.Position) -> Pending:
        return self.send(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=at,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))

    def send_stats(self) -> Pending:
        return self.send(types.WORKSPACE_EXECUTE_COMMAND, types.ExecuteCommandParams(command=STATS_COMMAND,
                                                                                       arguments=[]))

    def cancel_request(self, pending: Pending) -> None:
        """$/cancelRequest, as VS Code sends for a request whose answer it no longer wants."""
        self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=pending.id))

    async def inline(self, uri: str, at: types.Position, timeout_s: float = 600) -> tuple[float, str, str, dict, dict]:
        """(ms from request sent to reply received, text shown, how the server answered: model | prefetch (computed
        before it was asked, or shared with such a computation) | cache | type-through | empty, the server's stats before and after)."""
        before = await self.stats()
        t0 = time.perf_counter()
        request = self.client.text_document_inline_completion_async(types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=at,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))
        try:  # a server that died never answers
            result = await asyncio.wait_for(request, timeout_s)
        except asyncio.TimeoutError:
            raise SystemExit(f"no inline completion from the server in {timeout_s:.0f} s ({uri}, line "
                             f"{at.line + 1}); did it exit?") from None
        ms = (time.perf_counter() - t0) * 1e3
        after = await self.stats()
        text = result.items[0].insert_text if result and result.items else ""
        if not isinstance(text, str):  # a StringValue snippet: its text
            text = text.value
        grew = lambda key: after.get(key, 0) > before.get(key, 0)  # noqa: E731
        how = ("type-through" if grew("type_through") else "empty" if not text
               else "prefetch" if grew("prefetch_hits") else "cache" if grew("cache_hits") else "model")
        return ms, text, how, before, after

    async def stop(self) -> None:
        """shutdown + exit, then end the process (killed if it has not exited 30 s later)."""
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), 30)
            self.client.exit(None)
        except Exception:
            pass
        process = getattr(self.client, "_server", None)  # pygls' stop() waits for it with no limit
        if process is not None and process.returncode is None:
            try:
                await asyncio.wait_for(process.wait(), 30)
            except asyncio.TimeoutError:
                process.kill()
        await self.client.stop()
        if self._drain is not None:
            await asyncio.wait([self._drain], timeout=5)


_ids = itertools.count(1)  # request ids of `send`: unique in the process, never pygls' own uuids
