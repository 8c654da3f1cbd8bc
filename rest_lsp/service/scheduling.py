"""Request scheduling: the requests waiting for the one decoding thread, and the thread itself.

Latest request wins per document: a new request cancels the document's previous one, which stops decoding between
steps. A request for the identical text and cursor (the inline request and the suggest-list request of one
keystroke) shares the job already there instead. Each requester holds its own future; the work stops once all of
them have given up, or when the document changes. A short debounce before decoding lets a burst of keystrokes
collapse into one request.

While no request waits or runs, the thread does idle work. First speculative work from its owner
(`idle`: a prefetch), after the debounce (a change that comes at once, writing on instead of accepting, stops
it before it begins). A speculative job has no requester; a request that needs decoding cancels it (it
stops after the decoding step it is in), unless the request is for the identical text and cursor: then the
request shares it. A change to the document that can still lead to its place does not stop it (accepting the
shown suggestion, or typing it over, is such a change, and the job computes what comes after it); any other
change does (`expect`), as do the wishes not yet started. Otherwise it warms the decoder's cache for
the place the next request will most likely come from (`expect`: an edit, a request, or a cursor the editor
moved there, `moved`), asking between small chunks whether a
request came in, and giving way to it at once; once warm, it computes the suggestion for that place too (`guess`:
a person who stops typing asks there next). A guess waits what is left of the debounce since the change (the
warm-up overlaps it), unless the warm-up left it the edit's tokens (`warm` returned True: one pass computes them
and the first drafts, and lasts at least as long as the debounce left); any change to its document, an edit
elsewhere in it, or any request elsewhere stops it; a request for the identical text and cursor shares it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Callable

from rest_lsp.service.suggestion_cache import leads_to

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    text: str
    id: int  # pass back to accept()
    tokens: int  # generated tokens (0 for type-through)
    steps: int
    latency_ms: float
    source: str  # "model" | "type-through" | "cache" | "prefetch"


class Job:
    """One computation, shared by every request for the same text and cursor (each holds its own future)."""

    def __init__(self, doc_id: str, before: str, after: str, speculative: bool = False, guess: bool = False,
                 at_once: bool = False):
        self.doc_id, self.before, self.after = doc_id, before, after
        self.speculative = speculative or guess  # computed ahead, for no requester yet (a prefetch)
        self.guess = guess  # at the place of the last change: a further change makes it worthless
        # no debounce: its first pass computes what the warm-up left and lasts at least as long as the debounce left
        self.at_once = at_once
        self.parked = False  # a speculative result put aside for a later request: no longer shared
        self.submitted = time.perf_counter()
        self.asked_at: float | None = None  # when the first requester began waiting for it
        self.cancel_event = threading.Event()
        self._guard = threading.Lock()
        self._waiters: list[Future] = []
        self._abandoned: set[int] = set()
        self._done, self._result = False, None

    def attach(self) -> Future:
        future: Future = Future()
        with self._guard:
            if not self._done:
                if self.asked_at is None:
                    self.asked_at = time.perf_counter()
                self._waiters.append(future)
                return future
        resolve_future(future, self._result)
        return future

    def abandon(self, future: Future) -> None:
        """One requester gave up; the work stops once all of them have."""
        with self._guard:
            self._abandoned.add(id(future))
            everyone = all(id(f) in self._abandoned or f.cancelled() for f in self._waiters)
        if everyone:
            self.cancel_event.set()

    def has_waiters(self) -> bool:
        with self._guard:
            return any(not f.cancelled() and id(f) not in self._abandoned for f in self._waiters)

    def cancelled(self) -> bool:
        if self.cancel_event.is_set():
            return True
        with self._guard:  # a future cancelled by its caller (asyncio cancels the wrapped future) counts as gone
            return bool(self._waiters) and all(f.cancelled() for f in self._waiters)

    def resolve(self, value) -> None:
        with self._guard:
            self._done, self._result = True, value
            waiters = list(self._waiters)
        for future in waiters:
            resolve_future(future, value)

    def is_for(self, doc_id: str, before: str, after: str) -> bool:
        return (not self._done and not self.parked and self.doc_id == doc_id and self.before == before
                and self.after == after)


class Ticket:
    """A submitted request: its future resolves to a Completion or None (nothing to show)."""

    future: Future

    def __init__(self, job: Job):
        self._job = job
        self.future: Future = job.attach()

    def cancel(self) -> None:
        """Give up this request; the work stops (between decoding steps) unless another request shares it."""
        self._job.abandon(self.future)


def resolve_future(future: Future, value) -> None:
    try:
        future.set_result(value)
    except InvalidStateError:  # the caller cancelled the future itself
        pass


@dataclass(frozen=True)
class Expected:
    """Where the next request will most likely come from: the last change or request."""

    doc_id: str
    before: str
    after: str
    edited: bool = True  # the place of an edit (worth a guess), not of a request just answered


class RequestQueue:
    """Jobs waiting for the decoding thread, which runs `run(job)` for each (under no lock); when none waits, it
    runs `warm(expected, wanted)` for the last place `expect`ed, where `wanted()` says a job is waiting."""

    def __init__(self, lock: threading.RLock, run: Callable[[Job], Completion | None],
                 debounce_s: Callable[[], float], on_cancelled: Callable[[], None],
                 on_error: Callable[[Exception], None],
                 warm: Callable[[Expected, Callable[[], bool]], bool | None] | None = None,
                 idle: Callable[[], Job | None] | None = None,
                 guess: Callable[[Expected, bool], Job | None] | None = None):
        self._cond = threading.Condition(lock)
        self._speculate = idle  # speculative work for an idle thread (called under the lock)
        self._run, self._debounce_s = run, debounce_s
        self._on_cancelled, self._on_error = on_cancelled, on_error
        self._warm, self._guess = warm, guess
        self._queue: deque[Job] = deque()
        self._running: Job | None = None
        self._expected: Expected | None = None
        self._last: tuple[str, str, str] | None = None  # the last place expected, kept after the thread takes it
        self._closed = False
        self.thread = threading.Thread(target=self._work, name="rest-lsp-decoder", daemon=True)
        self.thread.start()

    def submit(self, doc_id: str, before: str, after: str,
               answer: Callable[[Job], tuple[bool, Completion | None]]) -> Ticket:
        """A ticket for the request; `answer(job)` (called under the lock) may answer it at once: (True, value)."""
        with self._cond:
            for job in (*self._queue, self._running):
                if job is not None and job.is_for(doc_id, before, after) and not job.cancelled():
                    return Ticket(job)
            self._cancel(doc_id)
            job = Job(doc_id, before, after)
            ticket = Ticket(job)
            now, value = answer(job)
            if now or self._closed:
                job.resolve(value if now else None)
                self._cond.notify_all()  # answering may have left speculative work for the idle thread
                return ticket
            self._cancel_speculative()  # a request that needs the decoder goes first
            self._queue.append(job)
            self._cond.notify_all()
        return ticket

    def expect(self, doc_id: str, before: str, after: str, edited: bool = True) -> None:
        """The next request will likely come here: warm the cache for it while idle (replaces the previous). A
        prefetch of the document that this text can no longer lead to stops."""
        with self._cond:
            for job in (*self._queue, self._running):
                if (job is not None and job.speculative and not job.guess and job.doc_id == doc_id
                        and not leads_to(before, after, job.before, job.after)):
                    job.cancel_event.set()
                # a guess at another place of the document, made for its text before this edit
                if (edited and job is not None and job.guess and job.doc_id == doc_id
                        and not job.is_for(doc_id, before, after) and not job.has_waiters()):
                    job.cancel_event.set()
            self._last = (doc_id, before, after)
            if self._warm is None:
                return
            self._expected = Expected(doc_id, before, after, edited)
            self._cond.notify_all()

    def moved(self, doc_id: str, before: str, after: str, then: Callable[[], None] | None = None) -> bool:
        """The cursor moved here without an edit: warm and guess here as after an edit, unless this is the last
        place expected (an edit's, or a request's just answered: its work is done or under way). `then` runs
        first, under the lock, only when it is a new place. A guess elsewhere that no request shares stops: the
        person left its place."""
        with self._cond:
            if self._last == (doc_id, before, after):
                return False
            for job in (*self._queue, self._running):
                if (job is not None and job.guess and not job.is_for(doc_id, before, after)
                        and not job.has_waiters()):
                    job.cancel_event.set()
            if then is not None:
                then()
            self.expect(doc_id, before, after)
            return True

    def wanted(self) -> bool:
        """A job is waiting (or the queue closes): idle work must give way."""
        return bool(self._queue) or self._closed

    def cancel(self, doc_id: str) -> None:
        """Stop the document's jobs (they answer None); prefetches go on, guesses stop (see the module's note)."""
        with self._cond:
            self._cancel(doc_id)

    def drop(self, doc_id: str) -> None:
        """The document closed: every job of it stops, prefetches too (nothing is kept for a closed document)."""
        with self._cond:
            for job in (*self._queue, self._running):
                if job is not None and job.doc_id == doc_id:
                    job.cancel_event.set()

    def _cancel(self, doc_id: str | None) -> None:
        for job in (*self._queue, self._running):
            if job is not None and (doc_id is None or (job.doc_id == doc_id and (job.guess or not job.speculative))):
                job.cancel_event.set()

    def _cancel_speculative(self) -> None:
        for job in (*self._queue, self._running):
            if job is not None and job.speculative:
                job.cancel_event.set()

    def close(self) -> threading.Thread:
        """Stop every job; returns the thread for the caller to join (outside any lock)."""
        with self._cond:
            self._closed = True
            self._cancel(None)
            self._cond.notify_all()
        return self.thread

    def _speculative(self) -> Job | None:
        """The owner's speculative work, if any; a failure there must not end the thread that serves requests."""
        if self._speculate is None:
            return None
        try:
            return self._speculate()
        except Exception:
            log.exception("speculative work failed")
            return None

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    speculative = self._speculative()
                    if speculative is not None:
                        self._queue.append(speculative)
                    elif self._expected is not None:
                        break  # warm the cache for the expected request
                    else:
                        self._cond.wait()
                if self._closed:
                    for job in self._queue:
                        job.resolve(None)
                    return
                if not self._queue:
                    expected, self._expected = self._expected, None
                    job = None
                else:
                    job = self._queue.popleft()
                    self._running = job
            if job is None:
                self._idle(expected)
                continue
            try:
                result = None
                # every job waits the debounce (what is left of it since the last change or answer): a person
                # still typing makes a guess worthless, and a change right after an answer (writing on instead of
                # accepting) the prefetch of accepting it, whose first step, once begun, would hold the decoder
                # from the work at the new place until it ends
                debounce = 0.0 if job.at_once else self._debounce_s()
                if not job.cancelled() and not job.cancel_event.wait(debounce):
                    result = self._run(job)
                elif not job.speculative:
                    self._on_cancelled()  # stopped before decoding began
                job.resolve(result)
            except Exception as err:
                log.exception("completion failed")
                self._on_error(err)
                job.resolve(None)
            finally:
                with self._cond:
                    self._running = None

    def _idle(self, expected: Expected) -> None:
        try:
            left = bool(self._warm(expected, self.wanted))  # True: it left the edit's tokens to the guess
        except Exception:  # a warm-up that failed costs only its time: the request computes what it needs
            log.exception("warming the cache failed")
            return
        if self._guess is None or not expected.edited:
            return
        with self._cond:
            if self._queue or self._closed or self._expected is not None:
                return  # a request, or a newer place to warm, goes first
            try:
                job = self._guess(expected, left)
            except Exception:
                log.exception("guessing the next request failed")
                return
            if job is not None:
                self._queue.append(job)
