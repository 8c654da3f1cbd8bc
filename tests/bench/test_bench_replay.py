"""The replay benchmark's pure parts: which functions, what the person writes where, how answers are scored.

No server here: the benchmark itself drives the real one.
"""

from __future__ import annotations

import random
import statistics
import sys
import textwrap
from pathlib import Path

import pytest

# benchmarks/ is no installed package: import it from this checkout whatever the working directory
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_replay import (  # noqa: E402
    Function,
    choose_functions,
    add_summary,
    compare,
    cpu_seconds,
    decode_rates,
    decoded_by_both,
    find_functions,
    first_line_matches,
    parse_args,
    percentile,
    plan_episode,
    server_flags,
    settle,
    split_lines,
    summarize,
    table,
    without_bodies,
)

SOURCE = textwrap.dedent('''\
    import os


    def one_liner(): return 1


    class Box:
        """A box."""

        def __init__(self, size,
                     # the colour too
                     colour=None):
            # remember them

            self.size = size
            if colour:
                self.colour = colour

        async def fetch(self):
            return await self.size


    def outer(x):
        def inner(y):
            z = y + 1
            return z
        return inner(x)
    ''')


def apply_insert(text: str, line: int, character: int, insert: str) -> str:
    lines = split_lines(text)
    offset = sum(len(x) for x in lines[:line]) + character
    return text[:offset] + insert + text[offset:]


def line_text(text: str, line: int) -> str:
    return split_lines(text)[line].rstrip("\n")


def test_finds_functions_methods_and_nested_ones_with_their_body_lines():
    found = {f.name: f for f in find_functions(SOURCE)}
    assert set(found) == {"Box.__init__", "Box.fetch", "outer", "outer.inner"}  # not the one-liner
    lines = split_lines(SOURCE)
    init = found["Box.__init__"]
    # the body starts right after the multi-line header, its comment and blank line included
    assert lines[init.body_start - 1].strip() == "colour=None):"
    assert lines[init.body_start].strip() == "# remember them"
    assert lines[init.body_end - 1].strip() == "self.colour = colour"
    assert [lines[i].strip() for i in range(found["outer"].body_start, found["outer"].body_end)] == [
        "def inner(y):", "z = y + 1", "return z", "return inner(x)"]


def test_split_lines_breaks_at_newlines_only():
    assert split_lines("a\x0cb\nc") == ["a\x0cb\n", "c"]  # a form feed is no line break for ast or LSP


def test_writing_every_step_rebuilds_the_file_and_each_request_sits_after_the_indentation():
    fn = next(f for f in find_functions(SOURCE) if f.name == "Box.__init__")
    episode = plan_episode(SOURCE, fn, max_lines=100, rng=random.Random(0))
    truth = split_lines(SOURCE)
    # the opened buffer holds none of the body: the cursor line is the first comment's indentation alone
    assert "self.size = size" not in episode.opened and "remember" not in episode.opened
    assert [s.rest for s in episode.steps] == [
        "# remember them", "self.size = size", "if colour:", "self.colour = colour"]  # blank lines: no request
    text = episode.opened
    for step in episode.steps:
        # the cursor line holds exactly the indentation, as an editor auto-indents it
        assert line_text(text, step.line) == step.indent
        assert truth[step.line].rstrip("\n") == step.indent + step.rest
        text = apply_insert(text, step.line, len(step.indent), step.rest + step.after)
    assert text == SOURCE


def test_max_lines_stops_early_and_the_typed_prefix_leaves_something_to_suggest():
    fn = next(f for f in find_functions(SOURCE) if f.name == "Box.__init__")
    episode = plan_episode(SOURCE, fn, max_lines=2, rng=random.Random(3))
    assert [s.rest for s in episode.steps] == ["# remember them", "self.size = size"]
    assert episode.steps[-1].after == ""
    text = episode.opened
    for step in episode.steps:
        text = apply_insert(text, step.line, len(step.indent), step.rest + step.after)
    assert "self.size = size\n\n\nclass" not in text and "self.size = size\n\n    async def fetch" in text
    for step in episode.steps:
        assert 1 <= step.typed_chars <= 3 and step.typed_chars < len(step.rest)
    short = plan_episode("def f():\n    x\n    y\n", Function("f", 1, 3), 10, random.Random(0))
    assert [s.typed_chars for s in short.steps] == [0, 0]  # one character: nothing left to type and ask for


def test_without_bodies_removes_each_chosen_body_and_keeps_the_rest():
    fns = [f for f in find_functions(SOURCE) if f.name in ("Box.fetch", "outer.inner")]
    text = without_bodies(SOURCE, fns)
    assert "await self.size" not in text and "z = y + 1" not in text
    assert "self.colour = colour" in text and "return inner(x)" in text


def test_choose_functions_is_seeded_spread_over_files_and_never_nested():
    files = {"a.py": SOURCE, "b.py": "def g():\n    a = 1\n    return a\n"}
    first = choose_functions(files, 3, random.Random(7))
    assert first == choose_functions(files, 3, random.Random(7))
    assert {name for name, _ in first[:2]} == {"a.py", "b.py"}  # one per file before a second from any
    everything = choose_functions(files, 99, random.Random(1))
    names = {(name, fn.name) for name, fn in everything}
    assert ("a.py", "outer") in names or ("a.py", "outer.inner") in names
    assert not {("a.py", "outer"), ("a.py", "outer.inner")} <= names  # one inside the other: only one of them
    assert all(fn.body_end - fn.body_start >= 2 for _, fn in everything)


@pytest.mark.parametrize("suggestion, expected, match", [
    ("self.size = size\n        self.x = 1", "self.size = size", True),
    ("self.size = size  ", "self.size = size", True),
    ("self.size = sizes", "self.size = size", False),
    ("", "self.size = size", False),
    ("\nself.size = size", "self.size = size", False),
    ("", "", False),
])
def test_first_line_match(suggestion, expected, match):
    assert first_line_matches(suggestion, expected) is match


def test_percentile_interpolates_between_ranks_like_numpy():
    assert percentile([], 50) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([1, 2, 3], 100) == 3


def record(config: str, step: int, text: str, **counters) -> dict:
    return {"config": config, "corpus": "json", "mode": "line", "file": "tool.py", "function": "main",
            "step": step, "kind": "line-start", "line": 20 + step, "text": text, **counters}


def test_decode_rates_sum_the_counter_deltas_of_the_requests_when_the_server_has_counters():
    records = [record("rest", 0, "a", generated_tokens=30, decode_steps=10, decode_ms=600.0),
               record("rest", 1, "b", generated_tokens=10, decode_steps=10, decode_ms=400.0)]
    rates = decode_rates(records, processes=[])
    assert rates["tokens_per_step"] == 2.0 and rates["ms_per_token"] == 25.0  # ratios of sums, not mean ratios
    assert "deltas" in rates["source"]


def test_decode_rates_fall_back_to_the_processes_running_means_and_say_so():
    processes = [{"final_stats": {"mean_tokens_per_step": 2.0, "mean_ms_per_token": 50.0, "completions_decoded": 3}},
                 {"final_stats": {"mean_tokens_per_step": 1.0, "mean_ms_per_token": 90.0, "completions_decoded": 1}},
                 {"final_stats": {"mean_tokens_per_step": None, "mean_ms_per_token": None, "completions_decoded": 0}}]
    rates = decode_rates([record("rest", 0, "a")], processes)
    assert rates["tokens_per_step"] == pytest.approx(1.75) and rates["ms_per_token"] == pytest.approx(60.0)
    assert "warm-up included" in rates["source"]
    assert decode_rates([record("rest", 0, "a")], processes[2:])["tokens_per_step"] is None


def test_compare_lists_every_request_whose_suggestion_differs_between_configurations():
    records = [record("rest", 0, "x = 1"), record("rest", 1, "y"), record("plain", 0, "x = 1"), record("plain", 1, "z")]
    same = compare(records, ["rest", "plain"])["line"]
    assert same["same_requests"] and same["compared"] == 2
    assert [(m["line"], m["rest"], m["plain"]) for m in same["mismatches"]] == [(21, "y", "z")]
    assert not compare(records[:3], ["rest", "plain"])["line"]["same_requests"]
    assert compare(records, []) == {}  # llama-server alone: no rest-lsp configuration to compare


def test_a_suggestion_cut_at_a_line_end_is_told_apart_from_a_mismatch():
    records = [record("rest", 0, "a = 1\n    b = 2"), record("rest", 1, "c = 3\n    d"),
               record("plain", 0, "a = 1"), record("plain", 1, "c = 3 + 1")]
    same = compare(records, ["rest", "plain"])["line"]
    assert [m["plain"] for m in same["cut_at_a_line_end"]] == ["a = 1"]  # the time budget stopped plain there
    assert [m["plain"] for m in same["mismatches"]] == ["c = 3 + 1"]  # a prefix, but not at a line end


def test_the_table_has_each_mode_the_ratios_the_plain_step_and_the_mismatches():
    requests = []
    for mode in ("line", "typed"):
        for config, ms, tokens, steps, text in (("rest", 400.0, 30, 10, "y"), ("plain", 800.0, 10, 10, "z")):
            for step in range(3):
                r = record(config, step, text if step == 2 else "x = 1", generated_tokens=tokens,
                           decode_steps=steps, decode_ms=tokens * (20.0 if config == "rest" else 40.0))
                r.update(mode=mode, ms=ms + step, first_after_open=step == 0, answer="model",
                         first_line_match=step == 1)
                requests.append(r)
    results = {"requests": requests, "processes": [], "modes": ["line", "typed"], "functions_per_corpus": 1,
               "max_lines": 3, "plans": [{"corpus": "/x/json"}], "seed": 0, "pause_ms": 0, "max_new_tokens": 8,
               "model": "m", "driver": "d", "load_average_before_after": [0, 0], "cpu_count": 2}
    add_summary(results, ["rest", "plain"])
    rest = results["summary"]["typed"]["rest"]
    assert rest["p50_ms"] == 401.5 and rest["first_after_open_median_ms"] == 400.0
    assert rest["tokens_per_step"] == 3.0 and rest["plain_step_ms"] == 40.0 and rest["p50_plain_steps"] == 401.5 / 40
    out = table(results, ["rest", "plain"])
    assert "| line mode | rest | plain | rest/plain |" in out and "| typed mode |" in out
    assert "| tokens/step | 3.00 | 1.00 | 3.00x |" in out and "| ms/token | 20.0 | 40.0 | 0.50x |" in out
    assert "| ms/token, median of the decoded requests | 20.0 | 40.0 | 0.50x |" in out
    assert "p50 latency, ms (plain steps) | 402 (10.0) | 802 (20.0) | 0.50x |" in out
    assert "Plain decoding step in this run (ms/token of the plain server): 40.0 ms." in out
    assert out.count(", 1 mismatches.") == 2 and "mismatch json/tool.py:22 (line-start): rest='y'  vs  plain='z'" in out
    assert out.count("Requests decoded by both rest and plain (3): REST's decode time over plain's, median 1.50x, "
                     "summed 1.50x.") == 2


def test_a_table_of_llama_server_alone_has_no_comparison_of_suggestions():
    requests = []
    for step in range(3):
        r = record("llama-server", step, "x = 1", prompt_n=100)
        r.update(ms=1000.0 + step, first_after_open=step == 0, answer="model", first_line_match=False)
        requests.append(r)
    results = {"requests": requests, "processes": [], "modes": ["line"], "functions_per_corpus": 1,
               "max_lines": 3, "plans": [{"corpus": "/x/json"}], "seed": 0, "pause_ms": 0, "max_new_tokens": 8,
               "model": "m", "driver": "d", "load_average_before_after": [0, 0], "cpu_count": 2}
    add_summary(results, ["llama-server"])
    out = table(results, ["llama-server"])
    assert "| line mode | llama-server |" in out and "Identical suggestions" not in out


def test_the_median_ms_per_token_is_of_the_requests_own_rates():
    """One request decoded while the server computed other prompts beside it sets the ratio of sums, not the
    median; a request answered without decoding is left out."""
    decoded = [record("llama-server", i, "x", generated_tokens=10, decode_steps=10, decode_ms=ms)
               for i, ms in enumerate((200.0, 240.0, 5000.0))]
    records = decoded + [record("llama-server", 3, "y", generated_tokens=0, decode_steps=0, decode_ms=0.0)]
    for r in records:
        r.update(ms=1.0, first_after_open=False, answer="model", first_line_match=False)
    s = summarize(records, [])
    assert s["ms_per_token"] == pytest.approx(5440 / 30) and s["ms_per_token_median"] == 24.0


def test_per_request_ratios_count_only_the_requests_both_decoded():
    """REST's decode time over plain's per request both decoded: a request one of them answered from a prefetch or
    a cache (no decode time) is left out, and the median is of the ratios, not a ratio of medians."""
    records = [record("rest", 0, "a", decode_ms=50.0), record("plain", 0, "a", decode_ms=100.0),
               record("rest", 1, "b", decode_ms=90.0), record("plain", 1, "b", decode_ms=100.0),
               record("rest", 2, "c", decode_ms=300.0), record("plain", 2, "c", decode_ms=200.0),
               record("rest", 3, "d", decode_ms=0.0), record("plain", 3, "d", decode_ms=100.0),
               record("rest", 4, "e", decode_ms=80.0), record("plain", 4, "e")]
    both = decoded_by_both(records, "line")
    assert both == {"requests": 3, "median": 0.9, "sum": pytest.approx(440 / 400)}
    assert decoded_by_both(records, "typed") is None


def test_the_median_of_enough_requests_comes_with_a_bootstrap_interval():
    """With MIN_FOR_INTERVAL requests or more both decoded, the median's 90% bootstrap interval: seeded (the same
    every time), around the median, within the ratios seen, narrower than their range, a point where every ratio is
    the same; the table prints it."""
    from benchmarks.bench_replay import MIN_FOR_INTERVAL, median_interval

    ratios = [0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.3, 2.0]
    lo, hi = median_interval(ratios)
    assert (lo, hi) == median_interval(ratios)
    assert 0.3 < lo < statistics.median(ratios) < hi < 2.0
    assert median_interval([0.8] * 9) == (0.8, 0.8)
    requests = []
    for i, ratio in enumerate(ratios[:MIN_FOR_INTERVAL]):
        for config, ms in (("rest", 100.0 * ratio), ("plain", 100.0)):
            r = record(config, i, "x = 1", generated_tokens=5, decode_steps=5, decode_ms=ms)
            r.update(ms=ms, first_after_open=i == 0, answer="model", first_line_match=False)
            requests.append(r)
    both = decoded_by_both(requests, "line")
    assert both["requests"] == MIN_FOR_INTERVAL
    assert both["median_interval"] == pytest.approx(median_interval(ratios[:MIN_FOR_INTERVAL]))
    assert "median_interval" not in decoded_by_both(requests[:-2], "line")  # one request fewer
    results = {"requests": requests, "processes": [], "modes": ["line"], "functions_per_corpus": 1,
               "max_lines": 3, "plans": [{"corpus": "/x/json"}], "seed": 0, "pause_ms": 0, "max_new_tokens": 8,
               "model": "m", "driver": "d", "load_average_before_after": [0, 0], "cpu_count": 2}
    add_summary(results, ["rest", "plain"])
    lo, hi = both["median_interval"]
    assert (f"REST's decode time over plain's, median {both['median']:.2f}x (90% bootstrap interval {lo:.2f}-"
            f"{hi:.2f}x), summed {both['sum']:.2f}x.") in table(results, ["rest", "plain"])


def test_a_turn_ends_once_the_servers_process_is_idle():
    """The configurations take turns; one's turn ends when its process stops using the CPU (work it computes
    ahead must not land in another's turn)."""
    import asyncio
    import os
    import subprocess
    import sys

    assert cpu_seconds(os.getpid()) > 0
    assert cpu_seconds(2**22 + 12345) is None  # no such process: unreadable, not an error
    busy = subprocess.Popen([sys.executable, "-c",
                             "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass\ntime.sleep(60)"])
    try:
        waited = asyncio.run(settle(busy.pid))
        assert 0.7 <= waited < 10
    finally:
        busy.kill()
        busy.wait()
    # a short pause (a debounce) between two bursts does not end the turn
    code = ("import time\ndef spin(s):\n    t = time.time()\n    while time.time() - t < s: pass\n"
            "spin(0.3)\ntime.sleep(0.3)\nspin(0.5)\ntime.sleep(60)")
    bursts = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert asyncio.run(settle(bursts.pid)) >= 1.1
    finally:
        bursts.kill()
        bursts.wait()


def test_prompt_tokens_per_answer_average_the_model_answers_from_either_servers_counters():
    from benchmarks.bench_replay import _per_answer

    ours = [{"answer": "model", "prefill_tokens": 30}, {"answer": "prefetch", "prefill_tokens": 10},
            {"answer": "cache", "prefill_tokens": 0}]
    theirs = [{"answer": "model", "prompt_n": 900}, {"answer": "model", "prompt_n": 100}, {"answer": "empty"}]
    assert _per_answer(ours) == 20 and _per_answer(theirs) == 500 and _per_answer([{"answer": "cache"}]) is None


def test_servers_start_cold_unless_served_before_keeps_their_cache_folders_between_runs(tmp_path):
    def cache_of(argv: list[str], work: Path) -> Path:
        flags = server_flags(parse_args(argv), "rest", "rest-line", work)
        return Path(flags[flags.index("--cache-dir") + 1])

    fresh = cache_of(["--corpus", str(tmp_path)], tmp_path / "run1")
    assert fresh == tmp_path / "run1" / "cache-rest-line"  # inside the run's own folder, removed with it
    kept = tmp_path / "kept"
    first = cache_of(["--corpus", str(tmp_path), "--served-before", str(kept)], tmp_path / "run1")
    second = cache_of(["--corpus", str(tmp_path), "--served-before", str(kept)], tmp_path / "run2")
    assert first == second == kept / "cache-rest-line"
    assert kept.is_dir() and kept.stat().st_mode & 0o077 == 0  # the servers' cache folders must be private
