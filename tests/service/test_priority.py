"""Background work (indexing, open buffers, datastore merges, the watcher) runs below the decoder's priority, and
leaves no OpenMP workers behind (which would make libgomp stop spin-waiting in the decoder's threads)."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from rest_lsp.service.completion import CompletionService
from rest_lsp.datastore import Datastore
from rest_lsp.priority import BACKGROUND_NICE, lower_this_thread
from rest_lsp.settings import Settings

procfs = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.getpriority(os.PRIO_PROCESS, os.getpid()) >= 19,
    reason="per-thread priority is Linux's, and a process at the lowest priority has none lower to give")


def _nice(thread: threading.Thread) -> int:
    return os.getpriority(os.PRIO_PROCESS, thread.native_id)


def _own_nice() -> int:
    """The calling thread's niceness."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@linux
def test_a_background_thread_is_lowered_and_the_main_thread_never():
    seen = {}

    def work():
        seen["before"] = _own_nice()
        seen["lowered"] = lower_this_thread()
        seen["after"] = _own_nice()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["lowered"] and seen["after"] == min(19, seen["before"] + BACKGROUND_NICE)
    main = _own_nice()
    assert lower_this_thread() is False and _own_nice() == main


@linux
def test_the_service_feeds_and_indexes_at_low_priority_and_decodes_at_normal(tiny_models, tmp_path):
    (tmp_path / "lib.py").write_text("def frobnicate_widget(count):\n    return count * 7\n")
    settings = Settings(model=str(tiny_models["random"]), max_new_tokens=4, debounce_ms=0,
                        cache_dir=str(tmp_path / "cache"))
    svc = CompletionService(settings)
    svc.start([tmp_path])
    try:
        assert svc.wait_ready(120), svc.load_error
        assert svc.wait_indexed(60)
        svc.open_buffer(str(tmp_path / "buf.py"), "x = 1\n")
        svc.submit("mem://d.py", "def f(x):\n    return ", len("def f(x):\n    return ")).future.result(60)
        threads = {t.name: t for t in threading.enumerate()}
        main = _own_nice()
        assert _nice(threads["rest-lsp-buffers"]) > main
        assert _nice(threads["workspace-watcher"]) > main
        assert _nice(threads["rest-lsp-decoder"]) == main  # completions keep the normal priority
    finally:
        svc.close()


@linux
def test_datastore_merges_run_at_low_priority():
    store = Datastore(merge_factor=2)
    seen = []
    real = store._merge_loop

    def loop():
        seen.append(_own_nice())
        real()
        seen.append(_own_nice())

    store._merge_loop = loop
    for i in range(4):
        store.put(f"d{i}", list(range(i, i + 50)))
    store.close()
    main = _own_nice()
    assert seen and seen[-1] > main


@linux
def test_a_thread_started_by_a_lowered_thread_ends_at_the_same_priority():
    seen = {}

    def inner():
        lower_this_thread()
        seen["inner"] = _own_nice()

    def outer():
        lower_this_thread()
        seen["outer"] = _own_nice()
        t = threading.Thread(target=inner)
        t.start()
        t.join()

    t = threading.Thread(target=outer)
    t.start()
    t.join()
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert seen["outer"] == seen["inner"] == min(19, base + BACKGROUND_NICE)  # not lowered twice


_LIVES_ON = """
import os, threading
import numpy as np
from rest_lsp.datastore.segment import build_segment

def threads():
    return len(os.listdir("/proc/self/task"))

docs = [("big", np.random.default_rng(0).integers(0, 40_000, 150_000).tolist(), 0)]
built, release = threading.Event(), threading.Event()

def work():
    build_segment(docs)
    built.set()
    release.wait(30)

before = threads()
t = threading.Thread(target=work)
t.start()
assert built.wait(60)
print(threads() - before)
release.set()
t.join()
"""


@procfs
def test_a_thread_that_built_a_segment_and_lives_on_keeps_no_openmp_workers():
    """The suffix sort of a large segment runs an OpenMP region; run by a thread with the default thread count it
    leaves that thread a team of workers for the rest of its life. Counted as threads of a fresh process: in the
    suite's own process, threads other tests left behind come and go while it counts."""
    done = subprocess.run([sys.executable, "-c", _LIVES_ON], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]  # the thread itself and nothing more


def test_indexing_runs_in_a_thread_of_its_own_not_in_the_loader(tiny_models, tmp_path):
    """The loader ran torch and keeps OpenMP workers while it lives: it ends once the model is loaded."""
    (tmp_path / "lib.py").write_text("def frobnicate_widget(count):\n    return count * 7\n")
    svc = CompletionService(Settings(model=str(tiny_models["random"]), cache_dir=str(tmp_path / "cache")))
    seen = []
    real = svc._feed.index_roots

    def index_roots():
        seen.append(threading.current_thread().name)
        real()

    svc._feed.index_roots = index_roots
    svc.start([tmp_path])
    try:
        assert svc.wait_ready(120), svc.load_error
        assert svc.wait_indexed(60)
        assert seen == ["rest-lsp-indexer"]
    finally:
        svc.close()
