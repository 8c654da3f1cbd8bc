"""Keeps a Datastore in step with the files of one workspace root: build, reconcile, watch, persist.

Doc ids are absolute paths below the resolved root. One thread at a time changes the index (build,
then the watcher thread); queries on the datastore run on any thread meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .ignore import IgnoreRules, is_ignore_file, relative
from .persist import IndexFolder, default_cache_dir, index_folder
from .scan import Signature, read_text, stat_file, walk
from .store import Datastore, Source
from .watcher import DebouncedWatcher

log = logging.getLogger(__name__)

Tokenize = Callable[[list[str]], list[list[int]]]
# Files per tokenizer call, and tokens per segment written during a build.
TOKENIZE_BATCH_FILES = 64
SEGMENT_TOKENS = 1 << 21


class WorkspaceIndex:
    def __init__(self, root: Path, datastore: Datastore, tokenize: Tokenize, tokenizer_key: str, *,
                 cache_dir: Path | None = None, max_file_bytes: int = 1_000_000,
                 extra_ignore: Sequence[str] = (), debounce_s: float = 0.05,
                 on_progress: Callable[[int, int], None] | None = None,
                 on_change: Callable[[list[str]], None] | None = None,
                 persist: bool = True, save_after_s: float = 2.0, polling: bool = False):
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"Workspace root {str(root)!r} is not a folder.")
        self.root = root.resolve()
        self.datastore = datastore
        self._tokenize = tokenize
        self.max_file_bytes = max_file_bytes
        self.rules = IgnoreRules(self.root, extra_ignore)
        self._debounce_s = debounce_s
        self._on_progress = on_progress
        self._on_change = on_change
        self._save_after_s = save_after_s
        self._polling = polling
        self._folder = (IndexFolder(index_folder(Path(cache_dir) if cache_dir else default_cache_dir(), self.root),
                                    tokenizer_key, self.root) if persist else None)
        self._files: dict[str, Signature] = {}      # indexed, with the signature their tokens came from
        self._skipped: dict[str, Signature] = {}    # binary or unreadable: not read again until changed
        self._dirty = False                         # changes not yet saved
        self._watcher: DebouncedWatcher | None = None
        self._lock = threading.Lock()               # build / watcher batches / save, one at a time

    # --- public ------------------------------------------------------------------------------
    def build(self) -> dict:
        """Load the saved index, reconcile it with the disk, index what is new or changed, save."""
        started = time.perf_counter()
        with self._lock:
            loaded = self._load()
            changed = self._reconcile(walk(self.root, self.rules, self.max_file_bytes), report=True)
            if changed or not loaded:
                self._save()
        stats = self.stats()
        stats.update(seconds=time.perf_counter() - started, loaded=loaded, reindexed=changed)
        return stats

    def start_watching(self) -> None:
        if self._watcher is not None:
            return
        self._watcher = DebouncedWatcher(self.root, self._on_paths, self._on_rescan, debounce_s=self._debounce_s,
                                         on_idle=self.save, idle_s=self._save_after_s, polling=self._polling)
        self._watcher.start()

    @property
    def watching_by_polling(self) -> bool:
        return self._watcher is not None and self._watcher.polling

    def stop(self) -> None:
        """Stop watching and save what changed."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        self.save()

    def save(self) -> None:
        with self._lock:
            if self._dirty:
                self._save()

    def rescan(self) -> int:
        """Reconcile with a full scan of the disk (after lost events); returns files re-indexed or removed."""
        with self._lock:
            self.rules.invalidate()
            return self._reconcile(walk(self.root, self.rules, self.max_file_bytes))

    def stats(self) -> dict:
        ds = self.datastore.stats()
        return {"files": len(self._files), "tokens": ds["tokens"], "segments": ds["segments"],
                "bytes": ds["bytes"], "bytes_per_token": ds["bytes_per_token"]}

    def owns(self, doc_id: str) -> bool:
        return doc_id in self._files

    # --- disk -> datastore ----------------------------------------------------------------------
    def _reconcile(self, on_disk: dict[str, Signature], under: str | None = None, report: bool = False) -> int:
        """Make the index match `on_disk` (for the whole root, or for the folder `under`)."""
        prefix = None if under is None else under + os.sep
        known = [p for p in (*self._files, *self._skipped) if prefix is None or p.startswith(prefix) or p == under]
        gone = [p for p in known if p not in on_disk]
        todo = [p for p, sig in on_disk.items() if self._files.get(p, self._skipped.get(p)) != sig]
        self._index(todo, gone, report)
        return len(todo) + len(gone)

    def _index(self, paths: list[str], removed: Iterable[str], report: bool = False) -> None:
        removed = [p for p in removed if p in self._files or p in self._skipped]
        for p in removed:
            self._skipped.pop(p, None)
        total, done = len(paths), 0
        if report and self._on_progress:
            self._on_progress(0, total)
        pending: list[tuple[str, list[int], Source]] = []
        pending_sigs: dict[str, Signature] = {}
        pending_tokens = 0
        gone = [p for p in removed if p in self._files]
        for start in range(0, max(total, 1), TOKENIZE_BATCH_FILES):
            batch = paths[start: start + TOKENIZE_BATCH_FILES]
            texts, names, sigs = [], [], []
            for path in batch:
                sig = stat_file(path, self.max_file_bytes)
                text = read_text(path, self.max_file_bytes) if sig else None
                if text is None:
                    if sig is not None:
                        self._skipped[path] = sig        # binary or unreadable
                    if path in self._files:
                        gone.append(path)
                    continue
                self._skipped.pop(path, None)
                texts.append(text)
                names.append(path)
                sigs.append(sig)
            for path, toks, sig in zip(names, self._tokenize(texts) if texts else [], sigs):
                pending.append((path, toks, Source.WORKSPACE))
                pending_sigs[path] = sig
                pending_tokens += len(toks)
            done += len(batch)
            if pending_tokens >= SEGMENT_TOKENS or done >= total:
                self._commit(pending, gone, pending_sigs)
                pending, gone, pending_sigs, pending_tokens = [], [], {}, 0
            if report and self._on_progress and batch:
                self._on_progress(done, total)
        if pending or gone:
            self._commit(pending, gone, pending_sigs)

    def _commit(self, puts: list[tuple[str, list[int], Source]], gone: list[str], sigs: dict[str, Signature]) -> None:
        if not puts and not gone:
            return
        self.datastore.apply(puts, gone)
        for p in gone:
            self._files.pop(p, None)
        self._files.update(sigs)
        self._dirty = True
        if self._on_change:
            try:
                self._on_change([*(p for p, _, _ in puts), *gone])
            except Exception:  # a listener's bug must not stop indexing
                log.exception("on_change listener failed")

    # --- watcher callbacks (watcher thread) -----------------------------------------------------
    def _on_paths(self, paths: set[str]) -> None:
        with self._lock:
            todo: list[str] = []
            gone: list[str] = []
            for path in sorted(paths):
                rel = relative(self.root, path)
                if rel is None:
                    if path in self._files or path in self._skipped:
                        gone.append(path)         # replaced by a symlink, or a path we cannot trust
                    continue
                if is_ignore_file(rel):
                    # What is ignored may have changed anywhere below: reconcile everything.
                    self.rules.invalidate()
                    self._reconcile(walk(self.root, self.rules, self.max_file_bytes))
                    return
                if rel == "" or self.rules.ignored(rel, os.path.isdir(path)):
                    if path in self._files or path in self._skipped:
                        gone.append(path)
                    continue
                if os.path.isdir(path) and not os.path.islink(path):
                    # A folder created or moved in: its files came without events of their own.
                    self._reconcile(walk(self.root, self.rules, self.max_file_bytes, under=rel), under=path)
                    continue
                sig = stat_file(path, self.max_file_bytes)
                if sig is None:
                    gone.append(path)
                    prefix = path + os.sep     # a folder deleted or moved away
                    gone.extend(p for p in (*self._files, *self._skipped) if p.startswith(prefix))
                elif self._files.get(path, self._skipped.get(path)) != sig:
                    todo.append(path)
            self._index(todo, gone)

    def _on_rescan(self) -> None:
        log.warning("File events were lost; rescanning %s.", self.root)
        self.rescan()

    # --- persistence ---------------------------------------------------------------------------
    def _load(self) -> bool:
        if self._folder is None:
            return False
        saved = self._folder.load()
        if saved is None:
            return False
        self.datastore.install(saved.segments)
        present = set(self.datastore.doc_ids())
        self._files = {p: s for p, s in saved.files.items() if p in present}
        self._skipped = dict(saved.skipped)
        return True

    def _save(self) -> None:
        if self._folder is None:
            return
        files = dict(self._files)
        self._folder.save(self.datastore.segments(), files.__contains__, files, dict(self._skipped))
        self._dirty = False
