"""Disk changes below a root, debounced into batches of paths.

watchdog's inotify observer, recursive; if the kernel refuses more watches we fall back to polling.
Editors save atomically (a temp file moved onto the target), so both ends of a move are reported.
When the kernel's event queue overflows, events were lost: watchdog only logs it, so we listen to that
log record and ask for a full reconciliation instead of a path batch.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

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


class _OverflowListener(logging.Handler):
    def __init__(self, watcher: "DebouncedWatcher"):
        super().__init__(logging.WARNING)
        self._watcher = watcher

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in str(record.msg).lower():
            self._watcher.request_rescan()


class DebouncedWatcher:
    """Calls `on_paths(paths)` once a burst of events has been quiet for `debounce_s` (at most
    `max_delay_s` after its first event), and `on_rescan()` after lost events; both on one thread."""

    def __init__(self, root: Path, on_paths: Callable[[set[str]], None], on_rescan: Callable[[], None],
                 *, debounce_s: float = 0.05, max_delay_s: float = 0.2,
                 on_idle: Callable[[], None] | None = None, idle_s: float = 2.0, polling: bool = False):
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
        self._stopping = False
        self._idle_due: float | None = None
        self._observer = None
        self._polling = polling
        self._listener = _OverflowListener(self)
        self._thread = threading.Thread(target=self._run, name="workspace-watcher", daemon=True)

    @property
    def polling(self) -> bool:
        return self._polling

    def start(self) -> None:
        self._observer = self._start_observer()
        for name in _OVERFLOW_LOGGERS:
            logging.getLogger(name).addHandler(self._listener)
        self._thread.start()

    def _start_observer(self):
        if not self._polling:
            observer = Observer()
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
        observer = PollingObserver(timeout=1.0)
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

    def request_rescan(self) -> None:
        with self._cond:
            self._rescan = True
            self._cond.notify()

    def stop(self) -> None:
        for name in _OVERFLOW_LOGGERS:
            logging.getLogger(name).removeHandler(self._listener)
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
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
