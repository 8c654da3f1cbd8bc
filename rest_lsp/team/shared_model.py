"""The model a replica loads once, and the per-workspace ServingModel views of it.

Every workspace of a replica decodes with the one decoder (one KV cache, one weights copy), one at a time: a lock
covers each decoder call and each switch of its cache between documents. Turns are kept short for the others: a
completion ends when it has held the decoder for the server's time limit (limits.Limits), and work nobody waits for
(a prefetch, a prompt warmed ahead) stops as soon as another caller waits for the decoder. What REST learns from a workspace's code
stays that workspace's: its outputs, its successor table, its own tokenizer copy (a fast tokenizer is not safe
from several threads) and its document caches, named under the workspace in the replica's shared, bounded store.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time

from rest_lsp.service.lifecycle import ServingModel, load_serving_model
from rest_lsp.settings import Settings
from rest_lsp.team.limits import Limits


class LockedDecoder:
    """The decoder's interface, each call under the replica's decoding lock; `generate` ends at `most_s` after it
    got the decoder, and stops at once, as `prefill` does, when it is speculative and another caller waits."""

    def __init__(self, decoder, lock: threading.RLock, most_s: float = Limits().completion_s,
                 clock=time.monotonic):
        self._decoder, self._lock, self._most_s, self._clock = decoder, lock, most_s, clock
        self._count = threading.Lock()
        self._waiting = 0

    def __getattr__(self, name: str):
        value = getattr(self._decoder, name)
        if not callable(value):
            return value

        def locked(*args, **kwargs):
            with self.turn():
                return value(*args, **kwargs)

        return locked

    @contextlib.contextmanager
    def turn(self):
        """The decoder, counted among its waiters until it is this caller's."""
        with self._count:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._count:
                self._waiting -= 1
        try:
            yield
        finally:
            self._lock.release()

    def others_wait(self) -> bool:
        return self._waiting > 0

    def generate(self, prompt, drafts, config, should_stop=None, cancelled=None):
        def spare() -> bool:  # asked each step: a request may join a prefetch while it runs
            return _speculative(cancelled) and self.others_wait()

        with self.turn():
            deadline = self._clock() + self._most_s

            def stop(new: list[int]) -> bool:
                if self._clock() >= deadline or spare():
                    return True
                return should_stop is not None and should_stop(new)

            def yields() -> bool:
                return (cancelled is not None and cancelled()) or spare()

            return self._decoder.generate(prompt, drafts, config, stop, cancelled=yields)

    def prefill(self, tokens, stop=None, **kwargs):
        """A prompt warmed ahead of its request: it yields to any caller that waits."""
        with self.turn():
            return self._decoder.prefill(tokens, stop=lambda: self.others_wait() or (stop is not None and stop()),
                                         **kwargs)


def _speculative(cancelled) -> bool:
    """Whether a decoding is work nobody waits for yet: the service's prefetch (its job's `cancelled`, bound to a
    speculative job without waiters)."""
    job = getattr(cancelled, "__self__", None)
    if job is None or not getattr(job, "speculative", False):
        return False
    waiters = getattr(job, "has_waiters", None)
    return not (waiters() if callable(waiters) else False)


class WorkspaceDocuments:
    """document_caches.DocumentCaches for one workspace: its documents named under it in the shared store."""

    def __init__(self, shared, workspace: str, lock: threading.RLock):
        self._shared, self._prefix, self._lock = shared, workspace + "\0", lock

    def use(self, decoder, doc_id: str, limit_bytes: int) -> None:
        with self._lock:
            self._shared.use(decoder, self._prefix + doc_id, limit_bytes)

    def forget(self, doc_id: str) -> None:
        self._shared.forget(self._prefix + doc_id)

    def opened(self, doc_id: str) -> None:
        self._shared.opened(self._prefix + doc_id)

    def __getattr__(self, name: str):
        return getattr(self._shared, name)  # what names no document (counters)

    def forget_all(self) -> None:
        for name in self._shared.kept():
            if name.startswith(self._prefix):
                self._shared.forget(name)

    def kept(self) -> list[str]:
        return [n[len(self._prefix):] for n in self._shared.kept() if n.startswith(self._prefix)]

    @property
    def kept_bytes(self) -> int:
        return self._shared.kept_bytes


class SharedModel:
    def __init__(self, settings: Settings, limits: Limits = Limits()):
        self.settings, self.limits = settings, limits
        self.base: ServingModel = load_serving_model(settings)
        self.lock = threading.RLock()  # one decoding at a time on this replica
        self.decoder = LockedDecoder(self.base.decoder, self.lock, limits.completion_s)
        hf = self.base.loaded.tokenizer.hf
        self.tokenizer_blob = hf.backend_tokenizer.to_str()
        self.split_special_tokens = bool(getattr(hf, "split_special_tokens", False))
        self.vocab_size = int(self.base.decoder.vocab_size)  # ids a workspace may send: the embedding's rows

    @property
    def tokenizer_key(self) -> str:
        return self.base.tokenizer_key

    def for_workspace(self, workspace: str) -> ServingModel:
        """A view for one workspace: the shared decoder and weights, everything learned from its code its own."""
        from rest_lsp.drafting.drafts import OutputStore, SuccessorTable, TokenLines
        from rest_lsp.engine.model import Tokenizer

        base = self.base
        tokenizer = Tokenizer(copy.deepcopy(base.loaded.tokenizer.hf))
        loaded = dataclasses.replace(base.loaded, tokenizer=tokenizer)
        return dataclasses.replace(
            base, loaded=loaded, decoder=self.decoder, background=tokenizer, outputs=OutputStore(),
            recycle=SuccessorTable(), documents=WorkspaceDocuments(base.documents, workspace, self.lock),
            lines=TokenLines(lambda t: tokenizer.decode([t])))
