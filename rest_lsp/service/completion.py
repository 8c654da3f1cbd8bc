"""The completion service: everything the language server does, without LSP types.

It runs the model's lifecycle (lifecycle.py: a ServingModel loaded in the background and
swapped in whole; the previous one serves meanwhile) and decodes each request, and wires the
parts that live in their own modules: request scheduling (scheduling.py: one
worker thread runs the decoder, so whoever calls in, the server's event loop, is never
blocked), what was shown, as text (suggestions.py), and what goes into the datastore
(feeding.py: workspace indexes, open buffers, accepted suggestions).

Latency rules:
  - latest request wins: a new request for a document cancels the previous one, which
    stops decoding between steps (through the decoder's `should_stop`); a request for the
    identical text and cursor shares the running one instead;
  - type-through: when the user typed the start of the last suggestion, the rest of it
    is the answer, without decoding;
  - answers kept for later (suggestion_cache.py): an LRU by document and whole text, matched
    against what was typed since, and the prefetch: while a suggestion is shown and no request
    waits, the decoder's thread computes the one that follows accepting it;
  - a time budget (pacing.py): after it a completion keeps its whole lines (or ends its first);
  - a debounce before decoding lets a burst of keystrokes collapse into one request; it follows
    the typing speed (pacing.py);
  - background tokenizing (indexing, open buffers) uses its own copy of the tokenizer, so
    prompt building never waits for it;
  - warm before asked: while idle, the decoding thread prefills the prompt of the last change,
    request or cursor move the editor reported (`moved`: a file just opened has no change to go
    by), in small chunks that give way to a request at once;
  - a prompt window that moves rarely: each document's prompts keep the window start of its last
    prompt while the text from there fits (prompt.py), so typing rarely costs a whole prefill;
  - a KV cache per document (document_caches.py): switching back to a file prefills only
    what changed in it.

Threads: the service never holds its lock across a join or a call that waits for another
component's thread (a watcher calls back into the service under its own locks): what to
stop is collected under the lock and stopped after releasing it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from pathlib import Path

from rest_lsp.drafting.drafts import SOURCE_NAMES
from rest_lsp.service.extra_context import ExtraContext, PromptHead
from rest_lsp.service.feeding import DatastoreFeed, HostThreads, workspace_key
from rest_lsp.service.interface import BadText, ServiceEvents
from rest_lsp.service.postprocess import StopContext, stop_context, trim
from rest_lsp.service.lifecycle import ServingModel, clamped, fit_context, load_serving_model
from rest_lsp.service.pacing import LineBudget, TypingPace
from rest_lsp.service.prompt import KeptStarts, Prompt, build_prompt
from rest_lsp.service.scheduling import Completion, Expected, Job, RequestQueue, Ticket
from rest_lsp.service.counters import ServiceCounters
from rest_lsp.settings import Settings
from rest_lsp.service.suggestion_cache import Prefetch, SuggestionCache, text_settings
from rest_lsp.service.suggestions import ACCEPT_CONTEXT_CHARS, IncrementalText, ShownSuggestions, whole_characters

__all__ = ["BadText", "Completion", "CompletionService", "NoEvents", "ServiceEvents", "Ticket", "finish_text"]

log = logging.getLogger(__name__)

SUFFIX_DRAFT_CHARS = 4000  # text after the cursor offered as drafts when the prompt leaves it out (no FIM)
OUTPUT_CONTEXT_TOKENS = 32  # prompt tokens stored before each output, so drafts match where it was written
SAVE_ACCEPTANCE_EVERY = 16  # completions between saves of the learned acceptance table
LOADER_THREAD = "rest-lsp-loader"  # close() may leave it running (wait_for_loads)
# Tokens per warm-up prefill pass: a request arriving meanwhile waits for at most one pass.
PREWARM_CHUNK = 64
# Documents whose prompt window start is kept (the most recently prompted): more are rarely typed in by turns.
PROMPT_STARTS = 16


def check_text(text: str) -> None:
    """Raise BadText for text the tokenizer refuses (a lone surrogate: valid JSON, not valid Unicode)."""
    if text.isascii():
        return
    try:
        text.encode("utf-16-le")  # near a copy in C; only a lone surrogate fails (in a str a pair is one character)
    except UnicodeEncodeError as err:
        line = text.count("\n", 0, err.start) + 1
        raise BadText(f"rest-lsp: line {line} holds a lone surrogate (U+{ord(text[err.start]):04X}), which is not "
                      "valid Unicode; no completion until it is removed.") from None


class NoEvents:
    def message(self, level: str, text: str) -> None:
        getattr(log, level if level in ("error", "warning", "info") else "info")(text)

    def index_begin(self, root: str) -> None:
        pass

    def index_progress(self, root: str, done: int, total: int) -> None:
        pass

    def index_end(self, root: str, stats: dict) -> None:
        pass


class CompletionService(HostThreads):
    """The Service (interface.py) that decodes in this process."""

    def __init__(self, settings: Settings, events: ServiceEvents | None = None, load=None):
        self.settings = settings
        # settings -> ServingModel; a team's replica passes one that shares its loaded model among workspaces
        self._load_model = load or load_serving_model
        self.events: ServiceEvents = events or NoEvents()
        self.load_error: str | None = None
        self._lock = threading.RLock()
        self._tok_lock = threading.Lock()  # HF fast tokenizers are not safe to call from several threads
        self._bg_tok_lock = threading.Lock()  # the background copy of the tokenizer: indexing and buffers
        self._model: ServingModel | None = None
        self._ready = threading.Event()
        self._load_generation = 0  # bumped by each model load: an older load's result is dropped
        self._started = False
        self._closed = False
        self._threads: list[threading.Thread] = []  # loaders and indexers, joined by close()
        self._shown = ShownSuggestions()
        self._epoch = 0  # bumped when the model or a setting that shapes suggestions changes: older ones are stale
        self._accepted = itertools.count(1)
        self.counters = ServiceCounters()  # what rest-lsp.stats reports (counters.py)
        self._cache = SuggestionCache(settings.suggestion_cache_size)
        self._prefetch = Prefetch()
        self._pace = TypingPace()
        self._clock = time.perf_counter  # the time budget's clock
        # each document's prompt window start, moved by requests only (prompt.KeptStarts): warm-ups, guesses and
        # the request at one place build the same prompt, and so do two servers given the same requests
        self._starts = KeptStarts(PROMPT_STARTS)
        self._requests = RequestQueue(self._lock, self._complete, self._debounce_left_s,
                                      self._count_cancelled, self._completion_failed, warm=self._warm,
                                      idle=self._idle_job, guess=self._guess_job)
        self._feed = DatastoreFeed(self)
        self._extra = ExtraContext()  # other files' chunks before the file's window (extra_context.py)
        self._extra_head = None  # (tokenizer, extra_context.PromptHead)

    # the feed holds the datastore and the indexes; these names stay for introspection and tests
    @property
    def _datastore(self):
        return self._feed.datastore

    @_datastore.setter
    def _datastore(self, datastore) -> None:
        self._feed.datastore = datastore

    @property
    def _indexes(self) -> dict:
        return self._feed.indexes

    @property
    def _loaded(self):
        return self._model.loaded if self._model is not None else None

    @property
    def _decoder(self):
        return self._model.decoder if self._model is not None else None

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
            self._feed.roots = [Path(r) for r in roots or []]
            self._started = True
        self._start_loading()

    def change_roots(self, added: list[Path], removed: list[Path]) -> None:
        """Workspace folders added or removed while running: indexed and watched, or dropped (blocks: not on the
        event loop)."""
        self._feed.change_roots([Path(r) for r in added], [Path(r) for r in removed])

    def _is_closed(self) -> bool:
        return self._closed

    def _start_loading(self) -> None:
        with self._lock:
            self._load_generation += 1
            generation = self._load_generation
            if self._model is None:  # a model already loaded keeps serving until the new one is ready
                self._ready.clear()
            self.load_error = None
        self._spawn(lambda: self._load(generation), LOADER_THREAD)

    def _load(self, generation: int) -> None:
        try:
            model = self._load_model(self.settings)
        except Exception as err:  # ModelLoadError and anything else: the server stays up
            self._load_failed(generation, str(err) or type(err).__name__)
            return
        with self._lock:
            if generation != self._load_generation or self._closed:
                return
            old_key = self._model.tokenizer_key if self._model is not None else None
            old = self._model
            self._model = model
            self.settings, refused = fit_context(self.settings, clamped(self.settings, model.max_context),
                                                 model.max_context)
            replaced, retired = None, []
            if self._feed.datastore is None or old_key != model.tokenizer_key:
                replaced, retired = self._feed.reset()
            self.load_error = None
            self._stale_suggestions()  # the old model's
            self._ready.set()
        if old is not None:
            old.save_learned()  # what the replaced model learned
        # not under the lock: stopping joins watcher threads that call back into the service
        self._feed.retire(retired, None)
        if replaced is not None:
            replaced.close()  # joins its merge thread
        self._feed.wake()  # buffers opened while loading
        for text in refused:
            self._report("error", text)
        for text in model.loaded.notes:  # e.g. bf16 asked for on a CPU that only emulates it
            self._report("warning", text)
        self._report("info", f"rest-lsp: model {model.loaded.name} ready on {model.loaded.device}.")
        self._feed.start_indexing()

    def _load_failed(self, generation: int, error: str) -> None:
        with self._lock:
            if generation != self._load_generation or self._closed:
                return
            self.load_error = error
            serving = self._model.loaded.name if self._model is not None else None
        kept = f"; still using {serving}." if serving else ""
        self._report("error", f"rest-lsp could not load the model: {error}{kept}")

    def _tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Background tokenizing (indexing, open buffers): its own tokenizer, never the one prompts need."""
        with self._bg_tok_lock:
            return self._model.background.encode_batch(texts)

    def _encode(self, text: str) -> list[int]:
        with self._tok_lock:
            return self._loaded.tokenizer.encode(text)

    def wait_indexed(self, timeout: float | None = None) -> bool:
        return self._feed.indexed.wait(timeout)

    def update_settings(self, settings: Settings) -> None:
        """New settings. Before start() they are only kept (start loads once); a model that does not load keeps
        the previous one serving; maxNewTokens that leave no room for a prompt are refused with a message."""
        with self._lock:
            old = self.settings
            refused: list[str] = []
            if settings.model_key == old.model_key and self._model is not None:  # a new model: when it has loaded
                settings, refused = fit_context(settings, old, self._model.max_context)
            self.settings = settings
            if text_settings(settings) != text_settings(old):
                self._stale_suggestions()
            self._cache.resize(settings.suggestion_cache_size)
            if not settings.prefetch:
                self._prefetch.forget()
            started = self._started
        for text in refused:
            self._report("error", text)
        if not started:
            return
        if old.model_key != settings.model_key:
            self._start_loading()
        if workspace_key(old) != workspace_key(settings):
            self._feed.restart_indexing()

    def _stale_suggestions(self) -> None:
        """(under the lock) Nothing computed so far is served again: cached, prefetched, typed through, or decoding."""
        self._epoch += 1
        self._cache.clear()
        self._prefetch.forget()
        self._shown.retire()

    def close(self, timeout: float = 10.0, wait_for_loads: bool = True) -> None:
        """Stop all work and wait (up to `timeout` per thread) for it to end: the worker, the buffer feeder, and
        every loader and indexer started.

        Waiting matters: a process that exits while a thread is still inside torch or the
        tokenizer can abort ("terminate called without an active exception"). A model load cannot be stopped
        (its result is dropped): without `wait_for_loads` it is not waited for, for a caller that ends the
        process with os._exit.
        """
        with self._lock:
            self._closed = True
            self._load_generation += 1
            datastore = self._feed.datastore
            threads = [self._requests.close(),
                       *(t for t in self._threads if wait_for_loads or t.name != LOADER_THREAD)]
        threads += self._feed.close()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
        if self._model is not None:
            self._model.save_learned()  # the worker has stopped: nothing changes the table any more
        if datastore is not None:
            datastore.close()

    # -- documents -------------------------------------------------------------------------------------------
    def open_buffer(self, doc_id: str, text: str) -> None:
        """An editor buffer: while open, its text replaces the file's version in the datastore.

        `doc_id` is the file's absolute path for files on disk, any other string otherwise.
        """
        self._extra.used(doc_id)
        self._feed.open_buffer(doc_id, text)

    change_buffer = open_buffer

    def close_buffer(self, doc_id: str) -> None:
        self._feed.close_buffer(doc_id)

    def close_document(self, doc_id: str) -> None:
        """The editor closed the document (`doc_id` as in `submit`): its work stops, and what is kept for it goes:
        its KV cache, its prompt window start, its cached and prefetched suggestions."""
        self._requests.drop(doc_id)
        with self._lock:
            model = self._model
            self._cache.forget(doc_id)
            self._prefetch.forget_document(doc_id)
        self._starts.forget(doc_id)
        self._extra.forget(doc_id)
        if model is not None:
            model.documents.forget(doc_id)

    # -- completions -----------------------------------------------------------------------------------------
    def submit(self, doc_id: str, text: str, offset: int) -> Ticket:
        """Ask for a completion at character `offset` of `text`; cancels the document's previous request, unless
        that one is for the identical text and cursor: then both share its computation."""
        offset = max(0, min(offset, len(text)))
        check_text(text)  # before anything keeps it: a text no prompt can be built from fails this request only
        with self._lock:
            model, s = self._model, self.settings
        if model is not None:
            model.documents.opened(doc_id)
            self._starts.asked(doc_id, text[:offset], text[offset:], self._prompt_maker(model, s, doc_id))
        ticket = self._requests.submit(doc_id, text[:offset], text[offset:], self._answer_now)
        # the next one likely comes here again: keep its prompt warm (its answer is known, or nothing to show)
        self._requests.expect(doc_id, text[:offset], text[offset:], edited=False)
        return ticket

    def expect(self, doc_id: str, text: str, offset: int) -> None:
        """The document changed at character `offset`: the next request will likely come there, so its prompt is
        prefilled while the decoder is idle (never delaying a request by more than one small chunk)."""
        offset = max(0, min(offset, len(text)))
        try:
            check_text(text)
        except BadText:  # its request will say so
            return
        with self._lock:
            model = self._model
            self._prefetch.keep_wishes_after(doc_id, text[:offset], text[offset:])
        if model is not None:
            model.documents.opened(doc_id)  # edited: open
        self._requests.expect(doc_id, text[:offset], text[offset:])

    def moved(self, doc_id: str, text: str, offset: int) -> bool:
        """The editor's cursor moved to character `offset` of `text` with no edit (a click, the arrow keys, a file
        just opened): the next request will likely come there, so its prompt is warmed and its suggestion guessed
        as after an edit. Nothing happens at the place last expected (that of the last edit, or of a request just
        answered): its work is done or under way. True when the place was new."""
        offset = max(0, min(offset, len(text)))
        try:
            check_text(text)
        except BadText:  # its request will say so
            return False
        before, after = text[:offset], text[offset:]

        def keep_wishes() -> None:
            self._prefetch.keep_wishes_after(doc_id, before, after)

        with self._lock:
            return self._requests.moved(doc_id, before, after, keep_wishes)

    def cancel(self, doc_id: str) -> None:
        """The document changed: stop the work for it (its requests answer None). Sets the typing pace."""
        with self._lock:
            self._pace.changed()
        self._requests.cancel(doc_id)

    def _debounce_s(self) -> float:
        s = self.settings
        with self._lock:
            return self._pace.debounce_s(s.debounce_ms / 1e3, s.debounce_max_ms / 1e3)

    def _debounce_left_s(self) -> float:
        """What the decoding thread waits before a job: the rest of the debounce since the last change or answer."""
        s = self.settings
        with self._lock:
            return self._pace.wait_s(s.debounce_ms / 1e3, s.debounce_max_ms / 1e3)

    def _answer_now(self, job: Job) -> tuple[bool, Completion | None]:
        """(True, answer) for a request answered without decoding (under the lock): no model yet, the prefetched
        suggestion for this very text, type-through, or the suggestion cache."""
        if not self._ready.is_set() or self._closed:
            return True, None
        prefetched = self._prefetch.serve(job.doc_id, job.before, job.after)
        if prefetched is not None:
            self.counters.prefetch_hits += 1
            if not prefetched:
                self._pace.answered()
                return True, None
            return True, self._serve(job, prefetched, "prefetch")
        found = self._shown.typed_through(job)
        if found is not None:
            self.counters.type_through += 1
            return True, self._serve(job, found[1], "type-through", found[0])
        cached = self._cache.match(job.doc_id, job.before, job.after)
        if cached is not None:
            self.counters.cache_hits += 1
            return True, self._serve(job, cached, "cache")
        self._prefetch.drop_wishes()  # they follow the last answer; a request that needs decoding makes them stale
        return False, None

    def _serve(self, job: Job, text: str, source: str, shown=None, tokens: int = 0, steps: int = 0) -> Completion:
        """A suggestion goes out (under the lock): remembered for type-through, the cache and acceptance, and the
        one that follows accepting it becomes the next prefetch."""
        if shown is None:
            shown = self._shown.add(job, text)
            self._cache.put(job.doc_id, job.before, job.after, text)
        if self.settings.prefetch:
            self._prefetch.want(job.doc_id, job.before, job.after, text)
        self.counters.completions_served += 1
        self._pace.answered()
        latency = (time.perf_counter() - job.submitted) * 1e3
        self.counters.last_latency_ms = latency
        return Completion(text, shown.id, tokens, steps, latency, source)

    def _idle_job(self) -> Job | None:
        """Work for the decoder's idle thread (under the lock): the prefetch wished for, if any."""
        if not self._ready.is_set() or self._closed or not self.settings.prefetch:
            return None
        wanted = self._prefetch.take_wanted()
        return Job(*wanted, speculative=True) if wanted is not None else None

    def _guess_job(self, expected: Expected, at_once: bool = False) -> Job | None:
        """The suggestion for the place of the last change, computed before it is asked for (under the lock),
        unless one is ready for that place already; `at_once`: the warm-up left it the edit's tokens (`_warm`)."""
        if not self._ready.is_set() or self._closed or not self.settings.prefetch:
            return None
        if self._prefetch.has(expected.doc_id, expected.before, expected.after):
            return None
        if self._cache.match(expected.doc_id, expected.before, expected.after) is not None:
            return None
        return Job(expected.doc_id, expected.before, expected.after, guess=True, at_once=at_once)

    def _count_cancelled(self) -> None:
        with self._lock:
            self.counters.cancelled += 1

    def _completion_failed(self, err: Exception) -> None:
        self._report("warning", f"rest-lsp: a completion failed: {err}")

    def _draft_source(self, datastore, settings: Settings, suffix: list[int] | None, outputs, recycle, held=None,
                      first_line=None, view=None):
        """The request's drafts; `held`: (prompt length, the tokens of the whitespace the prompt held back), the
        start of every useful output; `first_line`: (prompt length, drafts.TokenLines, whether any line break ends
        it) when the suggestion ends at its first line break after text; `view`: (prompt length, what the sources
        see in its place: Prompt.view)."""
        from rest_lsp.drafting.drafts import NoDrafts, rest_drafts

        if settings.draft_budget <= 0:
            return NoDrafts()
        return rest_drafts(datastore, suffix=suffix, outputs=outputs, recycle=recycle, exclude=settings.draft_exclude,
                           held=held, first_line=first_line, view=view)

    def _prompt(self, model, s: Settings, doc_id: str, before: str, after: str) -> Prompt:
        return self._starts.build(doc_id, before, after, self._prompt_maker(model, s, doc_id))

    def _prompt_maker(self, model, s: Settings, doc_id: str = ""):
        """make(before, after, keep_line) -> Prompt for this model and settings."""
        # The decoder refuses prompts that cannot fit with the new tokens and one draft tree.
        room = model.decoder.max_context - s.max_new_tokens - s.draft_budget - 1
        budget = min(s.context_tokens, room)
        extra_budget = min(s.extra_context_tokens, room - budget)

        def make(before: str, after: str, keep: int | None) -> Prompt:
            extra = self._extra_ids(model, doc_id, before, after, extra_budget) if extra_budget > 0 else []
            with self._tok_lock:
                return build_prompt(model.loaded.tokenizer.hf, before, after, budget=budget, fim=model.fim,
                                    suffix_fraction=s.suffix_fraction, keep_line=keep, extra=extra)

        return make

    def _extra_ids(self, model, doc_id: str, before: str, after: str, budget: int) -> list[int]:
        """Other files' chunks for a prompt in `doc_id`, chosen again only when its candidates change."""
        with self._lock:
            datastore, roots = self._feed.datastore, [str(r) for r in self._feed.roots]
        tokenizer = model.loaded.tokenizer

        def decode(ids) -> str:
            with self._tok_lock:
                return tokenizer.decode(ids)

        head = self._extra_head
        if head is None or head[0] is not tokenizer:  # its vocabulary is read once per model
            head = self._extra_head = (tokenizer, PromptHead(tokenizer.hf, self._encode_with(tokenizer)))
        head = head[1]
        return self._extra.prompt_ids(doc_id, before, after, budget, datastore, head, decode, roots)

    def _encode_with(self, tokenizer):
        def encode(text: str) -> list[int]:
            with self._tok_lock:
                return tokenizer.encode(text)
        return encode

    def _warm(self, expected: Expected, wanted) -> bool:
        """Idle work on the decoding thread: prefill what a request at `expected` would, in PREWARM_CHUNK pieces,
        stopping as soon as `wanted()` says a request waits. Changes no answer: the cache holds the prompt's KV.

        True when it left a short uncached tail (what an edit added) to the guess that follows, whose first pass
        computes it with the drafts on top (one pass instead of two): when the debounce left is no longer than
        any pass takes here, the guess can start at once (`Job.at_once`), its first pass covering the debounce
        as the warm-up's own pass would have. Only where the decoder chains a tail under a tree (`chain_tail`)."""
        with self._lock:
            model, s = self._model, self.settings
            if model is None or self._closed:
                return False
        # generate prefills all but one
        ids = self._prompt(model, s, expected.doc_id, expected.before, expected.after).ids[:-1]
        if not ids or wanted():
            return False
        model.documents.use(model.decoder, expected.doc_id, s.document_cache_mb << 20)
        if model.decoder.holds(ids):  # the last request's prompt, its output after it: keep that too
            return False
        shortest = model.decoder.shortest_pass_s()
        leave = model.decoder.chain_tail if (expected.edited and s.prefetch and shortest is not None
                                             and self._debounce_left_s() <= shortest) else 0

        def stop() -> bool:
            if wanted():
                return True
            with self._lock:
                self.counters.prewarm_chunks += 1
            return False

        computed = model.decoder.prefill(ids, stop=stop, chunk=PREWARM_CHUNK, leave=leave)
        with self._lock:
            self.counters.prewarm_tokens += computed
        return bool(leave) and not model.decoder.holds(ids) and not wanted()

    def _complete(self, job: Job) -> Completion | None:
        from rest_lsp.engine.decoding import DecodeConfig

        with self._lock:  # one consistent model: a switch meanwhile must not mix tokenizers
            model, datastore, s, epoch = self._model, self._datastore, self.settings, self._epoch
        loaded, decoder, fim, stop_ids = model.loaded, model.decoder, model.fim, model.stop_ids
        config = DecodeConfig(max_new_tokens=s.max_new_tokens, budget=s.draft_budget)
        prompt = self._prompt(model, s, job.doc_id, job.before, job.after)
        with self._tok_lock:
            # Without FIM the prompt leaves out the text after the cursor; what follows it there is often what
            # the model writes next (a line being re-typed, a call matching a definition below): a draft source.
            suffix = None
            if fim is None and s.draft_budget > 0 and job.after.strip():
                suffix = loaded.tokenizer.encode(job.after[:SUFFIX_DRAFT_CHARS])
        if not prompt.ids:
            return None
        ctx = stop_context(job.before, job.after, s.max_lines, prompt.held_written)
        tokenizer = loaded.tokenizer
        so_far = IncrementalText(tokenizer.decode)
        checked = [0]  # new tokens already checked for stop ids
        wait_s = s.wait_budget_ms / 1e3
        # the suggestion after accepting the shown one gets the short budget: it runs after every answer, and a
        # person who stops typing should find the server idle soon (its first line is what the next request
        # shows anyway); a guess and a request keep the long one
        prefetch = job.speculative and not job.guess and wait_s > 0
        budget = LineBudget(job.submitted, wait_s if prefetch else s.time_budget_ms / 1e3, self._clock)

        def should_stop(new: list[int]) -> bool:
            if job.cancelled():
                return True
            if any(t in stop_ids for t in new[checked[0]:]):
                return True
            checked[0] = len(new)
            shown, stopped = trim(so_far.text(new), ctx, final=False)
            if wait_s > 0 and job.asked_at is not None:  # someone waits now: the short budget, from their request
                budget.by(job.asked_at + wait_s)
            return stopped or budget.stop(shown)

        # a one-line suggestion ends where the stop rules end it: drafts below that line break are never shown
        drafts = self._draft_source(datastore, s, suffix, model.outputs, model.recycle,
                                    (len(prompt.ids), prompt.held_ids),
                                    (len(prompt.ids), model.lines, ctx.any_break_ends) if ctx.one_line else None,
                                    (len(prompt.ids), prompt.view))
        model.documents.use(decoder, job.doc_id, s.document_cache_mb << 20)
        result = decoder.generate(prompt.ids, drafts, config, should_stop, cancelled=job.cancelled)
        # every output, shown or not: the next request at this place will likely start the same way
        model.outputs.add((prompt.view or prompt.ids)[-OUTPUT_CONTEXT_TOKENS:], result.tokens)
        if job.cancelled():
            with self._lock:
                self.counters.prefill_tokens += result.prefill_tokens
                if job.speculative:
                    self.counters.prefetch_cancelled += 1
                else:
                    self.counters.cancelled += 1
            return None
        tokens = whole_characters(tokenizer.decode, _until_stop(result.tokens, stop_ids))
        text = budget.cut(finish_text(tokenizer.decode(tokens), ctx))
        with self._lock:
            self.counters.prefill_tokens += result.prefill_tokens
            if epoch != self._epoch:  # the model or a setting changed while it decoded: neither served nor kept
                return None
            if job.speculative and job.cancelled():  # its document closed after its last step: nothing kept
                self.counters.prefetch_cancelled += 1
                return None
            parked = job.speculative and not job.has_waiters()
            if not parked:  # the running totals measure the decoding of requests (clients take differences)
                self.counters.generated_tokens += len(result.tokens)
                self.counters.decode_steps += result.steps
                self.counters.decode_ms += result.decode_ms
                self.counters.draft_ms += result.draft_ms
            if job.guess:
                self.counters.guessed += 1
            elif job.speculative:
                self.counters.prefetched += 1
            else:
                self.counters.completions_decoded += 1
            save = (self.counters.completions_decoded + self.counters.prefetched) % SAVE_ACCEPTANCE_EVERY == 0
            if parked:
                # nobody asked yet: put it aside for the request that accepting the shown suggestion brings
                job.parked = True
                self._prefetch.store(job.doc_id, job.before, job.after, text)
                answer = None
            elif text:
                if job.speculative:
                    self.counters.prefetch_hits += 1  # a request came while it ran, and shared it
                source = "prefetch" if job.speculative else "model"
                answer = self._serve(job, text, source, tokens=len(result.tokens), steps=result.steps)
            else:
                self.counters.last_latency_ms = (time.perf_counter() - job.submitted) * 1e3
                self._pace.answered()  # nothing to show is an answer too: the person goes on writing after it
                answer = None
        if save:
            model.save_learned()
        return answer

    # -- feedback and introspection ----------------------------------------------------------------------------
    def accept(self, completion_id: int | None, text: str) -> bool:
        """The user accepted a suggestion: it goes into the datastore now, after the text it followed.

        Only the last ACCEPTED_DOCUMENTS accepted suggestions are kept: older ones are removed.
        """
        if not self._ready.is_set() or not text:
            return False
        with self._lock:
            shown = self._shown.get(completion_id)
            datastore = self._feed.datastore
        before = ""
        if shown is not None and shown.text.endswith(text):
            # after type-through the accepted text is the rest of the suggestion: what was typed precedes it
            before = shown.before_tail + shown.text[: len(shown.text) - len(text)]
        tail = before[-ACCEPT_CONTEXT_CHARS:]
        self._feed.add_accepted(datastore, f"accepted:{next(self._accepted)}", self._encode(tail + text))
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
            return self.counters.as_stats() | {
                "model": self._loaded.name if self._loaded is not None else None,
                # the numerics outputs follow ("float32" is the exact mode) and the forward pass that runs them
                "dtype": self._decoder.mode if self._decoder is not None else None,
                "engine": self._decoder.engine if self._decoder is not None else None,
                "ready": self._ready.is_set(),
                "load_error": self.load_error,
                "fim": self._model.fim.template.name if self._model is not None and self._model.fim else None,
                "documents": int(store.get("documents", 0)),
                "tokens": int(store.get("tokens", 0)),
                "cache_entries": len(self._cache),
                # the debounce at the current pace; a job waits what is left of it since the last change or answer
                "debounce_ms": self._debounce_s() * 1e3,
                "draft_sources": [] if self.settings.draft_budget <= 0 else [
                    n for n in SOURCE_NAMES if n not in self.settings.draft_exclude],
                "acceptance_observations": self._decoder.acceptance.observations if self._decoder else 0,
                # what a step of k rows costs over a plain one, as the decoder learned it from its steps
                "step_cost": self._decoder.costs.describe() if self._decoder is not None else None,
                # how many threads steps run on, as the decoder learned it from its plain steps (gguf on a CPU)
                "step_threads": (self._decoder.threads.describe()
                                 if self._decoder is not None and self._decoder.threads is not None else None),
                # per situation, whether steps draft at all: what a drafted step saved, in plain steps
                "draft_gate": self._decoder.gate.describe() if self._decoder is not None else None,
                "document_caches": len(self._model.documents.kept()) if self._model is not None else 0,
                "document_cache_bytes": self._model.documents.kept_bytes if self._model is not None else 0,
            }


def _until_stop(tokens: list[int], stop_ids: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[:i]
    return tokens


def finish_text(text: str, ctx: StopContext) -> str:
    """The final post-processing of a completion: the stop rules on the whole text."""
    return trim(text, ctx, final=True)[0]
