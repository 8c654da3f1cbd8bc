"""Background work yields the CPU to completions.

Indexing the workspace, re-tokenizing an open buffer after an edit and merging the datastore's segments run beside
decoding. On a machine with few cores each of them takes a core from the decoder's threads while it runs (an open
buffer re-tokenized after every edit slows every decoding step beside it: docs/LOG.md). Their threads
run at a lower priority: they still get every idle moment, and a completion is never kept waiting by them.
Tokenizing itself runs on the tokenizers library's own thread pool, at the priority of the thread that started
that pool (in the server usually the indexer's): this module does not reach it.

A second cost needs no CPU at all. libgomp (the OpenMP runtime of torch's CPU build, which the suffix sorting of
pydivsufsort binds to as well) keeps a team of worker threads for every thread that ever ran a parallel region,
for as long as that thread lives. Once it manages more threads than there are cores, it stops spin-waiting
between regions: the decoder's workers then sleep and are woken for each of the hundreds of small ops of a
step. On 2 cores one long-lived thread that had sorted a suffix array once (the datastore's merge thread, the
open-buffer feed) made every later decoding step much slower, though it never ran again, until that thread
ended (docs/LOG.md, 2026-12-01). So the datastore's OpenMP work
runs with one thread (`one_openmp_thread`), and a thread that ran torch, such as the model loader, ends instead
of going on to other work.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from typing import Iterator

from threadpoolctl import ThreadpoolController

log = logging.getLogger(__name__)

BACKGROUND_NICE = 10  # added niceness: under contention such a thread gets about a tenth of a normal one's CPU


def lower_this_thread() -> bool:
    """Run the calling thread BACKGROUND_NICE below the process's priority (Linux, where priority is per thread;
    threads it starts later inherit it), whichever thread started it. Never the main thread. False where it was not
    done."""
    if not sys.platform.startswith("linux") or threading.current_thread() is threading.main_thread():
        return False
    try:
        tid = threading.get_native_id()
        target = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + BACKGROUND_NICE)  # the main thread's, + 10
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except OSError as err:  # a sandbox that forbids it: the work runs as before
        log.debug("could not lower the priority of %s: %s", threading.current_thread().name, err)
        return False
    return True


@functools.lru_cache(maxsize=2)
def _openmp(torch_loaded: bool) -> ThreadpoolController:
    # the OpenMP runtimes loaded now; torch brings its own, so the list is taken again once it is loaded
    return ThreadpoolController().select(user_api="openmp")


@contextlib.contextmanager
def one_openmp_thread() -> Iterator[None]:
    """Within this block the calling thread's OpenMP regions run on that thread alone (OpenMP's thread count is
    per thread: other threads, the decoder's included, keep theirs), so it never gets a team of workers that
    would outlive the block (see the module's doc)."""
    with _openmp("torch" in sys.modules).limit(limits=1):
        yield
