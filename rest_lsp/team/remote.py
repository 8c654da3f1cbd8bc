"""The completion service's interface, served by a team's server: what server.py calls, over HTTP.

The editor keeps its files: the workspace is indexed and watched here with the server's own tokenizer (fetched
from it: no model, no torch on this side), and goes to the server as a snapshot, then deltas (mirror.py). Edits
and cursor moves go as hints; a completion carries the hints not sent yet. A completion whose replica died is
sent once more and the workspace again (to the replica that takes it over); an unreachable server is said once an
outage, and its return too. A refusal is said once with its cause (advice.py), then asked again later and later
(backoff.py); a snapshot refused for another tokenizer (the server's model changed) fetches the new one and indexes
again. Snapshots go compressed in chunks (upload_client.py); the workspace is named by an id and a key of its own
(identity.py). stats() never waits on the language server's event loop (its HTTP call runs here).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from rest_lsp.auth import is_loopback
from rest_lsp.datastore.ignore import is_secret_path
from rest_lsp.service.feeding import DatastoreFeed, HostThreads, workspace_key
from rest_lsp.service.scheduling import Completion, resolve_future
from rest_lsp.settings import Settings
from rest_lsp.team import advice
from rest_lsp.team.backoff import Backoff
from rest_lsp.team.http import Http, Refused, TimedOut, Unreachable, Untrusted
from rest_lsp.team.identity import new_key, quoted, workspace_id
from rest_lsp.team.mirror import Mirror, RecordingDatastore
from rest_lsp.team.protocol import API, CLIENT_SETTINGS, CompleteRequest, Event, Events
from rest_lsp.team.upload_client import ChunkedUpload, OldServer, one_shot_timeout

log = logging.getLogger(__name__)

RETRY_S = 2.0  # wait between attempts to reach an unreachable server, and the first one after a refusal
REFUSED_MOST_S = 300.0  # a server that keeps refusing is asked again at most this far apart
SYNC_WAIT_S = 0.2  # a delta gathers the changes of this long
INDEX_WAIT_S = 120  # the first snapshot waits this long for the local index (completions meanwhile use the model)
COMPLETE_SLACK_S = 10.0  # a completion waits this much longer than the time budget before it is given up
STATS_WAIT_S = 2.0  # the server's part of stats(): asked for this long (off the event loop, waited for as long)


class RemoteTicket:
    future: Future

    def __init__(self, service: "RemoteService", request_id: str):
        self._service, self.request_id = service, request_id
        self.future: Future = Future()
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        """Give up this request: None now, and the replica stops its work."""
        if self.cancelled.is_set():
            return
        self.cancelled.set()
        resolve_future(self.future, None)
        self._service._cancel_remote(self.request_id)


class RemoteService(HostThreads):
    """The Service (rest_lsp/service/interface.py) that a team's server decodes for."""

    def __init__(self, settings: Settings, events, url: str, token: str, ca_file: str | None = None,
                 timeout_s: float | None = None):
        self.settings = settings
        self._ca_file = ca_file  # https: the CA certificate to trust (a team's self-signed one); None: the system's
        self._timeout_s = timeout_s  # a completion's; None: the time budget and COMPLETE_SLACK_S
        self.events = events
        self.url = url
        self._token = token
        self._lock = threading.RLock()
        self._ready = threading.Event()  # the server's tokenizer is here: the local index can run
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loaded = None  # SimpleNamespace(tokenizer=SavedTokenizer): what the feed needs of a model
        self._roots: list[Path] = []
        self.workspace = workspace_id([])
        self._key = new_key()  # the workspace's secret (identity.py): goes with its id, never into a log
        self._http: Http | None = None
        self._mirror: Mirror | None = None
        self._need_snapshot = True
        self._sync_wake = threading.Event()
        self._pending_delta = None
        self._events: list[Event] = []
        self._event_seq = itertools.count(1)
        self._events_wake = threading.Event()
        self._requests = ThreadPoolExecutor(4, thread_name_prefix="rest-lsp-remote")
        self._ids = itertools.count(1)
        self.status = "connecting"
        self.load_error: str | None = None
        self._said_unreachable = False
        self._told: set[tuple] = set()  # the refusals said since the server last took a request
        self._backoff = Backoff(RETRY_S, REFUSED_MOST_S)
        self._tokenizer_refused = False  # a snapshot was refused for another tokenizer: fetched again since
        self._chunked = True  # snapshots in chunks, until the server turns out to have no chunk routes
        self._remote_stats: dict = {}
        self._stats_refresh: Future | None = None
        self._replicas: Counter = Counter()  # answers per replica
        self._counts = {"completions_served": 0, "completions_sent": 0, "retried": 0, "snapshots_sent": 0,
                        "deltas_sent": 0, "cancelled": 0, "unreachable": 0}
        self._feed = DatastoreFeed(self)

    # -- what the feed needs of its host ------------------------------------------------------------------------
    def _tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        return self._loaded.tokenizer.encode_batch(texts)

    def _is_closed(self) -> bool:
        return self._closed.is_set()

    # -- lifecycle ----------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def wait_indexed(self, timeout: float | None = None) -> bool:
        return self._feed.indexed.wait(timeout)

    def start(self, roots: list[Path] | None = None) -> None:
        with self._lock:
            self._roots = [Path(r) for r in roots or []]
            self._feed.roots = list(self._roots)
            self.workspace, self._key = workspace_id(self._roots), new_key()
            self._http = Http(self.url, self._token, self.workspace, ca_file=self._ca_file, key=self._key)
        log.info("workspace %s on %s", self.workspace, self.url)
        self._spawn(self._sync_loop, "rest-lsp-remote-sync")
        self._spawn(self._events_loop, "rest-lsp-remote-events")

    def update_settings(self, settings: Settings) -> None:
        with self._lock:
            old, self.settings = self.settings, settings
        if _client_settings(old) != _client_settings(settings):
            self._request_snapshot()
        if self._ready.is_set() and workspace_key(old) != workspace_key(settings):
            self._feed.restart_indexing()

    def close(self, timeout: float = 10.0, wait_for_loads: bool = True) -> None:
        """Stop syncing, then free the workspace on the server (a delta after that would find it unknown and a
        snapshot bring it back); `wait_for_loads` means nothing here (no model loads)."""
        self._closed.set()
        self._sync_wake.set()
        self._events_wake.set()
        threads = self._feed.close() + list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
        if self.status == "connected":  # the replica may free the workspace now rather than at its LRU's turn
            try:
                self._http.call("DELETE", self._path(""), timeout=2, closing=True)
            except (Unreachable, Refused) as err:
                log.info("closing the workspace on the server failed: %s", err)
        self._requests.shutdown(wait=False, cancel_futures=True)
        if self._feed.datastore is not None:
            self._feed.datastore.close()

    # -- documents and hints ------------------------------------------------------------------------------------
    def open_buffer(self, doc_id: str, text: str) -> None:
        self._feed.open_buffer(doc_id, text)

    change_buffer = open_buffer

    def close_buffer(self, doc_id: str) -> None:
        self._feed.close_buffer(doc_id)

    def close_document(self, doc_id: str) -> None:
        self._hint(Event(kind="close", doc_id=doc_id))

    def change_roots(self, added: list[Path], removed: list[Path]) -> None:
        """Folders added or removed: indexed here and sent, or dropped (the deltas carry either)."""
        self._feed.change_roots([Path(r) for r in added], [Path(r) for r in removed])

    def cancel(self, doc_id: str) -> None:
        self._hint(Event(kind="cancel", doc_id=doc_id))

    def expect(self, doc_id: str, text: str, offset: int) -> None:
        self._hint(Event(kind="change", doc_id=doc_id, text=text, offset=max(0, min(offset, len(text)))))

    def moved(self, doc_id: str, text: str, offset: int) -> bool:
        self._hint(Event(kind="cursor", doc_id=doc_id, text=text, offset=max(0, min(offset, len(text)))))
        return True

    def _hint(self, event: Event) -> None:
        if is_secret_path(event.doc_id):  # a credential's text never leaves the editor
            return
        with self._lock:
            self._events.append(event)
        self._events_wake.set()

    def _take_hints(self, always: bool = False) -> Events | None:
        """The hints not sent yet as the next batch; None when there are none, unless `always`."""
        with self._lock:
            if not self._events and not always:
                return None
            events, self._events = self._events, []
            return Events(seq=next(self._event_seq), events=events)

    def _events_loop(self) -> None:
        while not self._closed.is_set():
            self._events_wake.wait()
            self._events_wake.clear()
            batch = self._take_hints()
            if batch is None or self.status != "connected":
                continue
            try:
                self._http.call("POST", self._path("/events"), batch.model_dump(), timeout=5)
            except (Unreachable, Refused) as err:  # hints: a lost one costs a warm-up, never a suggestion
                log.info("hints not delivered: %s", err)

    # -- completions --------------------------------------------------------------------------------------------
    def submit(self, doc_id: str, text: str, offset: int) -> RemoteTicket:
        ticket = RemoteTicket(self, f"{next(self._ids)}-{uuid.uuid4().hex[:8]}")
        if self.status != "connected" or is_secret_path(doc_id):  # a credential's text never leaves the editor
            resolve_future(ticket.future, None)
            return ticket
        offset = max(0, min(offset, len(text)))
        self._requests.submit(self._run, ticket, doc_id, text, offset)
        return ticket

    def _run(self, ticket: RemoteTicket, doc_id: str, text: str, offset: int) -> None:
        try:
            resolve_future(ticket.future, self._complete(ticket, doc_id, text, offset))
        except Exception as err:  # never leave the editor waiting
            log.exception("a remote completion failed")
            resolve_future(ticket.future, None)
            self._report("warning", f"rest-lsp: a completion failed: {err}")

    def _complete(self, ticket: RemoteTicket, doc_id: str, text: str, offset: int) -> Completion | None:
        # a batch even when empty: numbered after any still on its way, it makes that one stale on the replica, so
        # a cancel sent before this request never lands after it and stops it
        body = CompleteRequest(request_id=ticket.request_id, doc_id=doc_id, text=text, offset=offset,
                               events=self._take_hints(always=True),
                               settings=_client_settings(self.settings)).model_dump()
        path = self._path("/complete")
        timeout = self._timeout_s or self.settings.time_budget_ms / 1e3 + COMPLETE_SLACK_S
        with self._lock:
            self._counts["completions_sent"] += 1
        for attempt in (0, 1):
            if ticket.cancelled.is_set():
                return None
            try:
                reply = self._http.call("POST", path, body, timeout=timeout)
                break
            except TimedOut:
                log.warning("[%s] completion %s timed out after %.0f s: cancelled", self.workspace,
                            ticket.request_id, timeout)
                ticket.cancel()
                return None
            except Unreachable as err:
                if attempt or self._closed.is_set():
                    self._unreachable(err)
                    return None
                # its replica died, most likely: once more (completions are idempotent), then the workspace again
                log.warning("[%s] completion %s failed (%s): retried once", self.workspace, ticket.request_id, err)
                with self._lock:
                    self._counts["retried"] += 1
                self._request_snapshot()
            except Refused as err:
                log.warning("[%s] completion refused: %s", self.workspace, err)
                return None
        if reply.get("need_snapshot"):
            self._request_snapshot()
        with self._lock:
            self._remote_stats["replica"] = reply.get("replica")
            self._replicas[reply.get("replica")] += 1
        if ticket.cancelled.is_set() or reply.get("text") is None:
            return None
        with self._lock:
            self._counts["completions_served"] += 1
        return Completion(reply["text"], reply["id"], reply["tokens"], reply["steps"], reply["latency_ms"],
                          reply["source"])

    def _cancel_remote(self, request_id: str) -> None:
        with self._lock:
            self._counts["cancelled"] += 1
        if self._http is None or self._closed.is_set():
            return

        def send() -> None:
            try:
                self._http.call("POST", self._path("/cancel"), {"request_id": request_id}, timeout=5)
            except (Unreachable, Refused) as err:
                log.info("cancel of %s not delivered: %s", request_id, err)

        self._requests.submit(send)

    def accept(self, completion_id: int | None, text: str) -> bool:
        if self.status != "connected" or not text:
            return False
        try:
            answer = self._http.call("POST", self._path("/accept"), {"id": completion_id, "text": text}, timeout=10)
        except (Unreachable, Refused) as err:
            log.info("accept not delivered: %s", err)
            return False
        return bool(answer.get("accepted"))

    def drafts(self, text: str, limit: int = 10) -> list[tuple[str, float]]:
        if self.status != "connected":
            return []
        try:
            found = self._http.call("POST", self._path("/drafts"), {"text": text}, timeout=10)
        except (Unreachable, Refused):
            return []
        return [(d["text"], float(d["weight"])) for d in found[:limit]]

    def stats(self) -> dict:
        """Ours and the replica's numbers. The replica's are asked on a worker thread: called on an event loop's
        thread (the language server's command), this answers at once with the last ones it got; elsewhere it
        waits up to STATS_WAIT_S for fresh ones."""
        refresh = self._refresh_stats()
        if refresh is not None and not _on_event_loop():
            try:
                refresh.result(STATS_WAIT_S)
            except Exception:  # late, or the pool shut down: the last numbers will do
                pass
        store = self._feed.datastore.stats() if self._feed.datastore is not None else {}
        with self._lock:
            return {**self._remote_stats, **self._counts, "mode": "remote", "remote": self.url,
                    "status": self.status, "workspace": self.workspace, "ready": self.status == "connected",
                    "load_error": self.load_error, "local_documents": int(store.get("documents", 0)),
                    "local_tokens": int(store.get("tokens", 0)), "replicas": dict(self._replicas)}

    def _refresh_stats(self) -> Future | None:
        """The replica's numbers asked on a worker thread (one request at a time); None when not connected."""
        if self.status != "connected" or self._closed.is_set():
            return None

        def fetch() -> None:
            try:
                found = self._http.call("GET", self._path("/stats"), timeout=STATS_WAIT_S)
            except (Unreachable, Refused):
                return
            with self._lock:
                self._remote_stats.update(found)

        with self._lock:
            if self._stats_refresh is None or self._stats_refresh.done():
                try:
                    self._stats_refresh = self._requests.submit(fetch)
                except RuntimeError:  # closed meanwhile
                    return None
            return self._stats_refresh

    # -- the workspace's sync -----------------------------------------------------------------------------------
    def _path(self, tail: str) -> str:
        """A route under this workspace: its id percent-encoded, whatever its folder is called."""
        return f"{API}/workspaces/{quoted(self.workspace)}{tail}"

    def _request_snapshot(self) -> None:
        with self._lock:
            self._need_snapshot = True
        self._sync_wake.set()

    def _unreachable(self, err: Exception) -> None:
        with self._lock:
            self._counts["unreachable"] += 1
            first = not self._said_unreachable
            self._said_unreachable = True
            if isinstance(err, Untrusted):
                self.status = "untrusted"
                self.load_error = advice.untrusted(self.url, err, self._ca_file)
            else:
                self.status = "unreachable"
                self.load_error = f"the team server at {self.url} cannot be reached ({err})"
            self._need_snapshot = True
        if first:
            self._report("error", f"rest-lsp: {self.load_error}; completions resume when it answers.")
        self._sync_wake.set()

    def _refused(self, err: Refused) -> float:
        """A refusal: said once per cause until the server takes a request again; the wait before the next try.
        A snapshot refused for another tokenizer first fetches the server's tokenizer (the model changed)."""
        kind = err.body.get("kind") if isinstance(err.body, dict) else None
        if err.status == 409 and kind == "tokenizer" and not self._tokenizer_refused:
            log.info("[%s] the server's tokenizer changed: fetching it and indexing again", self.workspace)
            with self._lock:
                self._tokenizer_refused = True
                self._ready.clear()
            return 0.0
        cause = (err.status, kind)
        with self._lock:
            first = cause not in self._told
            self._told.add(cause)
            self.load_error = advice.refused(self.url, err)
            self.status = "refused"
        wait = self._backoff.next()
        if first:
            self._report("error", f"rest-lsp: {self.load_error}.")
        log.info("[%s] refused (%s); asking again in %.0f s", self.workspace, err, wait)
        return wait

    def _reached(self) -> None:
        with self._lock:
            said, self._said_unreachable = self._said_unreachable, False
            self.status, self.load_error = "connected", None
            self._told.clear()
            self._backoff.reset()
        if said:
            self._report("info", f"rest-lsp: the team server at {self.url} answers again.")

    def _sync_loop(self) -> None:
        while not self._closed.is_set():
            try:
                if not self._ready.is_set():
                    self._connect()
                elif self._need_snapshot:
                    self._send_snapshot()
                else:
                    self._send_delta()
                continue
            except Unreachable as err:
                self._unreachable(err)
                wait = RETRY_S
            except Refused as err:
                wait = self._refused(err)
            except Exception as err:  # the loop must live: a failure here is reported and retried
                log.exception("syncing with %s failed", self.url)
                self._report("warning", f"rest-lsp: syncing the workspace failed: {err}")
                wait = RETRY_S
            self._closed.wait(wait)

    def _connect(self) -> None:
        """The server's tokenizer, then the local index with it (again, when the server's has changed)."""
        from rest_lsp.engine.saved_tokenizer import SavedTokenizer

        found = self._http.call("GET", f"{API}/tokenizer", timeout=10)
        with self._lock:
            self._chunked = True  # a server that came back may be a newer one
            same = self._loaded is not None and self._loaded.tokenizer.key == found["key"]
            if same:  # the same tokenizer: the index stands
                self._need_snapshot = True
                self._ready.set()
        if same:
            return self._reached()
        tokenizer = SavedTokenizer(found["tokenizer"], bool(found["split_special_tokens"]))
        if tokenizer.key != found["key"]:
            raise Refused(409, f"the server's tokenizer reads back with key {tokenizer.key}, not {found['key']}")
        with self._lock:
            again = self._loaded is not None
            self._loaded = SimpleNamespace(tokenizer=tokenizer, name="remote")
            replaced, retired = self._feed.reset()
            self._feed.datastore = RecordingDatastore()
            self._mirror = Mirror(self._feed.datastore, tokenizer.key)
            self._need_snapshot, self._pending_delta = True, None
            self._ready.set()
        self._feed.retire(retired, None)  # not under the lock: stopping joins watcher threads
        if replaced is not None:
            replaced.close()
        self._reached()
        if again:
            self._report("info", f"rest-lsp: the team server at {self.url} runs another model now: the workspace "
                                 "is indexed again with its tokenizer.")
        self._feed.wake()
        self._feed.start_indexing()

    def _send_snapshot(self) -> None:
        self._feed.indexed.wait(INDEX_WAIT_S)
        with self._lock:
            self._need_snapshot = False
            snapshot = self._mirror.snapshot(_client_settings(self.settings))
            self._pending_delta = None
        try:
            reply = self._upload(snapshot)
        except Exception:
            self._request_snapshot()
            raise
        with self._lock:
            self._counts["snapshots_sent"] += 1
            self._tokenizer_refused = False
        log.info("[%s] snapshot %s sent: %d documents (replica %s)", self.workspace, snapshot.epoch,
                 len(snapshot.docs), reply.get("replica"))
        self._reached()

    def _upload(self, snapshot) -> dict:
        """The snapshot in compressed chunks; in one request to a server without the chunk routes."""
        payload = snapshot.model_dump_json().encode()
        if self._chunked:
            try:
                return ChunkedUpload(self._http, self._path("/snapshot"), payload, self._closed).send()
            except OldServer:
                log.info("[%s] the server has no chunk routes: snapshots go in one request", self.workspace)
                self._chunked = False
        return self._http.call("POST", self._path("/snapshot"), raw=payload, content_type="application/json",
                               timeout=one_shot_timeout(len(payload)))

    def _send_delta(self) -> None:
        datastore = self._feed.datastore
        if self._pending_delta is None:
            if not datastore.changed.wait(SYNC_WAIT_S) and not self._sync_wake.is_set():
                return
            self._sync_wake.clear()
            with self._lock:
                if self._need_snapshot:
                    return
                self._pending_delta = self._mirror.delta()
            if self._pending_delta is None:
                return
        delta = self._pending_delta
        reply = self._http.call("POST", self._path("/delta"), delta.model_dump(), timeout=60)
        with self._lock:
            self._pending_delta = None
            self._counts["deltas_sent"] += 1
        if reply.get("need_snapshot"):
            log.info("[%s] the server asks for a snapshot (%s)", self.workspace, reply.get("reason"))
            self._request_snapshot()
        self._reached()


def _client_settings(settings: Settings) -> dict:
    """The settings a workspace's replica takes from its editor, camelCase as editors send them."""
    import dataclasses

    out = {}
    for field in dataclasses.fields(settings):
        camel = "".join(w.capitalize() if i else w for i, w in enumerate(field.name.split("_")))
        if camel in CLIENT_SETTINGS:
            value = getattr(settings, field.name)
            out[camel] = list(value) if isinstance(value, tuple) else value
    return out


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def remote_target(url: str, token_file: str | None,
                  ca_file: str | None = None) -> tuple[str, str, str | None] | str:
    """(url, token, CA file) for `--remote URL --token-file F [--remote-ca-file C]`, or the sentence that says what
    is wrong. http:// only to a loopback host (an SSH tunnel): elsewhere the token and the code would cross in clear."""
    import ssl
    from urllib.parse import urlsplit

    from rest_lsp.errors import UserError
    from rest_lsp.auth import read_token

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"rest-lsp: --remote wants an http:// or https:// URL, got {url!r}."
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        return (f"rest-lsp: --remote {url} would send the token and your code in clear text: use https:// (the "
                "server's --tls-cert; --remote-ca-file here for a self-signed one), or http:// to a loopback "
                "address only (an SSH tunnel).")
    if ca_file and parts.scheme != "https":
        return f"rest-lsp: --remote-ca-file is for an https:// URL, got {url!r}."
    if ca_file:
        try:
            ssl.create_default_context(cafile=ca_file)
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
            return f"rest-lsp: --remote-ca-file {ca_file!r} is not a readable PEM certificate ({err})."
    if not token_file:
        return "rest-lsp: --remote needs --token-file FILE, the file holding the team server's token."
    try:
        return url, read_token(token_file), ca_file
    except UserError as err:
        return f"rest-lsp: {err}"
