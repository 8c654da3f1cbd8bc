"""Datastore feeding: what goes into the completion service's datastore, and when.

Three sources: the workspace folders (a WorkspaceIndex per root, built in the background, then watching the disk),
the open editor buffers (re-tokenized a moment after a burst of keystrokes, replacing the file's version while
open), and accepted suggestions (the last ACCEPTED_DOCUMENTS). All tokenizing here uses the service's background
tokenizer, never the one that prompt building needs.

Threads: nothing here holds the service lock across a join or a call that waits for another component's thread;
indexes to stop are collected under the lock and stopped after releasing it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Protocol

from rest_lsp.datastore.ignore import is_secret_path
from rest_lsp.priority import lower_this_thread
from rest_lsp.settings import Settings

log = logging.getLogger(__name__)

BUFFER_DEBOUNCE_S = 0.25  # open buffers are re-tokenized at most this often
ACCEPTED_DOCUMENTS = 256  # accepted completions kept in the datastore; older ones are removed


class FeedHost(Protocol):
    """What the feed uses of the service that owns it."""

    _lock: threading.RLock
    settings: Settings
    _loaded: object  # the model: its tokenizer's key names the persisted indexes
    _ready: threading.Event
    events: object

    def _tokenize_batch(self, texts: list[str]) -> list[list[int]]: ...
    def _report(self, level: str, text: str) -> None: ...
    def _spawn(self, target, name: str) -> None: ...


class HostThreads:
    """`_report` and `_spawn` as a feed's host implements them (the local service and the team client alike): a
    failing listener is logged, never fatal to the reporting thread; no thread starts once the host is closed, and
    finished ones are forgotten. The host provides `events`, `_lock`, `_threads` and `_is_closed()`."""

    def _report(self, level: str, text: str) -> None:
        try:
            self.events.message(level, text)
        except Exception:
            log.exception("reporting %r failed", text)

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            if self._is_closed():
                return
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()


class _Stale(Exception):
    """Indexing for a datastore or settings that were replaced meanwhile: give it up."""


def workspace_key(settings: Settings) -> tuple:
    """The settings that need the workspace indexed again when they change."""
    return (settings.index_workspace, settings.ignore, settings.max_file_bytes, settings.cache_dir)


class DatastoreFeed:
    def __init__(self, host: FeedHost):
        self._host = host
        self._lock = host._lock  # one lock with the service: a model switch swaps datastore and indexes at once
        self.datastore = None
        self.indexes: dict[str, object] = {}
        self.roots: list[Path] = []
        self._indexing: set[tuple[int, str]] = set()  # (generation, root) being indexed: not started twice
        self.indexed = threading.Event()  # the roots of the current datastore and settings are indexed
        self._generation = 0  # bumped whenever the indexes are thrown away: older indexing stops
        self._closed = False
        self._accepted_docs: deque[str] = deque()
        self._buffers: dict[str, str] = {}  # open buffers: doc id -> text
        self._pending: dict[str, str | None] = {}  # to put into the datastore (None: closed, back to disk)
        self._dirty = threading.Event()
        self.thread = threading.Thread(target=self._feed_buffers, name="rest-lsp-buffers", daemon=True)
        self.thread.start()

    # -- the datastore ---------------------------------------------------------------------------------------
    def reset(self):
        """A new, empty datastore for a new tokenizer (under the lock); returns (the old one or None, the indexes
        to stop) for the caller to close and stop after releasing the lock."""
        from rest_lsp.datastore import Datastore

        self._generation += 1
        retired, self.indexes = list(self.indexes.values()), {}
        self.indexed.clear()
        old, self.datastore = self.datastore, Datastore()
        self._accepted_docs.clear()
        # open buffers go back in with the new tokenizer
        self._pending.update(self._buffers)
        self._dirty.set()
        return old, retired

    def wake(self) -> None:
        """Feed what waits (buffers opened while no model was there)."""
        self._dirty.set()

    def close(self) -> list[threading.Thread]:
        """Stop indexing and feeding; returns the thread to join. The caller closes the datastore after joining."""
        with self._lock:
            self._closed = True
            self._generation += 1
            indexes, self.indexes = list(self.indexes.values()), {}
        self._dirty.set()
        self.retire(indexes, None)
        return [self.thread]

    # -- the workspace ---------------------------------------------------------------------------------------
    def retire(self, indexes: list, datastore) -> None:
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

    def start_indexing(self) -> None:
        """Index the roots in a thread of its own (never the loader's: it ran torch and would keep OpenMP workers
        while indexing, which slows every decoding step: priority.py)."""
        self._host._spawn(self.index_roots, "rest-lsp-indexer")

    def index_roots(self) -> None:
        lower_this_thread()
        with self._lock:
            generation = self._generation
        try:
            self._index_each_root(generation)
        finally:
            with self._lock:
                if generation == self._generation:
                    self.indexed.set()

    def restart_indexing(self) -> None:
        """Throw the indexes away and index again under the current settings (indexWorkspace, ignore, ...)."""
        with self._lock:
            self._generation += 1
            retired, self.indexes = list(self.indexes.values()), {}
            datastore, ready = self.datastore, self._host._ready.is_set()
            self.indexed.clear()
        self.retire(retired, datastore)
        if ready:
            self.start_indexing()
        else:
            self.indexed.set()  # the loader starts the indexing once the model is there

    def change_roots(self, added: list[Path], removed: list[Path]) -> None:
        """Workspace folders added (indexed, then watched) or removed (unwatched, their files out of the datastore)
        while running. Waits for the removed ones' watchers: never call it on the event loop."""
        gone = {str(r) for r in removed}
        with self._lock:
            kept = [r for r in self.roots if str(r) not in gone]
            self.roots = kept + [r for r in dict.fromkeys(added) if r not in kept and str(r) not in gone]
            retired = [self.indexes.pop(k) for k in list(self.indexes) if k in gone]
            datastore, ready = self.datastore, self._host._ready.is_set()
            if ready and added:
                self.indexed.clear()
        self.retire(retired, datastore)
        if ready and added:
            self.start_indexing()

    def _stale(self, generation: int) -> bool:
        return self._closed or generation != self._generation

    def _dropped(self, root: Path, generation: int) -> bool:
        """The indexing of `root` is not wanted any more (closed, replaced, or the folder left the workspace)."""
        return self._stale(generation) or root not in self.roots

    def _index_each_root(self, generation: int) -> None:
        from rest_lsp.datastore import WorkspaceIndex

        host = self._host
        for root in list(self.roots):
            key = str(root)
            with self._lock:
                s = host.settings
                if (not s.index_workspace or self._dropped(root, generation) or key in self.indexes
                        or (generation, key) in self._indexing):
                    continue
                if is_secret_path(key, True) or is_secret_path(os.path.realpath(root), True):
                    log.warning("Not indexing %s: it is inside a folder of credentials.", root)
                    continue
                self._indexing.add((generation, key))
                loaded, datastore = host._loaded, self.datastore

            def tokenize(texts: list[str], root=root) -> list[list[int]]:
                if self._dropped(root, generation):  # closed, replaced, or removed: stop indexing
                    raise _Stale()
                return host._tokenize_batch(texts)

            host.events.index_begin(key)
            stats: dict = {}
            index = None
            try:
                cache_dir = Path(s.cache_dir) if s.cache_dir else None
                index = WorkspaceIndex(
                    root, datastore, tokenize, loaded.tokenizer.key,
                    cache_dir=cache_dir, max_file_bytes=s.max_file_bytes, extra_ignore=s.ignore,
                    on_progress=lambda done, total, k=key: host.events.index_progress(k, done, total),
                    on_change=self._on_disk_change,
                )
                stats = index.build() or {}
                index.start_watching()
                with self._lock:
                    dropped = self._dropped(root, generation)
                    if not dropped:
                        self.indexes[key] = index
                if dropped:
                    self.retire([index], None if self._closed else datastore)
            except Exception as err:
                if index is not None and self._dropped(root, generation):
                    self.retire([index], None if self._closed else datastore)
                elif not isinstance(err, _Stale):
                    log.exception("indexing %s failed", root)
                    host._report("warning", f"rest-lsp could not index {root}: {err}")
            finally:
                with self._lock:
                    self._indexing.discard((generation, key))
                host.events.index_end(key, stats)

    def _on_disk_change(self, doc_ids: list[str]) -> None:
        # A save writes the buffer's text to disk; a buffer still open keeps precedence.
        with self._lock:
            reopen = {d: self._buffers[d] for d in doc_ids if d in self._buffers}
            self._pending.update(reopen)
        if reopen:
            self._dirty.set()

    # -- open buffers ----------------------------------------------------------------------------------------
    def open_buffer(self, doc_id: str, text: str) -> None:
        if is_secret_path(doc_id):  # a key or credential open in the editor: never drafted, as never indexed
            return
        with self._lock:
            self._buffers[doc_id] = text
            self._pending[doc_id] = text
        self._dirty.set()

    def close_buffer(self, doc_id: str) -> None:
        with self._lock:
            self._buffers.pop(doc_id, None)
            self._pending[doc_id] = None
        self._dirty.set()

    def _feed_buffers(self) -> None:
        from rest_lsp.datastore import Source

        lower_this_thread()
        while True:
            self._dirty.wait()
            if self._closed:
                return
            time.sleep(BUFFER_DEBOUNCE_S)  # let a burst of keystrokes settle
            self._dirty.clear()
            if self._closed:
                return
            if not self._host._ready.is_set():
                continue  # the loader wakes the feed once a datastore exists
            with self._lock:
                pending, self._pending = self._pending, {}
                datastore = self.datastore
            for doc_id, text in pending.items():
                try:
                    if text is None:
                        self._restore_from_disk(datastore, doc_id)
                    elif self._indexable(text):
                        datastore.put(doc_id, self._host._tokenize_batch([text])[0], Source.OPEN_BUFFER)
                except Exception:
                    log.exception("feeding buffer %s failed", doc_id)

    def _indexable(self, text: str) -> bool:
        return len(text.encode("utf-8", "surrogatepass")) <= self._host.settings.max_file_bytes and "\x00" not in text

    def _restore_from_disk(self, datastore, doc_id: str) -> None:
        """A closed buffer: back to the file's version on disk if the indexer keeps that file, else out.

        The indexer's word counts, not the buffer's: a file it skips (ignore rules, size) leaves the datastore.
        """
        from rest_lsp.datastore import Source

        with self._lock:
            indexes = list(self.indexes.values())
        if any(index.owns(doc_id) for index in indexes):
            try:
                text = Path(doc_id).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
            if text is not None and self._indexable(text):
                datastore.put(doc_id, self._host._tokenize_batch([text])[0], Source.WORKSPACE)
                return
        datastore.remove(doc_id)

    # -- accepted suggestions --------------------------------------------------------------------------------
    def add_accepted(self, datastore, doc_id: str, tokens: list[int]) -> None:
        """An accepted suggestion into `datastore`; only the last ACCEPTED_DOCUMENTS are kept."""
        from rest_lsp.datastore import Source

        datastore.put(doc_id, tokens, Source.ACCEPTED)
        with self._lock:
            if datastore is not self.datastore:
                return  # a new tokenizer's datastore replaced it meanwhile
            self._accepted_docs.append(doc_id)
            old = [self._accepted_docs.popleft() for _ in range(len(self._accepted_docs) - ACCEPTED_DOCUMENTS)]
        for doc in old:
            datastore.remove(doc)
