"""The typing storm (benchmarks/bench_typing_storm.py), shortened: a few seconds of 20 keystrokes a second through
the real server over stdio, on a tiny random model, and the storm's pure parts."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

from lsprotocol import types

# benchmarks/ is no installed package: import it from this checkout whatever the working directory
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_replay import find_functions  # noqa: E402
from benchmarks.bench_typing_storm import (  # noqa: E402
    DEFAULT_FILE, Request, _wait_idle, body_keystrokes, choose, failures, keystroke_times, plan, run, stale_replies)
from benchmarks.lsp_client import Pending  # noqa: E402


SOURCE = '''import os


def first(a):
    x = a + 1

    return x


class Box:
    def size(self):
        if self.items:
            return len(self.items)
        return 0
'''


def test_keystrokes_type_the_bodies_back():
    functions = find_functions(SOURCE)
    opened, keys = plan(SOURCE, functions, 10_000)
    assert "x = a + 1" not in opened and "return len" not in opened
    text = opened
    for key in keys:
        text = text[:key.offset] + key.text + text[key.offset:]
    assert text == SOURCE
    # Enter brings the next line's indentation (auto-indent); everything else is one character
    assert "\n            " in [k.text for k in keys]
    assert all(len(k.text) == 1 or k.text.startswith("\n") for k in keys)


def test_keystrokes_stop_at_the_limit_and_enough_are_chosen():
    assert len(plan(SOURCE, find_functions(SOURCE), 7)[1]) == 7
    assert body_keystrokes("a\n    b") == ["a", "\n    ", "b"]
    text = DEFAULT_FILE.read_text()
    assert len(plan(text, choose(text, 1200, seed=0), 1200)[1]) == 1200


def test_keystroke_gaps_vary_within_the_jitter_around_the_rate():
    times = keystroke_times(1000, rate=20, jitter=0.8, seed=0)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0 and len(times) == 1000
    assert all(0.01 - 1e-9 <= g <= 0.09 + 1e-9 for g in gaps)
    assert min(gaps) < 0.02 and max(gaps) > 0.08 and abs(sum(gaps) / len(gaps) - 0.05) < 0.003
    assert keystroke_times(5, rate=10, jitter=0, seed=3) == [0.0, 0.1, 0.2, 0.30000000000000004, 0.4]
    assert keystroke_times(50, 20, 0.8, seed=1) == keystroke_times(50, 20, 0.8, seed=1)


def _replied(arrivals, result=None, error_code=None) -> Pending:
    future: Future = Future()
    pending = Pending("x", future, arrivals)
    if error_code is None:
        future.set_result(result)
    else:
        err = Exception("error")
        err.code = error_code
        future.set_exception(err)
    return pending


def _request(version: int, reply: Pending, fence: Pending, before="ab") -> Request:
    return Request(version, before, types.Position(0, len(before)), reply, fence)


def test_a_reply_written_after_a_newer_version_was_taken_in_is_stale():
    arrivals = itertools.count()
    empty = types.InlineCompletionList(items=[])
    fence1 = _replied(arrivals, {})
    fence2 = _replied(arrivals, {})
    late = _replied(arrivals, empty)  # the answer to version 1, read after the fence behind version 2
    modified = _replied(arrivals, error_code=-32801)
    assert [s["version"] for s in stale_replies([_request(1, late, fence1), _request(2, modified, fence2)])] == [1]
    # the same answer read before that fence is not
    arrivals = itertools.count()
    fence1, early = _replied(arrivals, {}), _replied(arrivals, empty)
    fence2 = _replied(arrivals, {})
    assert stale_replies([_request(1, early, fence1), _request(2, modified, fence2)]) == []


def test_a_suggestion_must_fit_its_cursor_and_its_earlier_answers():
    arrivals = itertools.count()

    def item(text, at, cid):
        return types.InlineCompletionItem(insert_text=text, range=types.Range(at, at), command=types.Command(
            title="accept", command="rest-lsp.accept", arguments=[{"id": cid, "text": text}]))

    here, next_char = types.Position(0, 2), types.Position(0, 3)
    fence1 = _replied(arrivals, {})
    fits = _replied(arrivals, types.InlineCompletionList([item("cd", here, 1)]))
    assert stale_replies([_request(1, fits, fence1)]) == []
    elsewhere = _replied(arrivals, types.InlineCompletionList([item("cd", types.Position(0, 1), 1)]))
    assert stale_replies([_request(1, elsewhere, fence1)])
    # type-through: the same suggestion after "c" was typed must be its rest, "d", not "cd" again
    shown = _replied(arrivals, types.InlineCompletionList([item("cd", here, 7)]))
    fence2 = _replied(arrivals, {})  # read after the answer to version 1: that one is not late
    rest = _replied(arrivals, types.InlineCompletionList([item("d", next_char, 7)]))
    again = _replied(arrivals, types.InlineCompletionList([item("cd", next_char, 7)]))
    assert stale_replies([_request(1, shown, fence1, "ab"), _request(2, rest, fence2, "abc")]) == []
    assert stale_replies([_request(1, shown, fence1, "ab"), _request(2, again, fence2, "abc")])


def test_idle_is_cpu_time_that_stops_growing():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert asyncio.run(_wait_idle(busy.pid, timeout_s=2)) is None
        assert asyncio.run(_wait_idle(asleep.pid, timeout_s=30)) is not None
    finally:
        for process in (busy, asleep):
            process.kill()
            process.wait()


# One new token, a short prompt and a fixed debounce of the mean gap between keystrokes, which vary from 10 to 90 ms:
# whatever the machine's speed, a keystroke that follows within 40 ms supersedes its request, and the answer to
# one that leaves the server more than 50 ms races the next keystroke's didChange, which is where a stale answer
# would slip through. (An adaptive debounce would follow the pace instead, and whether the requests get superseded
# would depend on how fast this machine answers the first few.)
RACING = ("--max-new-tokens", "1", "--debounce-ms", "50", "--debounce-max-ms", "50", "--context-tokens", "64")


def test_a_typing_storm_through_the_server(tiny_models):
    """20 keystrokes a second (10 to 90 ms apart) for 5 s into stdlib json/encoder.py, a request after each: no
    stale reply, the last request answered, and the server idle again once typing stopped (generous limits, no
    timing)."""
    summary = asyncio.run(run(DEFAULT_FILE, rate=20, seconds=5, model=str(tiny_models["random"]), warmup_s=2,
                              answer_timeout_s=120, idle_timeout_s=120, flags=RACING, jitter=0.8))
    replies = summary["replies"]
    assert summary["requests"] == 100 and replies["no reply"] == 0, replies
    assert replies["content modified"] + replies["request cancelled"] > 0, replies  # newer keystrokes won
    assert summary["stale"] == [], summary["stale"][:5]
    assert summary["last_request"] != "no reply" and not summary["last_request"].startswith("error")
    assert summary["idle_s_after_last_answer"] is not None, "the server kept using CPU for 120 s after typing"
    # a request superseded by typing is the normal case: its ContentModified is no error with a traceback
    assert summary["server_stderr_tracebacks"] == 0, f"{summary['server_stderr_tracebacks']} tracebacks logged"
    failed = failures(summary, rss_limit_mb=1e9, idle_limit_s=1e9)
    assert failed == [], failed
