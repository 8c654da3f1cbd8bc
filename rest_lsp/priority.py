"""Background work yields the CPU to completions.

Indexing the workspace, re-tokenizing an open buffer after an edit and merging the datastore's segments run beside
decoding. On a machine with few cores each of them takes a core from the decoder's threads while it runs (an open
buffer of 11k tokens re-tokenized every 300 ms made a plain decoding step 10% slower on 2 cores). Their threads
run at a lower priority: they still get every idle moment, and a completion is never kept waiting by them.
Tokenizing itself runs on the tokenizers library's own thread pool, at the priority of the thread that started
that pool (in the server usually the indexer's): this module does not reach it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

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
