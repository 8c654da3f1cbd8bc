"""Disk changes below a root, debounced into batches of paths.

watchdog's inotify observer, recursive; if the kernel refuses more watches we fall back to polling.
Editors save atomically (a temp file moved onto the target), so both ends of a move are reported.
When the kernel's event queue overflows, events were lost and we ask for a full reconciliation instead
of a path batch. watchdog tells its own watch group, not the handlers, so we hook that group's overflow
callback (whatever the log level); its log record is watched as well, in case the hook cannot be set.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserverVFS

from ..priority import lower_this_thread

log = logging.getLogger(__name__)

_RELEVANT = {"created", "modified", "deleted", "moved", "closed"}
_OVERFLOW_LOGGERS = ("watchdog.observers.inotify_c", "watchdog.observers.inotify")


class _Collector(FileSystemEventHandler):
    def __init__(self, watcher: "DebouncedWatcher"):
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in _RELEVANT:
            return
        paths = [_str(event.src_path)]
        if event.event_type == "moved":
            paths.append(_str(event.dest_path))
        self._watcher.add(paths)


class _OverflowLogTap(logging.Filter):
    """Sees watchdog's overflow warning at any log level, and lets through only what the level lets through.

    A logger drops a record below its level before any filter runs, so while a tap is installed the logger's
    level is WARNING at most; this filter then hides what the level the user chose would have hidden.
    """

    _lock = threading.Lock()
    _watchers: list["DebouncedWatcher"] = []
    _saved_levels: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and "overflow" in str(record.msg).lower():
            with self._lock:
                watchers = list(self._watchers)
            for w in watchers:
                w.request_rescan()
        logger = logging.getLogger(record.name)
        level = self._saved_levels.get(record.name, logging.NOTSET) or (
            logger.parent.getEffectiveLevel() if logger.parent else logging.WARNING)
        return record.levelno >= level

    @classmethod
    def attach(cls, watcher: "DebouncedWatcher") -> None:
        with cls._lock:
            cls._watchers.append(watcher)
            if len(cls._watchers) > 1:
                return
            for name in _OVERFLOW_LOGGERS:
                logger = logging.getLogger(name)
                cls._saved_levels[name] = logger.level
                if logger.getEffectiveLevel() > logging.WARNING:
                    logger.setLevel(logging.WARNING)
                logger.addFilter(_TAP)

    @classmethod
    def detach(cls, watcher: "DebouncedWatcher") -> None:
        with cls._lock:
            if watcher in cls._watchers:
                cls._watchers.remove(watcher)
            if cls._watchers:
                return
            for name in _OVERFLOW_LOGGERS:
                logger = logging.getLogger(name)
                logger.removeFilter(_TAP)
                logger.setLevel(cls._saved_levels.pop(name, logging.NOTSET))


_TAP = _OverflowLogTap()


def _inotify_observer(on_overflow: Callable[[], None]):
    """watchdog's inotify observer, with `on_overflow` called when the kernel drops events.

    Relies on watchdog 7's InotifyEmitter building an InotifyWatchGroup (`_inotify`) whose
    `on_queue_overflow` the inotify reader calls; if that ever changes, the log tap still sees the overflow.
    """
    observer = Observer()
    try:
        from watchdog.observers.inotify import InotifyEmitter
    except ImportError:
        return observer
    if getattr(observer, "_emitter_class", None) is not InotifyEmitter:
        return observer

    class Emitter(InotifyEmitter):
        def on_thread_start(self) -> None:
            super().on_thread_start()
            group = getattr(self, "_inotify", None)
            rebuild = getattr(group, "on_queue_overflow", None)
            if rebuild is None:
                return

            def overflowed() -> None:
                try:
                    rebuild()         # watchdog rebuilds its recursive watches
                finally:
                    on_overflow()

            group.on_queue_overflow = overflowed

    observer._emitter_class = Emitter
    return observer


class DebouncedWatcher:
    """Calls `on_paths(paths)` once a burst of events has been quiet for `debounce_s` (at most
    `max_delay_s` after its first event), and `on_rescan()` after lost events; all on one thread, which
    first calls `on_start()`, so that events during that call are not lost."""

    def __init__(self, root: Path, on_paths: Callable[[set[str]], None], on_rescan: Callable[[], None],
                 *, debounce_s: float = 0.05, max_delay_s: float = 0.2,
                 on_idle: Callable[[], None] | None = None, idle_s: float = 2.0, polling: bool = False,
                 skip_dir: Callable[[str], bool] | None = None, on_start: Callable[[], None] | None = None):
        self.root = root
        self._on_paths = on_paths
        self._on_rescan = on_rescan
        self._on_idle = on_idle
        self._idle_s = idle_s
        self._debounce_s = debounce_s
        self._max_delay_s = max_delay_s
        self._cond = threading.Condition()
        self._pending: set[str] = set()
        self._first = self._last = 0.0
        self._rescan = False
        self._on_start = on_start
        self._stopping = False
        self._skip_dir = skip_dir or (lambda path: False)
        self._idle_due: float | None = None
        self._observer = None
        self._polling = polling
        self._thread = threading.Thread(target=self._run, name="workspace-watcher", daemon=True)

    @property
    def polling(self) -> bool:
        return self._polling

    def start(self) -> None:
        _OverflowLogTap.attach(self)
        try:
            self._observer = self._start_observer()
        except BaseException:
            _OverflowLogTap.detach(self)
            raise
        self._thread.start()

    def _start_observer(self):
        if not self._polling:
            observer = _inotify_observer(self.request_rescan)
            try:
                observer.schedule(_Collector(self), str(self.root), recursive=True)
                observer.start()
                return observer
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EMFILE, errno.ENFILE):
                    raise
                log.warning("The system's file watch limit is reached (%s); watching %s by polling instead "
                            "(raise fs.inotify.max_user_watches for instant updates).", err, self.root)
                try:
                    observer.stop()
                except Exception:  # noqa: BLE001 - it may never have started
                    pass
                self._polling = True
        # Polling lists every folder each second: never the ignored ones, nor symlinks (lstat: not followed).
        observer = PollingObserverVFS(os.lstat, self._listdir, polling_interval=1.0)
        observer.schedule(_Collector(self), str(self.root), recursive=True)
        observer.start()
        return observer

    def add(self, paths: list[str]) -> None:
        now = time.monotonic()
        with self._cond:
            if not self._pending:
                self._first = now
            self._pending.update(paths)
            self._last = now
            self._cond.notify()

    def _listdir(self, path: str):
        return [e for e in os.scandir(path) if not (e.is_dir(follow_symlinks=False) and self._skip_dir(e.path))]

    def request_rescan(self) -> None:
        with self._cond:
            self._rescan = True
            self._cond.notify()

    def stop(self, join: bool = True) -> None:
        """Stop watching. With `join`, wait for a batch under way to finish; without, it is its last."""
        _OverflowLogTap.detach(self)
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if join and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        lower_this_thread()
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception:      # noqa: BLE001 - watching goes on
                log.exception("Catching up with the disk failed")
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    now = time.monotonic()
                    if self._rescan:
                        break
                    if self._pending:
                        due = min(self._last + self._debounce_s, self._first + self._max_delay_s)
                        if now >= due:
                            break
                        self._cond.wait(due - now)
                    elif self._idle_due is not None:
                        if now >= self._idle_due:
                            break
                        self._cond.wait(self._idle_due - now)
                    else:
                        self._cond.wait()
                rescan, self._rescan = self._rescan, False
                paths, self._pending = self._pending, set()
            try:
                if rescan:
                    self._on_rescan()
                elif paths:
                    self._on_paths(paths)
                else:
                    self._idle_due = None
                    if self._on_idle is not None:
                        self._on_idle()
                    continue
                self._idle_due = time.monotonic() + self._idle_s
            except Exception:      # one bad batch must not stop the watching
                log.exception("Updating the index from disk events failed")


def _str(path: str | bytes) -> str:
    return path.decode(errors="surrogateescape") if isinstance(path, bytes) else path
