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
from .known import KnownPaths
from .persist import IndexFolder, default_cache_dir, index_folder
from .scan import Signature, as_text, read_bytes, settled, stat_file, unchanged, walk
from .store import Datastore, Source, as_tokens
from .watcher import DebouncedWatcher

log = logging.getLogger(__name__)

Tokenize = Callable[[list[str]], list[list[int]]]
# Files per tokenizer call, and tokens per segment written during a build.
TOKENIZE_BATCH_FILES = 64
VENV_MARKER = "pyvenv.cfg"  # its folder is a virtual environment (ignore.py skips it)
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
        self._files = KnownPaths()                  # indexed, with the signature their tokens came from
        self._skipped = KnownPaths()                # binary or unreadable: not read again until changed
        self._dirty = False                         # changes not yet saved
        self._saved_names: frozenset[str] = frozenset()  # segments holding our files, as last loaded or saved
        self._watcher: DebouncedWatcher | None = None
        self._lock = threading.Lock()               # build / watcher batches / save, one at a time
        # Listeners are called outside `_lock`, and none once stop() has begun: stop() may be called by a thread
        # that holds a lock the listener wants, so it must neither wait for a listener nor for `_lock` behind one.
        self._changed: list[str] = []               # doc ids changed, for the listener
        self._gate = threading.Lock()
        self._stopping = False
        self._in_listener = False
        self.save_error: str | None = None          # why the last save failed, if it did

    # --- public ------------------------------------------------------------------------------
    def build(self) -> dict:
        """Load the saved index, reconcile it with the disk, index what is new or changed, save.

        A save that fails (a full disk) is logged and retried after the next change: the index in memory is
        complete, and watching can start. `stats["saved"]` says whether the folder holds it.
        """
        started = time.perf_counter()
        with self._lock:
            loaded = self._load()
            changed = self._reconcile(walk(self.root, self.rules, self.max_file_bytes), report=True)
            if changed or not loaded:
                self._dirty = True
                self._save()
        self._deliver_changes()
        stats = self.stats()
        stats.update(seconds=time.perf_counter() - started, loaded=loaded, reindexed=changed, saved=self.saved)
        return stats

    def start_watching(self) -> None:
        """Watch the root; what changed since build() looked (while it was indexing) is found by a rescan
        that the watcher runs first."""
        if self._watcher is not None:
            return
        self._watcher = DebouncedWatcher(self.root, self._on_paths, self._on_rescan, debounce_s=self._debounce_s,
                                         on_idle=self.save, idle_s=self._save_after_s, polling=self._polling,
                                         skip_dir=self._skip_dir, on_start=self.rescan)
        self._watcher.start()

    @property
    def watching_by_polling(self) -> bool:
        return self._watcher is not None and self._watcher.polling

    def stop(self) -> None:
        """Stop watching and save what changed.

        Safe to call while holding a lock that an `on_change` listener takes: a listener call under way is
        not waited for (it is the last one), and no other starts.
        """
        with self._gate:
            self._stopping = True
            in_listener = self._in_listener
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop(join=not in_listener)
        self.save()

    def save(self) -> None:
        """Save what changed: files, or the segments holding them (a merge is kept, not done again)."""
        with self._lock:
            if self._dirty or self._own_names(self.datastore.segments()) != self._saved_names:
                self._save()

    @property
    def saved(self) -> bool:
        """True if the index folder holds every file change (merges aside)."""
        return self._folder is not None and not self._dirty

    def rescan(self) -> int:
        """Reconcile with a full scan of the disk (after lost events); returns files re-indexed or removed."""
        with self._lock:
            self.rules.invalidate()
            changed = self._reconcile(walk(self.root, self.rules, self.max_file_bytes))
        self._deliver_changes()
        return changed

    def stats(self) -> dict:
        ds = self.datastore.stats()
        return {"files": len(self._files), "tokens": ds["tokens"], "segments": ds["segments"],
                "bytes": ds["bytes"], "bytes_per_token": ds["bytes_per_token"]}

    def owns(self, doc_id: str) -> bool:
        return doc_id in self._files

    # --- disk -> datastore ----------------------------------------------------------------------
    def _reconcile(self, on_disk: dict[str, Signature], under: str | None = None, report: bool = False) -> int:
        """Make the index match `on_disk` (for the whole root, or for the folder `under`)."""
        known = [*self._files, *self._skipped] if under is None else self._known_at_or_below(under)
        gone = [p for p in known if p not in on_disk]
        todo = [p for p, sig in on_disk.items() if not self._unchanged(p, sig)]
        self._index(todo, gone, report)
        return len(todo) + len(gone)

    def _unchanged(self, path: str, sig: Signature) -> bool:
        old = self._files.get(path, self._skipped.get(path))
        return unchanged(path, old, sig, self.max_file_bytes)

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
                data = read_bytes(path, self.max_file_bytes) if sig else None
                text = as_text(data, self.max_file_bytes)
                if text is None:
                    if sig is not None:
                        self._skipped[path] = settled(sig, data)     # binary or unreadable
                    if path in self._files:
                        gone.append(path)
                    continue
                self._skipped.pop(path, None)
                texts.append(text)
                names.append(path)
                sigs.append(settled(sig, data))
            for path, toks, sig in zip(names, self._tokenize(texts) if texts else [], sigs):
                try:
                    toks = as_tokens(path, toks)
                except ValueError as err:        # one odd document must not stop the others
                    log.warning("Not indexed: %s", err)
                    self._skipped[path] = sig
                    if path in self._files:
                        gone.append(path)
                    continue
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
            self._changed.extend([*(p for p, _, _ in puts), *gone])

    def _deliver_changes(self) -> None:
        """Tell the listener what changed; called without `_lock` held."""
        with self._lock:
            changed, self._changed = self._changed, []
        if not changed or self._on_change is None:
            return
        with self._gate:
            if self._stopping:
                return
            self._in_listener = True
        try:
            self._on_change(changed)
        except Exception:  # a listener's bug must not stop indexing
            log.exception("on_change listener failed")
        finally:
            with self._gate:
                self._in_listener = False

    # --- watcher callbacks (watcher thread) -----------------------------------------------------
    def _on_paths(self, paths: set[str]) -> None:
        with self._lock:
            self._apply_events(paths)
        self._deliver_changes()

    def _apply_events(self, paths: set[str]) -> None:
        todo: list[str] = []
        gone: list[str] = []
        self._venvs_changed(paths)
        for path in sorted(paths):
            rel = relative(self.root, path)
            if rel is None:
                # Outside the root, or a symlink on the way: what was indexed there (or below) is gone.
                gone.extend(self._known_at_or_below(path))
                continue
            if is_ignore_file(rel):
                if self._reload_ignore_file(rel):
                    return
                continue
            if rel == "":
                continue                  # the root itself: its entries have events of their own
            if self.rules.ignored(rel, os.path.isdir(path)):
                gone.extend(self._known_at_or_below(path))
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                # A folder created or moved in: its files came without events of their own.
                self._reconcile(walk(self.root, self.rules, self.max_file_bytes, under=rel), under=path)
                continue
            sig = stat_file(path, self.max_file_bytes)
            if path not in self._files and path not in self._skipped:
                # It may have been a folder (moved away and replaced by this file or link in one batch).
                gone.extend(p for p in self._known_at_or_below(path) if p != path)
            if sig is None:
                gone.extend(self._known_at_or_below(path))
            elif not self._unchanged(path, sig):
                todo.append(path)
        self._index(todo, gone)

    def _venvs_changed(self, paths: set[str]) -> None:
        """A pyvenv.cfg came or went: its folder became, or stopped being, a virtual environment (skipped whole)."""
        folders = {os.path.dirname(p) for p in paths if os.path.basename(p) == VENV_MARKER}
        rels = {f: relative(self.root, f) for f in folders}
        rels = {f: rel for f, rel in rels.items() if rel is not None and not (rel and self._above_ignored(rel))}
        if not rels:
            return
        self.rules.invalidate()
        for folder, rel in sorted(rels.items()):
            self._reconcile(walk(self.root, self.rules, self.max_file_bytes, under=rel), under=folder)

    def _above_ignored(self, rel: str) -> bool:
        parent = rel.rpartition("/")[0]
        return bool(parent) and self.rules.ignored(parent, True)

    def _reload_ignore_file(self, rel: str) -> bool:
        """A .gitignore (or .git/info/exclude) changed: reconcile what it rules; True if that was everything."""
        folder = "" if rel == ".git/info/exclude" else rel.rpartition("/")[0]
        if folder and self.rules.ignored(folder, True):
            return False                 # git reads no ignore file inside an ignored folder, nor do we
        self.rules.invalidate()
        if not folder:
            self._reconcile(walk(self.root, self.rules, self.max_file_bytes))
            return True
        self._reconcile(walk(self.root, self.rules, self.max_file_bytes, under=folder),
                        under=str(self.root / folder))
        return False

    def _known_at_or_below(self, path: str) -> list[str]:
        return self._files.at_or_below(path) + self._skipped.at_or_below(path)

    def _skip_dir(self, path: str) -> bool:
        """For the polling watcher: a folder that is ignored, or not ours, is never listed."""
        rel = relative(self.root, path)
        return rel is None or (rel != "" and self.rules.ignored(rel, True))

    def _on_rescan(self) -> None:
        log.warning("File events were lost; rescanning %s.", self.root)
        self.rescan()

    # --- persistence ---------------------------------------------------------------------------
    def _load(self) -> bool:
        if self._folder is None:
            return False
        try:
            saved = self._folder.load()
        except OSError as err:  # read-only, or its lock is another user's: index in memory, never save
            log.warning("Cannot use the index folder %s (%s); indexing %s in memory only.",
                        self._folder.folder, err, self.root)
            self.save_error, self._folder = str(err), None
            return False
        if saved is None:
            return False
        installed = self.datastore.install(saved.segments)
        present = set(self.datastore.doc_ids())
        self._files = KnownPaths((p, s) for p, s in saved.files.items() if p in present)
        self._skipped = KnownPaths(saved.skipped)
        self._saved_names = self._own_names(installed)
        return True

    def _own_names(self, segments: Sequence) -> frozenset[str]:
        files = self._files
        return frozenset(s.name for s in segments if any(s.live[i] and d in files for i, d in enumerate(s.doc_ids)))

    def _save(self) -> None:
        if self._folder is None:
            return
        files = dict(self._files)
        segments = self.datastore.segments()
        try:
            self._folder.save(segments, files.__contains__, files, dict(self._skipped))
        except OSError as err:
            # Stay dirty: the next change (or stop) tries again. Watching goes on either way.
            if self.save_error is None:
                log.warning("Could not save the index of %s to %s (%s); it is kept in memory.",
                            self.root, self._folder.folder, err)
            self.save_error = str(err)
            return
        self.save_error = None
        self._dirty = False
        self._saved_names = self._own_names(segments)
