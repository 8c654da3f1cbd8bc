"""A replica's workspaces: each with its own completion service and datastore fed from the client's token deltas,
kept in an LRU bounded by a memory budget (the least recently used workspace goes first; its client then sends
a new snapshot when it asks again).

Log lines name their workspace (WorkspaceTag, on the replica's log handler): those of a request by the workspace
its route names (CURRENT_WORKSPACE, which app.py sets for each request and asyncio.to_thread carries), those of a
workspace's own service threads (its decoding thread) by the thread.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import logging
import threading
import weakref
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from rest_lsp.service.completion import CompletionService, NoEvents, Ticket
from rest_lsp.settings import Settings
from rest_lsp.team.limits import Limits
from rest_lsp.team.protocol import CLIENT_SETTINGS, Delta, Doc, Events, Snapshot, SyncReply
from rest_lsp.team.shared_model import SharedModel

log = logging.getLogger(__name__)

# What a workspace costs besides its datastore: a tokenizer copy, outputs, caches of suggestions.
WORKSPACE_OVERHEAD_BYTES = 16 << 20
READY_TIMEOUT_S = 60


class Owner(NamedTuple):
    """A workspace as its editor names it: its id and the sha256 of its key (protocol.KEY_HEADER). Two editors
    that send one id with two keys have two workspaces: neither sees, replaces nor closes the other's."""
    workspace: str
    digest: bytes

    @classmethod
    def of(cls, workspace: str, key: str) -> "Owner":
        return cls(workspace, hashlib.sha256(key.encode()).digest())

    def matches(self, other: "Owner") -> bool:
        """The same workspace: ids equal, keys compared in constant time."""
        return self.workspace == other.workspace and hmac.compare_digest(self.digest, other.digest)

    @property
    def name(self) -> str:
        """What names its documents in the replica's shared stores."""
        return f"{self.workspace}\0{self.digest.hex()}"


class SyncRefused(Exception):
    """A snapshot the replica cannot take (another tokenizer); str(err) is one sentence for the user."""


class BadTokens(ValueError):
    """Token ids outside the model's vocabulary."""


CURRENT_WORKSPACE: contextvars.ContextVar[str | None] = contextvars.ContextVar("rest_lsp_workspace", default=None)
_THREADS: "weakref.WeakKeyDictionary[threading.Thread, str]" = weakref.WeakKeyDictionary()  # service thread -> ws
_THREADS_LOCK = threading.Lock()
_CREATING = threading.Lock()  # one workspace's service starts at a time: the threads it starts are its own
SERVICE_THREADS = ("rest-lsp-decoder", "rest-lsp-buffers", "rest-lsp-loader")


def thread_workspace(thread: threading.Thread) -> str | None:
    with _THREADS_LOCK:
        return _THREADS.get(thread)


class WorkspaceTag(logging.Filter):
    """Puts `[workspace] ` before a log line of a request or of a workspace's service thread (and sets
    `record.workspace`); a line that names its workspace already is left as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "workspace", None) is None:
            workspace = CURRENT_WORKSPACE.get() or thread_workspace(threading.current_thread())
            if workspace is not None:
                record.workspace = workspace
                record.msg = f"[{workspace}] {record.msg}"
        return True


class _Log(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        kwargs["extra"] = {**kwargs.get("extra", {}), "workspace": self.extra["workspace"]}
        return f"[{self.extra['workspace']}] {msg}", kwargs


class _Events(NoEvents):
    """The service's messages (a model ready, a setting refused) in the log, naming the workspace."""

    def __init__(self, log: logging.LoggerAdapter):
        self.log = log

    def message(self, level: str, text: str) -> None:
        getattr(self.log, level if level in ("error", "warning", "info") else "info")(text)


def _checked(docs: list[Doc], vocab_size: int, field: str) -> list[tuple[str, np.ndarray, object]]:
    """(doc id, token ids, source) of each document; BadTokens naming the first with ids past the vocabulary
    (protocol.py bounds them to int32 first: they fit int64)."""
    from rest_lsp.datastore import Source

    out = []
    for i, doc in enumerate(docs):
        tokens = np.asarray(doc.tokens, dtype=np.int64)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
            raise BadTokens(f"The body's field {field}[{i}].tokens holds token ids outside 0..{vocab_size - 1}.")
        source = Source.OPEN_BUFFER if doc.source == "buffer" else Source.WORKSPACE
        out.append((doc.doc_id, tokens, source))
    return out


class WorkspaceState:
    """One workspace on one replica: its completion service, its datastore, where its sync stands."""

    def __init__(self, owner: Owner, shared: SharedModel, settings: Settings, limits: Limits = Limits()):
        workspace = owner.workspace
        self.owner, self.workspace, self.shared, self.limits = owner, workspace, shared, limits
        self.defaults = settings = limits.clamp(settings)
        self.log = _Log(log, {"workspace": workspace})
        with _CREATING:
            before = set(threading.enumerate())
            self.service = CompletionService(settings, _Events(self.log),
                                             load=lambda s: shared.for_workspace(owner.name))
            self.service.start([])
            ready = self.service.wait_ready(READY_TIMEOUT_S)
            with _THREADS_LOCK:
                for thread in set(threading.enumerate()) - before:
                    if thread.name in SERVICE_THREADS:
                        _THREADS[thread] = workspace
        if not ready:
            raise RuntimeError(f"workspace {workspace}: {self.service.load_error or 'not ready'}")
        self.lock = threading.Lock()
        self.epoch: str | None = None
        self.seq = 0
        self.event_seq = 0
        self.settings: dict = {}
        self.tickets: dict[str, Ticket] = {}

    def reply(self, need: bool = False, reason: str | None = None) -> SyncReply:
        return SyncReply(epoch=self.epoch, seq=self.seq, need_snapshot=need, reason=reason)

    def snapshot(self, snap: Snapshot) -> SyncReply:
        if snap.tokenizer_key != self.shared.tokenizer_key:
            raise SyncRefused(f"the workspace was tokenized with tokenizer {snap.tokenizer_key}, the server's model "
                              f"uses {self.shared.tokenizer_key}: fetch the server's tokenizer and index again.")
        puts = _checked(snap.docs, self.shared.vocab_size, "docs")
        self.apply_settings(snap.settings)
        datastore = self.service._datastore
        with self.lock:
            keep = {d for d, _, _ in puts}
            gone = [d for d in datastore.doc_ids() if d not in keep and not d.startswith("accepted:")]
            datastore.apply(puts, gone)
            self.epoch, self.seq = snap.epoch, 0
        self.log.info("snapshot %s: %d documents, %d tokens", snap.epoch, len(puts), sum(len(t) for _, t, _ in puts))
        return self.reply()

    def delta(self, delta: Delta) -> SyncReply:
        puts = _checked(delta.puts, self.shared.vocab_size, "puts")
        with self.lock:
            if delta.epoch != self.epoch:
                return self.reply(True, "unknown epoch")
            if delta.seq <= self.seq:
                return self.reply()  # sent again after a lost answer: already applied
            if delta.seq != self.seq + 1:
                self.log.info("delta %d after %d: a gap, asking for a snapshot", delta.seq, self.seq)
                return self.reply(True, f"gap: delta {delta.seq} after {self.seq}")
            self.service._datastore.apply(puts, delta.removes)
            self.seq = delta.seq
        return self.reply()

    def apply_settings(self, values: dict | None) -> None:
        ours = {k: v for k, v in (values or {}).items() if k in CLIENT_SETTINGS}
        if ours == self.settings:
            return
        self.settings = ours
        new, errors = self.defaults.update(ours, self.defaults)
        if errors:
            self.log.warning("settings ignored: %s", " ".join(errors))
        self.service.update_settings(self.limits.clamp(new))

    def events(self, batch: Events | None) -> None:
        """Hints in order; a batch older than one applied is stale (its place has moved on) and dropped."""
        if batch is None:
            return
        with self.lock:
            if batch.seq <= self.event_seq:
                return
            self.event_seq = batch.seq
        for event in batch.events:
            if event.kind == "cancel":
                self.service.cancel(event.doc_id)
            elif event.kind == "close":
                close = getattr(self.service, "close_document", None)  # its KV cache, prompt start, suggestions
                if close is not None:
                    close(event.doc_id)
            elif event.text is not None and event.offset is not None:
                if event.kind == "change":
                    self.service.expect(event.doc_id, event.text, event.offset)
                else:
                    self.service.moved(event.doc_id, event.text, event.offset)

    def submit(self, request_id: str, doc_id: str, text: str, offset: int) -> Ticket:
        ticket = self.service.submit(doc_id, text, offset)
        with self.lock:
            self.tickets[request_id] = ticket
        return ticket

    def finished(self, request_id: str) -> None:
        with self.lock:
            self.tickets.pop(request_id, None)

    def cancel(self, request_id: str) -> bool:
        with self.lock:
            ticket = self.tickets.pop(request_id, None)
        if ticket is not None:
            ticket.cancel()
        return ticket is not None

    def nbytes(self) -> int:
        datastore = self.service._datastore
        return WORKSPACE_OVERHEAD_BYTES + (int(datastore.stats()["bytes"]) if datastore is not None else 0)

    def close(self) -> None:
        self.service._model.documents.forget_all()
        self.service.close()


class Workspaces:
    """The LRU of a replica's workspaces, bounded by `budget_bytes` however each was made (the one in use always
    stays). A workspace is found by its Owner: its id and its key."""

    def __init__(self, shared: SharedModel, settings: Settings, budget_bytes: int, limits: Limits = Limits()):
        self.shared, self.settings, self.budget, self.limits = shared, settings, budget_bytes, limits
        self._lock = threading.Lock()
        self._states: OrderedDict[Owner, WorkspaceState] = OrderedDict()
        self._creating: dict[str, threading.Lock] = {}

    def _lookup(self, owner: Owner) -> Owner | None:
        """(under the lock) The key `owner` is held under, if any: keys compared in constant time."""
        found = None
        for held in self._states:
            if held.matches(owner):
                found = held
        return found

    def get(self, owner: Owner) -> tuple[WorkspaceState, bool]:
        """(its state, whether it was created now: the client must send a snapshot)."""
        with self._lock:
            held = self._lookup(owner)
            if held is not None:
                self._states.move_to_end(held)
                return self._states[held], False
            gate = self._creating.setdefault(owner.name, threading.Lock())
        with gate:  # one creation per workspace; others wait for it
            with self._lock:
                held = self._lookup(owner)
                if held is not None:
                    return self._states[held], False
            state = WorkspaceState(owner, self.shared, self.settings, self.limits)
            with self._lock:
                self._states[owner] = state
                self._creating.pop(owner.name, None)
            state.log.info("new on this replica")
        self.trim()  # a workspace made by any route counts against the budget
        return state, True

    def find(self, owner: Owner) -> WorkspaceState | None:
        with self._lock:
            held = self._lookup(owner)
            if held is None:
                return None
            self._states.move_to_end(held)
            return self._states[held]

    def trim(self) -> None:
        """Drop least recently used workspaces until the rest fit the budget."""
        with self._lock:
            states = list(self._states.items())
        total = sum(s.nbytes() for _, s in states)
        dropped = []
        with self._lock:
            for name, state in states[:-1]:
                if total <= self.budget:
                    break
                total -= state.nbytes()
                self._states.pop(name, None)
                dropped.append(state)
        for state in dropped:
            state.log.info("dropped (memory budget %d MB)", self.budget >> 20)
            threading.Thread(target=state.close, name="rest-lsp-drop-workspace", daemon=True).start()

    def drop(self, owner: Owner) -> bool:
        """Forget a workspace (its editor closed); False when it was not here."""
        with self._lock:
            held = self._lookup(owner)
            state = self._states.pop(held) if held is not None else None
        if state is not None:
            state.log.info("closed by its editor")
            state.close()
        return state is not None

    def names(self) -> list[str]:
        with self._lock:
            return [owner.workspace for owner in self._states]

    def states(self) -> list[WorkspaceState]:
        """Every workspace held, least recently used first (for tests and counts: they name no key)."""
        with self._lock:
            return list(self._states.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._states)

    def close(self) -> None:
        with self._lock:
            states, self._states = list(self._states.values()), OrderedDict()
        for state in states:
            state.close()
