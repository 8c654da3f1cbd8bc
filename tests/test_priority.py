"""Background work (indexing, open buffers, datastore merges, the watcher) runs below the decoder's priority."""

import os
import sys
import threading

import pytest
from conftest_server import tiny_models  # noqa: F401  (fixture)
from rest_lsp.completion import CompletionService
from rest_lsp.datastore import Datastore
from rest_lsp.priority import BACKGROUND_NICE, lower_this_thread
from rest_lsp.settings import Settings

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

