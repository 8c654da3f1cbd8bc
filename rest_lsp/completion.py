"""The completion service: everything the language server does, without LSP types.

It owns the model's lifecycle (loaded in the background, swapped in whole), the one Decoder
(which keeps its KV cache between requests), and the workspace Datastore and its indexers,
and wires the parts that live in their own modules: request scheduling (scheduling.py: one
worker thread runs the decoder, so whoever calls in, the server's event loop, is never
blocked) and what was shown, as text (suggestions.py).

Latency rules:
  - latest request wins: a new request for a document cancels the previous one, which
    stops decoding between steps (through the decoder's `should_stop`); a request for the
    identical text and cursor shares the running one instead;
  - type-through: when the user typed the start of the last suggestion, the rest of it
    is the answer, without decoding;
  - a short debounce before decoding lets a burst of keystrokes collapse into one request;
  - background tokenizing (indexing, open buffers) uses its own copy of the tokenizer, so
    prompt building never waits for it.

Threads: the service never holds its lock across a join or a call that waits for another
component's thread (a watcher calls back into the service under its own locks): what to
stop is collected under the lock and stopped after releasing it.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Protocol

from rest_lsp.drafts import SOURCE_NAMES
from rest_lsp.postprocess import StopContext, stop_context, trim
from rest_lsp.prompt import Fim, build_prompt, detect_fim
from rest_lsp.scheduling import Completion, Job, RequestQueue, Ticket
from rest_lsp.settings import Settings
from rest_lsp.suggestions import ACCEPT_CONTEXT_CHARS, IncrementalText, ShownSuggestions, whole_characters

__all__ = ["Completion", "CompletionService", "NoEvents", "ServiceEvents", "Ticket", "finish_text"]

log = logging.getLogger(__name__)

BUFFER_DEBOUNCE_S = 0.25  # open buffers are re-tokenized at most this often
ACCEPTED_DOCUMENTS = 256  # accepted completions kept in the datastore; older ones are removed
MIN_PROMPT_TOKENS = 16  # maxNewTokens and draftBudget must leave at least this much of the context to the prompt
SUFFIX_DRAFT_CHARS = 4000  # text after the cursor offered as drafts when the prompt leaves it out (no FIM)
OUTPUT_CONTEXT_TOKENS = 32  # prompt tokens stored before each output, so drafts match where it was written
SAVE_ACCEPTANCE_EVERY = 16  # completions between saves of the learned acceptance table


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


class _Stale(Exception):
    """Indexing for a datastore or settings that were replaced meanwhile: give it up."""


class CompletionService:
    def __init__(self, settings: Settings, events: ServiceEvents | None = None):
        self.settings = settings
        self.events: ServiceEvents = events or NoEvents()
        self.load_error: str | None = None
        self._lock = threading.RLock()
        self._tok_lock = threading.Lock()  # HF fast tokenizers are not safe to call from several threads
        self._bg_tok_lock = threading.Lock()  # the background copy of the tokenizer: indexing and buffers
        self._loaded = None
        self._decoder = None
        self._bg_tokenizer = None
        self._fim: Fim | None = None
        self._stop_ids: frozenset[int] = frozenset()
        self._datastore = None
        self._indexes: dict[str, object] = {}
        self._roots: list[Path] = []
        self._ready = threading.Event()
        self._indexed = threading.Event()  # the workspace roots of the current datastore and settings are indexed
        self._load_generation = 0  # bumped by each model load: an older load's result is dropped
        self._index_generation = 0  # bumped whenever the indexes are thrown away: older indexing stops
        self._started = False
        self._closed = False
        self._threads: list[threading.Thread] = []  # loaders and indexers, joined by close()
        self._shown = ShownSuggestions()
        self._accepted = itertools.count(1)
        self._accepted_docs: deque[str] = deque()
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
        self._draft_ms = 0.0
        self._last_latency_ms: float | None = None
        # what REST learns from the model, per model: its own recent outputs, its habits (successor table), and
        # how often it accepts each source's drafts (saved beside the index every few completions and at close)
        self._outputs = None
        self._recycle = None
        self._acceptance_file: tuple[Path, str] | None = None
        self._requests = RequestQueue(self._lock, self._complete, lambda: self.settings.debounce_ms / 1e3,
                                      self._count_cancelled, self._completion_failed)
        self._feeder = threading.Thread(target=self._feed_buffers, name="rest-lsp-buffers", daemon=True)
        self._feeder.start()

    # -- lifecycle -------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once a model is loaded; False on timeout or when loading failed."""
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
            self._started = True
        self._start_loading()

    def _report(self, level: str, text: str) -> None:
        """Tell the owner; a failing listener is logged, never fatal to the thread that reports."""
        try:
            self.events.message(level, text)
        except Exception:
            log.exception("reporting %r failed", text)

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            if self._closed:
                return
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _start_loading(self) -> None:
        with self._lock:
            self._load_generation += 1
            generation = self._load_generation
            if self._loaded is None:  # a model already loaded keeps serving until the new one is ready
                self._ready.clear()
            self.load_error = None
        self._spawn(lambda: self._load(generation), "rest-lsp-loader")

    def _load(self, generation: int) -> None:
        from rest_lsp.decoding import Decoder
        from rest_lsp.model import Tokenizer, load_model

        from rest_lsp.acceptance import AcceptanceModel, table_location
        from rest_lsp.drafts import OutputStore, SuccessorTable

        s = self.settings
        try:
            loaded = load_model(s.model, s.device, s.dtype)
            table = table_location(self._cache_dir(s), loaded.name, str(loaded.dtype), loaded.device.type)
            decoder = Decoder(loaded, AcceptanceModel.load(*table))
            background = Tokenizer(copy.deepcopy(loaded.tokenizer.hf))
        except Exception as err:  # ModelLoadError and anything else: the server stays up
            self._load_failed(generation, str(err) or type(err).__name__)
            return
        hf = loaded.tokenizer.hf
        with self._lock:
            if generation != self._load_generation or self._closed:
                return
            old_key = self._loaded.tokenizer.key if self._loaded is not None else None
            self._save_acceptance()  # what the replaced model learned
            self._loaded, self._decoder, self._bg_tokenizer = loaded, decoder, background
            self._outputs, self._recycle, self._acceptance_file = OutputStore(), SuccessorTable(), table
            self._fim = detect_fim(hf)
            special = {i for i, t in getattr(hf, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
            fim_markers = {self._fim.prefix_id, self._fim.suffix_id, self._fim.middle_id} if self._fim else set()
            self._stop_ids = frozenset(
                (special - fim_markers) | loaded.eos_token_ids | (self._fim.stop_ids if self._fim else set())
            )
            self.settings, refused = self._fit_context(self.settings, _clamped(self.settings, decoder.max_context))
            replaced, retired = None, []
            if self._datastore is None or old_key != loaded.tokenizer.key:
                replaced, retired = self._reset_datastore()
            self.load_error = None
            self._ready.set()
        # not under the lock: stopping joins watcher threads that call back into the service
        self._retire(retired, None)
        if replaced is not None:
            replaced.close()  # joins its merge thread
        self._buffers_dirty.set()  # buffers opened while loading
        for text in refused:
            self._report("error", text)
        self._report("info", f"rest-lsp: model {loaded.name} ready on {loaded.device}.")
        self._index_roots()

    @staticmethod
    def _cache_dir(settings: Settings) -> Path:
        from rest_lsp.model import cache_root

        return Path(settings.cache_dir) if settings.cache_dir else cache_root()

    def _save_acceptance(self) -> None:
        """Save the decoder's learned acceptance table; a failure costs only what was learned."""
        decoder, where = self._decoder, self._acceptance_file
        if decoder is None or where is None:
            return
        try:
            decoder.acceptance.save(where[0], where[1])
        except OSError as err:
            log.warning("rest-lsp: could not save the learned acceptance table %s: %s", where[0], err)

    def _load_failed(self, generation: int, error: str) -> None:
        with self._lock:
            if generation != self._load_generation or self._closed:
                return
            self.load_error = error
            serving = self._loaded.name if self._loaded is not None else None
        kept = f"; still using {serving}." if serving else ""
        self._report("error", f"rest-lsp could not load the model: {error}{kept}")

    def _reset_datastore(self):
        """A new, empty datastore for a new tokenizer (under the lock); returns (the old one or None, the indexes
        to stop) for the caller to close and stop after releasing the lock."""
        from rest_lsp.datastore import Datastore

        self._index_generation += 1
        retired, self._indexes = list(self._indexes.values()), {}
        self._indexed.clear()
        old, self._datastore = self._datastore, Datastore()
        self._accepted_docs.clear()
        # open buffers go back in with the new tokenizer
        self._pending.update(self._buffers)
        self._buffers_dirty.set()
        return old, retired

    def _retire(self, indexes: list, datastore) -> None:
        """Stop indexes (never under the lock); with a datastore, also take their files out of it."""
        for index in indexes:
            try:
                index.stop()
            except Exception:
                log.exception("stopping the index of %s failed", getattr(index, "root", "?"))
            if datastore is not None:
                with self._lock:
                    buffers = set(self._buffers)
                gone = [d for d in datastore.doc_ids() if index.owns(d) and d not in buffers]
                if gone:
                    datastore.apply([], gone)

    def _fit_context(self, new: Settings, fallback: Settings) -> tuple[Settings, list[str]]:
        """`new`, or `new` with fallback's maxNewTokens and draftBudget when its own leave no room for a prompt in
        the loaded model's context (under the lock)."""
        if self._decoder is None or _fits(new, self._decoder.max_context):
            return new, []
        context = self._decoder.max_context
        kept = fallback if _fits(fallback, context) else _clamped(fallback, context)
        text = (f"rest-lsp: maxNewTokens {new.max_new_tokens} with draftBudget {new.draft_budget} leaves no room for a "
                f"prompt in the model's context of {context} tokens; using maxNewTokens {kept.max_new_tokens} and "
                f"draftBudget {kept.draft_budget}.")
        return dataclasses.replace(new, max_new_tokens=kept.max_new_tokens, draft_budget=kept.draft_budget), [text]

    def _tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Background tokenizing (indexing, open buffers): its own tokenizer, never the one prompts need."""
        with self._bg_tok_lock:
            return self._bg_tokenizer.encode_batch(texts)

    def _encode(self, text: str) -> list[int]:
        with self._tok_lock:
            return self._loaded.tokenizer.encode(text)

    def wait_indexed(self, timeout: float | None = None) -> bool:
        return self._indexed.wait(timeout)

    def _index_roots(self) -> None:
        with self._lock:
            generation = self._index_generation
        try:
            self._index_each_root(generation)
        finally:
            with self._lock:
                if generation == self._index_generation:
                    self._indexed.set()

    def _stale(self, generation: int) -> bool:
        return self._closed or generation != self._index_generation

    def _index_each_root(self, generation: int) -> None:
        from rest_lsp.datastore import WorkspaceIndex

        for root in list(self._roots):
            with self._lock:
                s = self.settings
                if not s.index_workspace or self._stale(generation) or str(root) in self._indexes:
                    continue
                loaded, datastore = self._loaded, self._datastore
            key = str(root)

            def tokenize(texts: list[str]) -> list[list[int]]:
                if self._stale(generation):  # closed, or the indexes were replaced: stop indexing
                    raise _Stale()
                return self._tokenize_batch(texts)

            self.events.index_begin(key)
            stats: dict = {}
            index = None
            try:
                cache_dir = Path(s.cache_dir) if s.cache_dir else None
                index = WorkspaceIndex(
                    root, datastore, tokenize, loaded.tokenizer.key,
                    cache_dir=cache_dir, max_file_bytes=s.max_file_bytes, extra_ignore=s.ignore,
                    on_progress=lambda done, total, k=key: self.events.index_progress(k, done, total),
                    on_change=self._on_disk_change,
                )
                stats = index.build() or {}
                index.start_watching()
                with self._lock:
                    stale = self._stale(generation)
                    if not stale:
                        self._indexes[key] = index
                if stale:
                    self._retire([index], None if self._closed else datastore)
            except Exception as err:
                if index is not None and self._stale(generation):
                    self._retire([index], None if self._closed else datastore)
                elif not isinstance(err, _Stale):
                    log.exception("indexing %s failed", root)
                    self._report("warning", f"rest-lsp could not index {root}: {err}")
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
        """New settings. Before start() they are only kept (start loads once); a model that does not load keeps
        the previous one serving; maxNewTokens that leave no room for a prompt are refused with a message."""
        with self._lock:
            old = self.settings
            refused: list[str] = []
            if settings.model_key == old.model_key:  # a new model is checked when it has loaded
                settings, refused = self._fit_context(settings, old)
            self.settings = settings
            started = self._started
        for text in refused:
            self._report("error", text)
        if not started:
            return
        if old.model_key != settings.model_key:
            self._start_loading()
        if _workspace_key(old) != _workspace_key(settings):
            self._restart_indexing()

    def _restart_indexing(self) -> None:
        """Throw the indexes away and index again under the current settings (indexWorkspace, ignore, ...)."""
        with self._lock:
            self._index_generation += 1
            retired, self._indexes = list(self._indexes.values()), {}
            datastore, ready = self._datastore, self._ready.is_set()
            self._indexed.clear()
        self._retire(retired, datastore)
        if ready:
            self._spawn(self._index_roots, "rest-lsp-indexer")
        else:
            self._indexed.set()  # the loader indexes once the model is there

    def close(self, timeout: float = 10.0) -> None:
        """Stop all work and wait (up to `timeout` per thread) for it to end: the worker, the buffer feeder, and
        every loader and indexer started.

        Waiting matters: a process that exits while a thread is still inside torch or the
        tokenizer can abort ("terminate called without an active exception").
        """
        with self._lock:
            self._closed = True
            self._load_generation += 1
            self._index_generation += 1
            indexes, self._indexes = list(self._indexes.values()), {}
            datastore = self._datastore
            threads = [self._requests.close(), self._feeder, *self._threads]
        self._buffers_dirty.set()
        self._retire(indexes, None)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
        self._save_acceptance()  # the worker has stopped: nothing changes the table any more
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
                        datastore.put(doc_id, self._tokenize_batch([text])[0], Source.OPEN_BUFFER)
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
            indexes = list(self._indexes.values())
        if any(index.owns(doc_id) for index in indexes):
            try:
                text = Path(doc_id).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
            if text is not None and self._indexable(text):
                datastore.put(doc_id, self._tokenize_batch([text])[0], Source.WORKSPACE)
                return
        datastore.remove(doc_id)

    # -- completions -----------------------------------------------------------------------------------------
    def submit(self, doc_id: str, text: str, offset: int) -> Ticket:
        """Ask for a completion at character `offset` of `text`; cancels the document's previous request, unless
        that one is for the identical text and cursor: then both share its computation."""
        offset = max(0, min(offset, len(text)))
        return self._requests.submit(doc_id, text[:offset], text[offset:], self._answer_now)

    def cancel(self, doc_id: str) -> None:
        """The document changed: stop the work for it (its requests answer None)."""
        self._requests.cancel(doc_id)

    def _answer_now(self, job: Job) -> tuple[bool, Completion | None]:
        """(True, answer) for a request answered without decoding: no model yet, or type-through (under the lock)."""
        if not self._ready.is_set() or self._closed:
            return True, None
        found = self._shown.typed_through(job)
        if found is None:
            return False, None
        shown, rest = found
        self._served += 1
        self._type_through_count += 1
        latency = (time.perf_counter() - job.submitted) * 1e3
        self._last_latency_ms = latency
        return True, Completion(rest, shown.id, 0, 0, latency, "type-through")

    def _count_cancelled(self) -> None:
        with self._lock:
            self._cancelled += 1

    def _completion_failed(self, err: Exception) -> None:
        self._report("warning", f"rest-lsp: a completion failed: {err}")

    def _draft_source(self, datastore, settings: Settings, suffix: list[int] | None, outputs, recycle):
        from rest_lsp.drafts import NoDrafts, rest_drafts

        if settings.draft_budget <= 0:
            return NoDrafts()
        return rest_drafts(datastore, suffix=suffix, outputs=outputs, recycle=recycle, exclude=settings.draft_exclude)

    def _complete(self, job: Job) -> Completion | None:
        from rest_lsp.decoding import DecodeConfig

        with self._lock:  # one consistent model: a switch meanwhile must not mix tokenizers
            loaded, decoder, fim, stop_ids = self._loaded, self._decoder, self._fim, self._stop_ids
            datastore, s = self._datastore, self.settings
            outputs, recycle = self._outputs, self._recycle
        config = DecodeConfig(max_new_tokens=s.max_new_tokens, budget=s.draft_budget)
        # The decoder refuses prompts that cannot fit with the new tokens and one draft tree.
        budget = min(s.context_tokens, decoder.max_context - config.max_new_tokens - config.budget - 1)
        with self._tok_lock:
            prompt = build_prompt(loaded.tokenizer.hf, job.before, job.after, budget=budget, fim=fim,
                                  suffix_fraction=s.suffix_fraction)
            # Without FIM the prompt leaves out the text after the cursor; what follows it there is often what
            # the model writes next (a line being re-typed, a call matching a definition below): a draft source.
            suffix = None
            if fim is None and s.draft_budget > 0 and job.after.strip():
                suffix = loaded.tokenizer.encode(job.after[:SUFFIX_DRAFT_CHARS])
        if not prompt.ids:
            return None
        ctx = stop_context(job.before, job.after)
        tokenizer = loaded.tokenizer
        so_far = IncrementalText(tokenizer.decode)
        checked = [0]  # new tokens already checked for stop ids

        def should_stop(new: list[int]) -> bool:
            if job.cancelled():
                return True
            if any(t in stop_ids for t in new[checked[0]:]):
                return True
            checked[0] = len(new)
            return trim(so_far.text(new), ctx, final=False)[1]

        drafts = self._draft_source(datastore, s, suffix, outputs, recycle)
        result = decoder.generate(prompt.ids, drafts, config, should_stop, cancelled=job.cancelled)
        # every output, shown or not: the next request at this place will likely start the same way
        outputs.add(prompt.ids[-OUTPUT_CONTEXT_TOKENS:], result.tokens)
        if job.cancelled():
            with self._lock:
                self._cancelled += 1
            return None
        tokens = whole_characters(tokenizer.decode, _until_stop(result.tokens, stop_ids))
        text = finish_text(tokenizer.decode(tokens), ctx)
        latency = (time.perf_counter() - job.submitted) * 1e3
        with self._lock:
            self._decoded += 1
            self._gen_tokens += len(result.tokens)
            self._gen_steps += result.steps
            self._decode_ms += result.decode_ms
            self._draft_ms += result.draft_ms
            self._last_latency_ms = latency
            save = self._decoded % SAVE_ACCEPTANCE_EVERY == 0
            if not text:
                shown = None
            else:
                self._served += 1
                shown = self._shown.add(job, text)
        if save and decoder is self._decoder:
            self._save_acceptance()
        if shown is None:
            return None
        return Completion(text, shown.id, len(result.tokens), result.steps, latency, "model")

    # -- feedback and introspection ----------------------------------------------------------------------------
    def accept(self, completion_id: int | None, text: str) -> bool:
        """The user accepted a suggestion: it goes into the datastore now, after the text it followed.

        Only the last ACCEPTED_DOCUMENTS accepted suggestions are kept: older ones are removed.
        """
        from rest_lsp.datastore import Source

        if not self._ready.is_set() or not text:
            return False
        with self._lock:
            shown = self._shown.get(completion_id)
            datastore = self._datastore
        before = ""
        if shown is not None and shown.text.endswith(text):
            # after type-through the accepted text is the rest of the suggestion: what was typed precedes it
            before = shown.before_tail + shown.text[: len(shown.text) - len(text)]
        tail = before[-ACCEPT_CONTEXT_CHARS:]
        doc_id = f"accepted:{next(self._accepted)}"
        datastore.put(doc_id, self._encode(tail + text), Source.ACCEPTED)
        with self._lock:
            if datastore is not self._datastore:
                return True  # a new tokenizer's datastore replaced it meanwhile
            self._accepted_docs.append(doc_id)
            old = [self._accepted_docs.popleft() for _ in range(len(self._accepted_docs) - ACCEPTED_DOCUMENTS)]
        for doc in old:
            datastore.remove(doc)
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
            datastore = self._datastore
        # the datastore's own lock, not under ours
        store = datastore.stats() if datastore is not None else {"documents": 0, "tokens": 0}
        with self._lock:
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
                # running totals, so that a client can measure an interval by differences
                "generated_tokens": self._gen_tokens,
                "decode_steps": self._gen_steps,
                "decode_ms": self._decode_ms,
                "draft_ms": self._draft_ms,
                "draft_sources": [] if self.settings.draft_budget <= 0 else [
                    n for n in SOURCE_NAMES if n not in self.settings.draft_exclude],
                "acceptance_observations": self._decoder.acceptance.observations if self._decoder else 0,
                "last_latency_ms": self._last_latency_ms,
            }


def _fits(settings: Settings, context: int) -> bool:
    return settings.max_new_tokens + settings.draft_budget + 1 + MIN_PROMPT_TOKENS <= context


def _clamped(settings: Settings, context: int) -> Settings:
    """`settings` with maxNewTokens, then draftBudget, cut until a prompt fits the context."""
    budget = max(0, min(settings.draft_budget, context - 2 - MIN_PROMPT_TOKENS))
    new = max(1, min(settings.max_new_tokens, context - budget - 1 - MIN_PROMPT_TOKENS))
    return dataclasses.replace(settings, max_new_tokens=new, draft_budget=budget)


def _workspace_key(settings: Settings) -> tuple:
    """The settings that need the workspace indexed again when they change."""
    return (settings.index_workspace, settings.ignore, settings.max_file_bytes, settings.cache_dir)


def _until_stop(tokens: list[int], stop_ids: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[:i]
    return tokens


def finish_text(text: str, ctx: StopContext) -> str:
    """The final post-processing of a completion: the stop rules on the whole text."""
    return trim(text, ctx, final=True)[0]
