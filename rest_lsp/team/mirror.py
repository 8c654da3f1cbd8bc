"""The editor's copy of its workspace as the server must see it: a Datastore that records what changed, and the
snapshot and deltas that carry it (a snapshot under a new epoch, then deltas numbered 1, 2, ...)."""

from __future__ import annotations

import threading
import uuid

from rest_lsp.datastore import Datastore, Source
from rest_lsp.datastore.ignore import is_secret_path
from rest_lsp.team.protocol import Delta, Doc, Snapshot


class RecordingDatastore(Datastore):
    """The local datastore (the indexer and the buffers write into it) that remembers which documents changed
    since the last delta, and wakes whoever sends them."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.changed = threading.Event()
        self._dirty: set[str] = set()
        self._dirty_lock = threading.Lock()

    def apply(self, puts, removes=()) -> None:
        puts = list(puts)
        removes = list(removes)
        super().apply(puts, removes)
        self._mark([d for d, _, _ in puts] + removes)

    def install(self, segments):
        out = super().install(segments)
        self._mark([d for s in segments for d in s.doc_ids])
        return out

    def _mark(self, doc_ids) -> None:
        if doc_ids:
            with self._dirty_lock:
                self._dirty.update(doc_ids)
            self.changed.set()

    def take_changed(self) -> set[str]:
        with self._dirty_lock:
            out, self._dirty = self._dirty, set()
            self.changed.clear()
            return out

    def document(self, doc_id: str) -> Doc | None:
        """A live document's tokens and source, or None."""
        with self._lock:
            where = self._docs.get(doc_id)
            segments = self.segments()
        if where is None:
            return None
        segment = next((s for s in segments if s.name == where[0]), None)
        if segment is None:
            return None
        buffer = segment.source_list[where[1]] == Source.OPEN_BUFFER.value
        return Doc(doc_id=doc_id, tokens=segment.doc_tokens(where[1]).tolist(), source="buffer" if buffer else "workspace")


class Mirror:
    """Where the server stands: the epoch and the last delta sent. `snapshot()` starts a new epoch."""

    def __init__(self, datastore: RecordingDatastore, tokenizer_key: str):
        self.datastore, self.key = datastore, tokenizer_key
        self.epoch = ""
        self.seq = 0

    def snapshot(self, settings: dict) -> Snapshot:
        self.datastore.take_changed()  # all of it goes now
        self.epoch, self.seq = uuid.uuid4().hex, 0
        ids = [d for d in self.datastore.doc_ids() if not is_secret_path(d)]  # credentials never leave the editor
        docs = [d for d in map(self.datastore.document, ids) if d is not None]
        return Snapshot(epoch=self.epoch, tokenizer_key=self.key, docs=docs, settings=settings)

    def delta(self) -> Delta | None:
        """The changes since the last delta or snapshot, numbered next; None when nothing changed."""
        changed = {d for d in self.datastore.take_changed() if not is_secret_path(d)}
        if not changed:
            return None
        puts, removes = [], []
        for doc_id in sorted(changed):
            doc = self.datastore.document(doc_id)
            if doc is None:
                removes.append(doc_id)
            else:
                puts.append(doc)
        self.seq += 1
        return Delta(epoch=self.epoch, seq=self.seq, puts=puts, removes=removes)
