"""The completion service: everything the language server does, without LSP types.

It owns the model (loaded in the background), the one Decoder (which keeps its KV cache
between requests), the workspace Datastore and its indexers, and one worker thread that
runs the decoder, so whoever calls in (the server's event loop) is never blocked.

Latency rules:
  - latest request wins: a new request for a document cancels the previous one, which
    stops decoding between steps (through the decoder's `should_stop`);
  - type-through: when the user typed the start of the last suggestion, the rest of it
    is the answer, without decoding;
  - a short debounce before decoding lets a burst of keystrokes collapse into one request.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rest_lsp.postprocess import StopContext, stop_context, trim
from rest_lsp.prompt import Fim, build_prompt, detect_fim
from rest_lsp.settings import Settings

log = logging.getLogger(__name__)

BUFFER_DEBOUNCE_S = 0.25  # open buffers are re-tokenized at most this often
TYPE_THROUGH_ENTRIES = 8
ACCEPT_CONTEXT_CHARS = 256  # text before an accepted completion stored with it, so drafts match where it goes


@dataclass(frozen=True)
class Completion:
    text: str
    id: int  # pass back to accept()
    tokens: int  # generated tokens (0 for type-through)
    steps: int
    latency_ms: float
    source: str  # "model" | "type-through"


class ServiceEvents(Protocol):
    """What the service tells its owner; called from the service's threads."""

    def message(self, level: str, text: str) -> None: ...  # level: "error" | "warning" | "info"
    def index_begin(self, root: str) -> None: ...
    def index_progress(self, root: str, done: int, total: int) -> None: ...
    def index_end(self, root: str, stats: dict) -> None: ...


class NoEvents:
    def message(self, level: str, text: str) -> None:
        getattr(log, level if level in ("error", "warning", "info") else "info")(text)

    def index_begin(self, root: str) -> None:
        pass

    def index_progress(self, root: str, done: int, total: int) -> None:
        pass

    def index_end(self, root: str, stats: dict) -> None:
        pass


@dataclass
class _Job:
    doc_id: str
    before: str
    after: str
    submitted: float
    future: Future = field(default_factory=Future)
    cancel_event: threading.Event = field(default_factory=threading.Event)

    def cancelled(self) -> bool:
        return self.cancel_event.is_set() or self.future.cancelled()


class Ticket:
    """A submitted request: its future resolves to a Completion or None (nothing to show)."""

    def __init__(self, job: _Job):
        self._job = job
        self.future: Future = job.future

    def cancel(self) -> None:
        """Stop the work now (between decoding steps); the future resolves to None."""
        self._job.cancel_event.set()


def _resolve(future: Future, value) -> None:
    try:
        future.set_result(value)
    except InvalidStateError:  # the caller cancelled the future itself
        pass


@dataclass
class _Shown:
    """A suggestion as it was shown, for type-through and acceptance."""

    id: int
    doc_id: str
    before: str
    after: str
    text: str


class CompletionService:
    def __init__(self, settings: Settings, events: ServiceEvents | None = None):
        self.settings = settings
        self.events: ServiceEvents = events or NoEvents()
        self.load_error: str | None = None
        self._lock = threading.RLock()
        self._tok_lock = threading.Lock()  # HF fast tokenizers are not safe to call from several threads
        self._loaded = None
        self._decoder = None
        self._fim: Fim | None = None
        self._stop_ids: frozenset[int] = frozenset()
        self._datastore = None
        self._indexes: dict[str, object] = {}
        self._roots: list[Path] = []
        self._ready = threading.Event()
        self._indexed = threading.Event()  # the workspace roots of the current model are indexed
        self._load_generation = 0
        self._closed = False
        # requests
        self._cond = threading.Condition(self._lock)
        self._queue: deque[_Job] = deque()
        self._running: _Job | None = None
        self._ids = itertools.count(1)
        self._shown: deque[_Shown] = deque(maxlen=TYPE_THROUGH_ENTRIES)
        self._accepted = itertools.count(1)
        # open buffers waiting to be (re)tokenized into the datastore
        self._buffers: dict[str, str] = {}  # open buffers: doc id -> text
        self._pending: dict[str, str | None] = {}  # to put into the datastore (None: closed, back to disk)
        self._buffers_dirty = threading.Event()
        # stats
        self._served = 0
        self._decoded = 0
        self._type_through_count = 0
        self._cancelled = 0
        self._gen_tokens = 0
        self._gen_steps = 0
        self._decode_ms = 0.0
        self._last_latency_ms: float | None = None
        self._worker = threading.Thread(target=self._work, name="rest-lsp-decoder", daemon=True)
        self._feeder = threading.Thread(target=self._feed_buffers, name="rest-lsp-buffers", daemon=True)
        self._worker.start()
        self._feeder.start()

    # -- lifecycle -------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once the model is loaded; False on timeout or when loading failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.load_error is not None:
                return False
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    def start(self, roots: list[Path] | None = None) -> None:
        """Load the model in the background, then index the workspace roots."""
        with self._lock:
            self._roots = [Path(r) for r in roots or []]
        self._start_loading()

    def _start_loading(self) -> None:
        with self._lock:
            self._load_generation += 1
            generation = self._load_generation
            self._ready.clear()
            self._indexed.clear()
            self.load_error = None
        threading.Thread(target=self._load, args=(generation,), name="rest-lsp-loader", daemon=True).start()

    def _load(self, generation: int) -> None:
        from rest_lsp.decoding import Decoder
        from rest_lsp.model import load_model

        s = self.settings
        try:
            loaded = load_model(s.model, s.device, s.dtype)
            decoder = Decoder(loaded)
        except Exception as err:  # ModelLoadError and anything else: the server stays up
            with self._lock:
                if generation != self._load_generation:
                    return
                self.load_error = str(err) or type(err).__name__
            self.events.message("error", f"rest-lsp could not load the model: {self.load_error}")
            return
        hf = loaded.tokenizer.hf
        with self._lock:
            if generation != self._load_generation or self._closed:
                return
            old_key = self._loaded.tokenizer.key if self._loaded is not None else None
            self._loaded, self._decoder = loaded, decoder
            self._fim = detect_fim(hf)
            special = {i for i, t in getattr(hf, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
            fim_markers = {self._fim.prefix_id, self._fim.suffix_id, self._fim.middle_id} if self._fim else set()
            self._stop_ids = frozenset(
                (special - fim_markers) | loaded.eos_token_ids | (self._fim.stop_ids if self._fim else set())
            )
            replaced = None
            if self._datastore is None or old_key != loaded.tokenizer.key:
                replaced = self._reset_datastore()
            self._ready.set()
        if replaced is not None:
            replaced.close()  # joins its merge thread: not under the lock, requests go on meanwhile
        self._buffers_dirty.set()  # buffers opened while loading
        self.events.message("info", f"rest-lsp: model {loaded.name} ready on {loaded.device}.")
        self._index_roots(generation)

    def _reset_datastore(self):
        """A new, empty datastore for a new tokenizer; returns the old one (or None) for the caller to close."""
        from rest_lsp.datastore import Datastore

        for index in self._indexes.values():
            index.stop()
        self._indexes = {}
        old, self._datastore = self._datastore, Datastore()
        # open buffers go back in with the new tokenizer
        self._pending.update(self._buffers)
        self._buffers_dirty.set()
        return old

    def _tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        with self._tok_lock:
            return self._loaded.tokenizer.encode_batch(texts)

    def _encode(self, text: str) -> list[int]:
        with self._tok_lock:
            return self._loaded.tokenizer.encode(text)

    def wait_indexed(self, timeout: float | None = None) -> bool:
        return self._indexed.wait(timeout)

    def _index_roots(self, generation: int) -> None:
        try:
            self._index_each_root(generation)
        finally:
            if generation == self._load_generation:
                self._indexed.set()

    def _index_each_root(self, generation: int) -> None:
        if not self.settings.index_workspace:
            return
        from rest_lsp.datastore import WorkspaceIndex

        for root in list(self._roots):
            with self._lock:
                if generation != self._load_generation or self._closed or str(root) in self._indexes:
                    continue
                loaded, datastore = self._loaded, self._datastore
            key = str(root)
            self.events.index_begin(key)
            stats: dict = {}
            try:
                cache_dir = Path(self.settings.cache_dir) if self.settings.cache_dir else None
                index = WorkspaceIndex(
                    root, datastore, self._tokenize_batch, loaded.tokenizer.key,
                    cache_dir=cache_dir, max_file_bytes=self.settings.max_file_bytes,
                    extra_ignore=self.settings.ignore,
                    on_progress=lambda done, total, k=key: self.events.index_progress(k, done, total),
                    on_change=self._on_disk_change,
                )
                stats = index.build() or {}
                index.start_watching()
                with self._lock:
                    if generation != self._load_generation or self._closed:
                        index.stop()
                        continue
                    self._indexes[key] = index
            except Exception as err:
                log.exception("indexing %s failed", root)
                self.events.message("warning", f"rest-lsp could not index {root}: {err}")
            finally:
                self.events.index_end(key, stats)

    def _on_disk_change(self, doc_ids: list[str]) -> None:
        # A save writes the buffer's text to disk; a buffer still open keeps precedence.
        with self._lock:
            reopen = {d: self._buffers[d] for d in doc_ids if d in self._buffers}
            self._pending.update(reopen)
        if reopen:
            self._buffers_dirty.set()

    def update_settings(self, settings: Settings) -> None:
        with self._lock:
            old, self.settings = self.settings, settings
        if old.model_key != settings.model_key:
            self._start_loading()

    def close(self, timeout: float = 10.0) -> None:
        """Stop all work and wait (up to `timeout` per thread) for it to end.

        Waiting matters: a process that exits while a thread is still inside torch or the
        tokenizer can abort ("terminate called without an active exception").
        """
        with self._cond:
            self._closed = True
            for job in self._queue:
                job.cancel_event.set()
            if self._running is not None:
                self._running.cancel_event.set()
            self._cond.notify_all()
            indexes, self._indexes = list(self._indexes.values()), {}
            datastore = self._datastore
        self._buffers_dirty.set()
        for index in indexes:
            index.stop()
        for thread in (self._worker, self._feeder):
            if thread is not threading.current_thread():
                thread.join(timeout)
        if datastore is not None:
            datastore.close()

    # -- documents -------------------------------------------------------------------------------------------
    def open_buffer(self, doc_id: str, text: str) -> None:
        """An editor buffer: while open, its text replaces the file's version in the datastore.

        `doc_id` is the file's absolute path for files on disk, any other string otherwise.
        """
        with self._lock:
            self._buffers[doc_id] = text
            self._pending[doc_id] = text
        self._buffers_dirty.set()

    change_buffer = open_buffer

    def close_buffer(self, doc_id: str) -> None:
        with self._lock:
            self._buffers.pop(doc_id, None)
            self._pending[doc_id] = None
        self._buffers_dirty.set()

    def _feed_buffers(self) -> None:
        from rest_lsp.datastore import Source

        while True:
            self._buffers_dirty.wait()
            if self._closed:
                return
            time.sleep(BUFFER_DEBOUNCE_S)  # let a burst of keystrokes settle
            self._buffers_dirty.clear()
            if self._closed:
                return
            if not self._ready.is_set():
                continue  # the loader sets the flag again once a datastore exists
            with self._lock:
                pending, self._pending = self._pending, {}
                datastore = self._datastore
            for doc_id, text in pending.items():
                try:
                    if text is None:
                        self._restore_from_disk(datastore, doc_id)
                    elif self._indexable(text):
                        datastore.put(doc_id, self._encode(text), Source.OPEN_BUFFER)
                except Exception:
                    log.exception("feeding buffer %s failed", doc_id)

    def _indexable(self, text: str) -> bool:
        return len(text.encode("utf-8", "surrogatepass")) <= self.settings.max_file_bytes and "\x00" not in text

    def _restore_from_disk(self, datastore, doc_id: str) -> None:
        """A closed buffer: back to the file's version on disk if the indexer keeps that file, else out.

        The indexer's word counts, not the buffer's: a file it skips (ignore rules, size) leaves the datastore.
        """
        from rest_lsp.datastore import Source

        with self._lock:
            kept = any(index.owns(doc_id) for index in self._indexes.values())
        if kept:
            try:
                text = Path(doc_id).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
            if text is not None and self._indexable(text):
                datastore.put(doc_id, self._encode(text), Source.WORKSPACE)
                return
        datastore.remove(doc_id)

    # -- completions -----------------------------------------------------------------------------------------
    def submit(self, doc_id: str, text: str, offset: int) -> Ticket:
        """Ask for a completion at character `offset` of `text`; cancels the document's previous request."""
        offset = max(0, min(offset, len(text)))
        job = _Job(doc_id, text[:offset], text[offset:], time.perf_counter())
        with self._cond:
            for old in self._queue:
                if old.doc_id == doc_id:
                    old.cancel_event.set()
            if self._running is not None and self._running.doc_id == doc_id:
                self._running.cancel_event.set()
            if not self._ready.is_set() or self._closed:
                _resolve(job.future, None)
                return Ticket(job)
            shown = self._type_through(job)
            if shown is not None:
                _resolve(job.future, shown)
                return Ticket(job)
            self._queue.append(job)
            self._cond.notify_all()
        return Ticket(job)

    def _type_through(self, job: _Job) -> Completion | None:
        for shown in reversed(self._shown):
            if shown.doc_id != job.doc_id or shown.after != job.after:
                continue
            if not job.before.startswith(shown.before):
                continue
            typed = job.before[len(shown.before):]
            if typed and shown.text.startswith(typed) and shown.text[len(typed):].strip():
                self._served += 1
                self._type_through_count += 1
                latency = (time.perf_counter() - job.submitted) * 1e3
                self._last_latency_ms = latency
                return Completion(shown.text[len(typed):], shown.id, 0, 0, latency, "type-through")
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    for job in self._queue:
                        _resolve(job.future, None)
                    return
                job = self._queue.popleft()
                self._running = job
            try:
                result = None
                if not job.cancelled() and not job.cancel_event.wait(self.settings.debounce_ms / 1e3):
                    result = self._complete(job)
                else:
                    with self._lock:
                        self._cancelled += 1  # stopped before decoding began
                _resolve(job.future, result)
            except Exception as err:
                log.exception("completion failed")
                self.events.message("warning", f"rest-lsp: a completion failed: {err}")
                _resolve(job.future, None)
            finally:
                with self._cond:
                    self._running = None

    def _draft_source(self):
        from rest_lsp.drafts import NoDrafts, context_and_workspace

        if self.settings.draft_budget <= 0:
            return NoDrafts()
        return context_and_workspace(self._datastore)

    def _complete(self, job: _Job) -> Completion | None:
        from rest_lsp.decoding import DecodeConfig

        with self._lock:
            loaded, decoder, fim, stop_ids = self._loaded, self._decoder, self._fim, self._stop_ids
            s = self.settings
        config = DecodeConfig(max_new_tokens=s.max_new_tokens, budget=s.draft_budget)
        # The decoder refuses prompts that cannot fit with the new tokens and one draft tree.
        budget = min(s.context_tokens, decoder.max_context - config.max_new_tokens - config.budget - 1)
        with self._tok_lock:
            prompt = build_prompt(loaded.tokenizer.hf, job.before, job.after, budget=budget, fim=fim,
                                  suffix_fraction=s.suffix_fraction)
        if not prompt.ids:
            return None
        ctx = stop_context(job.before, job.after)
        tokenizer = loaded.tokenizer

        def should_stop(new: list[int]) -> bool:
            if job.cancelled():
                return True
            if any(t in stop_ids for t in new):
                return True
            return trim(tokenizer.decode(new), ctx, final=False)[1]

        result = decoder.generate(prompt.ids, self._draft_source(), config, should_stop)
        if job.cancelled():
            with self._lock:
                self._cancelled += 1
            return None
        text = finish_text(tokenizer.decode(_until_stop(result.tokens, stop_ids)), ctx)
        latency = (time.perf_counter() - job.submitted) * 1e3
        with self._lock:
            self._decoded += 1
            self._gen_tokens += len(result.tokens)
            self._gen_steps += result.steps
            self._decode_ms += result.decode_ms
            self._last_latency_ms = latency
            if not text:
                return None
            self._served += 1
            shown = _Shown(next(self._ids), job.doc_id, job.before, job.after, text)
            self._shown.append(shown)
        return Completion(text, shown.id, len(result.tokens), result.steps, latency, "model")

    # -- feedback and introspection ----------------------------------------------------------------------------
    def accept(self, completion_id: int | None, text: str) -> bool:
        """The user accepted a suggestion: it goes into the datastore now, after the text it followed."""
        from rest_lsp.datastore import Source

        if not self._ready.is_set() or not text:
            return False
        with self._lock:
            shown = next((s for s in self._shown if s.id == completion_id), None)
            datastore = self._datastore
        before = ""
        if shown is not None and shown.text.endswith(text):
            # after type-through the accepted text is the rest of the suggestion: what was typed precedes it
            before = shown.before + shown.text[: len(shown.text) - len(text)]
        tail = before[-ACCEPT_CONTEXT_CHARS:]
        datastore.put(f"accepted:{next(self._accepted)}", self._encode(tail + text), Source.ACCEPTED)
        return True

    def drafts(self, text: str, limit: int = 10) -> list[tuple[str, float]]:
        """What the datastore proposes after `text` (decoded), heaviest first."""
        if not self._ready.is_set():
            return []
        with self._lock:
            datastore, tokenizer = self._datastore, self._loaded.tokenizer
        found = datastore.continuations(self._encode(text))[:limit]
        return [(tokenizer.decode(tokens), float(weight)) for tokens, weight in found]

    def stats(self) -> dict:
        with self._lock:
            store = self._datastore.stats() if self._datastore is not None else {"documents": 0, "tokens": 0}
            return {
                "model": self._loaded.name if self._loaded is not None else None,
                "ready": self._ready.is_set(),
                "load_error": self.load_error,
                "fim": self._fim.template.name if self._fim else None,
                "documents": int(store.get("documents", 0)),
                "tokens": int(store.get("tokens", 0)),
                "completions_served": self._served,
                "completions_decoded": self._decoded,
                "type_through": self._type_through_count,
                "cancelled": self._cancelled,
                "mean_tokens_per_step": self._gen_tokens / self._gen_steps if self._gen_steps else None,
                "mean_ms_per_token": self._decode_ms / self._gen_tokens if self._gen_tokens else None,
                "last_latency_ms": self._last_latency_ms,
            }


def _until_stop(tokens: list[int], stop_ids: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[:i]
    return tokens


def finish_text(text: str, ctx: StopContext) -> str:
    """The final post-processing of a completion: the stop rules on the whole text."""
    return trim(text, ctx, final=True)[0]
