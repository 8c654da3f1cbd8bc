"""The language server: pygls wiring around a completion service, nothing more.

The service is whatever implements `rest_lsp.service.interface.Service` (the CompletionService, or a team's
RemoteService, as the `lsp` command chooses); the server never asks which. Handlers are thin: they turn LSP
positions into character offsets and service answers into LSP items. Completion handlers are coroutines, so
`$/cancelRequest` cancels them at their `await`; they then stop the service's work too, and the client gets
RequestCancelled. The service calls back from its own threads: those calls are handed to the event loop, the only
thread that writes to the client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import uuid
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcContentModified, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument, Workspace

from rest_lsp import __version__
from rest_lsp import settings as settings_module
from rest_lsp.lsp.admission import OnceInitializedProtocol
from rest_lsp.lsp.positions import characters, last_line, line_bounds, offset_at, units
from rest_lsp.service.completion import CompletionService
from rest_lsp.service.interface import BadText, Completion, Service, ServiceFactory
from rest_lsp.settings import Settings

log = logging.getLogger(__name__)

ACCEPT_COMMAND = "rest-lsp.accept"
STATS_COMMAND = "rest-lsp.stats"
DRAFTS_COMMAND = "rest-lsp.drafts"
LABEL_CHARS = 60
# Our notification: the editor's cursor moved (params: textDocument.uri, position), where the next request will
# likely come; a file just opened has no edit to tell it.
CURSOR_NOTIFICATION = "restLsp/cursor"


# LSP counts lines at \n, \r\n and \r only; str.splitlines also splits at \f, \v, \x1c-\x1e, \x85, \u2028, \u2029.
_LSP_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def lsp_lines(text: str) -> list[str]:
    """The lines of `text` as an LSP client counts them, each with its line break."""
    return _LSP_LINE.findall(text)


class LspTextDocument(TextDocument):
    """pygls' document with LSP's line breaks, so positions and incremental edits land where the client means."""

    @property
    def lines(self) -> list[str]:
        return lsp_lines(self.source)

    def _apply_incremental_change(self, change: types.TextDocumentContentChangePartial) -> None:
        """The edit by offsets (positions.py): pygls' own walks every character of the lines it touches."""
        source, encoding = self.source, self.position_codec.encoding
        start = offset_at(source, change.range.start.line, change.range.start.character, encoding)
        end = max(start, offset_at(source, change.range.end.line, change.range.end.character, encoding))
        self._source = source[:start] + change.text + source[end:]


class LspWorkspace(Workspace):
    def _create_text_document(self, doc_uri: str, source: str | None = None, version: int | None = None,
                              language_id: str | None = None) -> TextDocument:
        return LspTextDocument(doc_uri, source=source, version=version, language_id=language_id,
                               sync_kind=self._sync_kind, position_codec=self._position_codec)


class RestLanguageServer(LanguageServer):
    def __init__(self, settings: Settings, on_exit: Callable[[RestLanguageServer, int], object] | None = None):
        super().__init__("rest-lsp", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
                         protocol_cls=OnceInitializedProtocol)  # a second initialize is refused, the first kept
        self.defaults = settings  # the CLI flags: what a null setting from the editor goes back to
        self.settings = settings  # CLI flags, then initializationOptions, then didChangeConfiguration
        self.service: Service | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.shut_down, self.exit_code = False, None  # what `shutdown` and `exit` said
        self.on_exit = on_exit  # ends the process at `exit` (the `lsp` command's); None: pygls' own exit

    def show(self, level: str, text: str) -> None:
        kind = {"error": types.MessageType.Error, "warning": types.MessageType.Warning}.get(level, types.MessageType.Info)
        self.window_show_message(types.ShowMessageParams(type=kind, message=text))

    def apply_settings(self, values: Any) -> None:
        new, errors = self.settings.update(values, self.defaults)
        self.settings = new
        if errors:
            self.show("error", "rest-lsp ignored invalid settings (previous values kept): " + " ".join(errors))
        if self.service is not None:
            self.service.update_settings(new)
            self.settings = self.service.settings  # what the service kept (values the model cannot take are refused)


class _Events:
    """The service's callbacks, moved onto the event loop."""

    def __init__(self, ls: RestLanguageServer, loop: asyncio.AbstractEventLoop):
        self.ls, self.loop = ls, loop
        self.tokens: dict[str, tuple[str, int]] = {}  # root -> (progress token, last percentage)

    def _call(self, fn, *args) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    def message(self, level: str, text: str) -> None:
        (log.error if level == "error" else log.info)(text)
        if level != "info":
            self._call(self.ls.show, level, text)

    def index_begin(self, root: str) -> None:
        caps = self.ls.client_capabilities.window
        if not (caps and caps.work_done_progress):
            return
        token = f"rest-lsp-index-{uuid.uuid4().hex[:8]}"
        try:
            asyncio.run_coroutine_threadsafe(self.ls.work_done_progress.create_async(token), self.loop).result(10)
        except Exception as err:  # a client that refuses progress still gets its index
            log.info("no progress for indexing %s: %s", root, err)
            return
        self.tokens[root] = (token, -1)
        title = f"Indexing {Path(root).name or root}"
        self._call(self.ls.work_done_progress.begin, token,
                   types.WorkDoneProgressBegin(title=title, percentage=0, cancellable=False))

    def index_progress(self, root: str, done: int, total: int) -> None:
        if root not in self.tokens:
            return
        token, last = self.tokens[root]
        percent = int(100 * done / total) if total else 100
        if percent != last:
            self.tokens[root] = (token, percent)
            self._call(self.ls.work_done_progress.report, token,
                       types.WorkDoneProgressReport(message=f"{done}/{total} files", percentage=percent))

    def index_end(self, root: str, stats: dict) -> None:
        if root not in self.tokens:
            return
        token, _ = self.tokens.pop(root)
        summary = f"{stats.get('files', '?')} files, {stats.get('tokens', '?')} tokens" if stats else "done"
        self._call(self.ls.work_done_progress.end, token, types.WorkDoneProgressEnd(message=summary))


def _doc_id(uri: str) -> str:
    """Datastore id of a buffer: the file's real path for file URIs (so it replaces the indexed file, which the
    indexer names below the resolved root: a workspace opened through a symlink names it otherwise)."""
    path = to_fs_path(uri) if uri.startswith("file:") else None
    return os.path.realpath(path) if path else f"buffer:{uri}"


def _folder_paths(folders: list[types.WorkspaceFolder] | None) -> list[Path]:
    return [Path(path) for f in folders or [] if (path := to_fs_path(f.uri))]


def _cursor(ls: RestLanguageServer, uri: str, position: types.Position) -> tuple[str, int, types.Position] | None:
    """(text, character offset, position clamped into the document), or None for a document never opened."""
    doc = ls.workspace.text_documents.get(unquote(uri))
    if doc is None:
        return None
    text, encoding = doc.source, doc.position_codec.encoding
    bounds = line_bounds(text, position.line)
    if bounds is None:  # past the last line: the end of the text
        line = last_line(text)
        start, end = line_bounds(text, line)
        return text, len(text), types.Position(line=line, character=units(text[start:end], encoding))
    start, end = bounds
    content = text[start:end]
    character = min(position.character, units(content, encoding))
    return (text, start + characters(content, character, encoding),
            types.Position(line=position.line, character=character))


def _changed_at(ls: RestLanguageServer, uri: str, params) -> int | None:
    """Character offset just after the last edit of a didChange with ranges (where typing goes on), else None."""
    change = (getattr(params, "content_changes", None) or [None])[-1]
    start = getattr(getattr(change, "range", None), "start", None)
    found = _cursor(ls, uri, start) if start is not None else None
    return None if found is None else found[1] + len(change.text)


async def _complete(ls: RestLanguageServer, uri: str, position: types.Position):
    """(Completion or None, clamped position); cancels the service's work when this request is cancelled.

    A document changed while the completion was computed answers ContentModified: the text and position would
    be those of the older version.
    """
    found = _cursor(ls, uri, position)
    if found is None or ls.service is None:
        return None, position
    text, offset, pos = found
    doc = ls.workspace.text_documents.get(unquote(uri))
    version = doc.version
    try:
        ticket = ls.service.submit(uri, text, offset)
    except BadText as err:  # this request fails with its sentence; the document's next ones do not
        raise JsonRpcInvalidParams(str(err)) from None
    try:
        completion = await asyncio.wrap_future(ticket.future)
    except asyncio.CancelledError:
        ticket.cancel()
        raise
    now = ls.workspace.text_documents.get(unquote(uri))
    if now is not doc or now.version != version or now.source != text:
        raise JsonRpcContentModified(f"{uri} changed while its completion was computed.")
    return completion, pos


def _hinted_cursor(ls: RestLanguageServer, params: Any) -> tuple[str, str, int] | None:
    """(uri, text, offset) of a cursor notification, or None when its params do not name a place in an open
    document (a position past the end is not clamped: a stale hint must not warm a place nobody is at)."""
    uri = getattr(getattr(params, "textDocument", None), "uri", None)
    position = getattr(params, "position", None)
    line, character = getattr(position, "line", None), getattr(position, "character", None)
    if not isinstance(uri, str) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                           for n in (line, character)):
        return None
    asked = types.Position(line=line, character=character)
    found = _cursor(ls, uri, asked)
    if found is None or found[2] != asked:
        return None
    return uri, found[0], found[1]


async def _pull_settings(ls: RestLanguageServer) -> Any:
    """Our section of the client's configuration, or None when the client cannot or will not say."""
    workspace = ls.client_capabilities.workspace
    if not (workspace and workspace.configuration):
        return None
    try:
        found = await ls.workspace_configuration_async(
            types.ConfigurationParams(items=[types.ConfigurationItem(section=settings_module.SECTION_NAMES[0])]))
    except Exception as err:  # a client error must not cost the server its settings
        log.warning("workspace/configuration failed: %s", err)
        return None
    return found[0] if found else None


def _accept_command(completion: Completion) -> types.Command:
    return types.Command(title="Accept completion", command=ACCEPT_COMMAND,
                         arguments=[{"id": completion.id, "text": completion.text}])


class _ContentModifiedIsNoError(logging.Filter):
    """pygls logs every error reply as an error with its traceback. ContentModified answers a request that the
    user's typing superseded: the normal case while typing, up to one a keystroke, so it is left out of the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], JsonRpcContentModified))


def _quiet_content_modified() -> None:
    rpc_log = logging.getLogger("pygls.protocol.json_rpc")
    if not any(isinstance(f, _ContentModifiedIsNoError) for f in rpc_log.filters):
        rpc_log.addFilter(_ContentModifiedIsNoError())


def close_service(service: Service) -> None:
    """Stop the service's work; a model load under way is not waited for (it cannot be stopped, and the process
    ends without Python's exit, which would wait for it, or abort while it runs inside torch)."""
    service.close(wait_for_loads=False)


def create_server(settings: Settings | None = None, make_service: ServiceFactory = CompletionService,
                  on_exit: Callable[[RestLanguageServer, int], object] | None = None) -> RestLanguageServer:
    """The language server; `make_service(settings, events)` builds its service at `initialize`, and `on_exit(server,
    code)` ends the process at `exit`."""
    _quiet_content_modified()
    server = RestLanguageServer(settings or Settings(), on_exit)

    @server.feature(types.INITIALIZE)
    def initialize(ls: RestLanguageServer, params: types.InitializeParams) -> None:
        ls.loop = asyncio.get_running_loop()
        ls.workspace.__class__ = LspWorkspace  # pygls built it just before this handler: same state, LSP lines
        ls.service = make_service(ls.settings, _Events(ls, ls.loop))
        ls.apply_settings(params.initialization_options)

    @server.feature(types.INITIALIZED)
    def initialized(ls: RestLanguageServer, params: types.InitializedParams) -> None:
        roots = [to_fs_path(f.uri) for f in ls.workspace.folders.values()]
        if not roots and ls.workspace.root_path:
            roots = [ls.workspace.root_path]
        ls.service.start([Path(r) for r in roots if r])

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: RestLanguageServer, params: types.DidChangeConfigurationParams) -> None:
        values = params.settings
        if not values:  # the pull model (VS Code sends null): ask for our section
            values = await _pull_settings(ls)
        ls.apply_settings(values)

    folder_changes = asyncio.Lock()  # applied one after the other, in the order they came

    @server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    async def did_change_workspace_folders(ls: RestLanguageServer, params: types.DidChangeWorkspaceFoldersParams):
        if ls.service is not None:
            async with folder_changes:  # in a thread: removing a folder joins its watcher
                await asyncio.to_thread(ls.service.change_roots, _folder_paths(params.event.added),
                                        _folder_paths(params.event.removed))

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_open_or_change(ls: RestLanguageServer, params) -> None:
        uri = params.text_document.uri
        doc = ls.workspace.text_documents.get(unquote(uri))
        if doc is not None and ls.service is not None:
            ls.service.cancel(uri)  # a decode for the older text is wasted: stop it
            ls.service.change_buffer(_doc_id(uri), doc.source)
            where = _changed_at(ls, uri, params)
            if where is not None:
                ls.service.expect(uri, doc.source, where)

    @server.feature(CURSOR_NOTIFICATION)
    def cursor_moved(ls: RestLanguageServer, params: Any) -> None:
        found = _hinted_cursor(ls, params)
        if found is None:
            log.debug("%s ignored: %r", CURSOR_NOTIFICATION, params)
        elif ls.service is not None:
            ls.service.moved(*found)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: RestLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        if ls.service is not None:
            ls.service.close_buffer(_doc_id(params.text_document.uri))
            ls.service.close_document(params.text_document.uri)  # its KV cache, prompt start and suggestions

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: RestLanguageServer, params: types.InlineCompletionParams):
        completion, pos = await _complete(ls, params.text_document.uri, params.position)
        if completion is None:
            return types.InlineCompletionList(items=[])
        item = types.InlineCompletionItem(insert_text=completion.text, range=types.Range(start=pos, end=pos),
                                          command=_accept_command(completion))
        return types.InlineCompletionList(items=[item])

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
    async def completion(ls: RestLanguageServer, params: types.CompletionParams):
        completion, pos = await _complete(ls, params.text_document.uri, params.position)
        if completion is None:
            return types.CompletionList(is_incomplete=True, items=[])
        first = completion.text.strip().splitlines()[0]
        item = types.CompletionItem(
            label=first[:LABEL_CHARS] + ("…" if len(first) > LABEL_CHARS or "\n" in completion.text.strip() else ""),
            kind=types.CompletionItemKind.Text,
            detail="rest-lsp",
            text_edit=types.TextEdit(range=types.Range(start=pos, end=pos), new_text=completion.text),
            filter_text="",
            sort_text="0",
            command=_accept_command(completion),
        )
        # incomplete: the client asks again as the user types, so the suggestion follows the text
        return types.CompletionList(is_incomplete=True, items=[item])

    @server.command(ACCEPT_COMMAND)
    async def accept(ls: RestLanguageServer, *args) -> bool:
        arg = args[0] if args else None
        if not isinstance(arg, dict) or not isinstance(arg.get("text"), str) or ls.service is None:
            return False
        cid = arg.get("id") if isinstance(arg.get("id"), int) else None
        return await asyncio.to_thread(ls.service.accept, cid, arg["text"])

    @server.command(STATS_COMMAND)
    def stats(ls: RestLanguageServer, *args) -> dict:
        return ls.service.stats() if ls.service is not None else {}

    @server.command(DRAFTS_COMMAND)
    async def drafts(ls: RestLanguageServer, *args) -> list:
        """Debugging: what the workspace datastore proposes after the given text."""
        if not args or not isinstance(args[0], str) or ls.service is None:
            return []
        found = await asyncio.to_thread(ls.service.drafts, args[0])
        return [{"text": text, "weight": weight} for text, weight in found]

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: RestLanguageServer, *args) -> None:
        first, ls.shut_down = not ls.shut_down, True
        if ls.service is not None and first:
            # in a thread: close() joins threads that may wait for this event loop (progress reports)
            await asyncio.to_thread(close_service, ls.service)

    @server.feature(types.EXIT)
    def exit_(ls: RestLanguageServer, *args) -> None:
        # The process ends here: pygls' own exit loses its code on the way out of start_io, and its event loop, left
        # running while the service stops, would write the service's last answers into the closed stream.
        ls.exit_code = 0 if ls.shut_down else 1
        if ls.on_exit is not None:
            ls.on_exit(ls, ls.exit_code)

    return server
