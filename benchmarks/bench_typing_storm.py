"""A typing storm through the real language server over stdio: a person types `--rate` keystrokes a second (each
gap within `--jitter` of the mean gap) for `--seconds` into a real source file, and the editor asks for an inline
completion after every keystroke.

The person: the bodies of a few functions of a real file (stdlib `json/encoder.py` by default; a seeded choice,
enough for the whole storm) are removed on disk and in the buffer, and typed back character by character, each
keystroke one incremental `didChange`; Enter also inserts the next line's indentation (an auto-indenting
editor). The editor: after each keystroke, `textDocument/inlineCompletion` at the cursor, as VS Code does; the
previous request, if still unanswered, is given up: `$/cancelRequest` for a seeded share of them (VS Code), left
to the server's ContentModified for the rest (a client that never cancels). After each `didChange` a
`rest-lsp.stats` request (answered at once, in order) marks in the reply stream where the server took in that
version.

The server: `python -m rest_lsp.cli --stdio`, default settings (the default model unless `--model`), with its
index in a temporary folder; the workspace is a temporary copy of the file's folder, bodies removed.

Checks (the table says each figure, and the exit status is 1 when one fails):
  - stale: no reply computed for an older version. A result (a suggestion or an empty list) for the request made
    at version V that arrives after the stats reply sent behind version V+1 or later was produced after the
    server took in the newer text (pygls reads each message in its own turns of the event loop, so a reply
    produced before that is written before the stats reply): stale. A suggestion must also fit its version:
    its range is the request's cursor, and two answers carrying the same suggestion id (type-through) extend
    the text before their cursors to the same text;
  - the last request gets an answer (a result, possibly empty; not an error, not a hang);
  - the server's resident memory (VmRSS, /proc/PID/status, sampled while the person types) grows by less than
    `--rss-limit-mb` after warm-up (the first `--warmup-s`);
  - the server is idle (its CPU time, /proc/PID/stat, stops growing for QUIET_S) within `--idle-limit-s` of the
    last answer. Whatever the server does in the background after typing stops (indexing the buffer, warming
    a prompt) counts in that time.

    .venv/bin/python benchmarks/bench_typing_storm.py [--rate 20] [--jitter 0.5] [--seconds 60] [--model M] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lsprotocol import types

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_replay import (  # noqa: E402
    Function, choose_functions, find_functions, prepare_workspace, split_lines)
from benchmarks.harness import STDLIB, percentile  # noqa: E402
from benchmarks.lsp_client import Pending, ServerSession, position_of, server_command  # noqa: E402

DEFAULT_FILE = STDLIB / "json" / "encoder.py"
CONTENT_MODIFIED, REQUEST_CANCELLED = -32801, -32800
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.2  # memory and CPU samples during the storm
POLL_S = 0.02  # CPU polls while waiting for idle
QUIET_S = 1.0  # idle: no CPU time for this long


# -- the person: pure functions ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Keystroke:
    offset: int  # character offset of the cursor in the text before this keystroke
    text: str  # what it inserts there


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


def body_keystrokes(body: str) -> list[str]:
    """The keystrokes that type `body` after its first line's indentation: one character each; Enter brings the
    next line's indentation with it, as an auto-indenting editor does."""
    keys, i = [], 0
    while i < len(body):
        if body[i] == "\n":
            j = i + 1
            while j < len(body) and body[j] in " \t":
                j += 1
            keys.append(body[i:j])
            i = j
        else:
            keys.append(body[i])
            i += 1
    return keys


def plan(text: str, functions: list[Function], limit: int) -> tuple[str, list[Keystroke]]:
    """The buffer as opened (each function's body replaced by its first line's indentation on an empty line) and
    up to `limit` keystrokes that type the bodies back, function after function in the file's order."""
    if not text.endswith("\n"):
        text += "\n"
    lines = split_lines(text)
    opened, typed = [], []  # typed: (cursor offset in `opened`, the body's keystrokes)
    at = 0
    for fn in sorted(functions, key=lambda f: f.body_start):
        opened += lines[at:fn.body_start]
        body = "".join(lines[fn.body_start:fn.body_end])
        indent = _indent(lines[fn.body_start])
        cursor = sum(map(len, opened)) + len(indent)
        opened.append(indent + "\n")
        typed.append((cursor, body_keystrokes(body[len(indent):-1])))
        at = fn.body_end
    opened += lines[at:]
    keys: list[Keystroke] = []
    shift = 0  # characters inserted before the next body's cursor
    for cursor, strokes in typed:
        offset = cursor + shift
        for s in strokes:
            if len(keys) == limit:
                return "".join(opened), keys
            keys.append(Keystroke(offset, s))
            offset += len(s)
            shift += len(s)
    return "".join(opened), keys


def choose(text: str, keys: int, seed: int) -> list[Function]:
    """Functions of `text` (a seeded choice, none inside another) whose bodies hold at least `keys` keystrokes."""
    rng = random.Random(seed)
    candidates = choose_functions({"file": text}, len(find_functions(text)), rng)
    chosen, total = [], 0
    for _, fn in candidates:
        if total >= keys:
            break
        chosen.append(fn)
        total += len(body_keystrokes("".join(split_lines(text)[fn.body_start:fn.body_end]).lstrip(" \t")[:-1]))
    if total < keys:
        raise SystemExit(f"bench_typing_storm: the function bodies of this file hold {total} keystrokes, "
                         f"fewer than the {keys} wanted; take a longer file or fewer --seconds.")
    return chosen


# -- the server's process, from outside ---------------------------------------------------------------------

def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_s(pid: int) -> float:
    """User + system CPU time of the process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14 and 15 of the line


# -- the storm --------------------------------------------------------------------------------------------------

@dataclass
class Request:
    version: int
    before: str  # the text before the cursor at that version
    position: types.Position
    reply: Pending
    fence: Pending  # the stats request sent right behind this version's didChange
    cancelled: bool = False  # $/cancelRequest sent


@dataclass
class Storm:
    requests: list[Request] = field(default_factory=list)
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # (s since start, RSS MB, CPU s)
    started: float = 0.0
    stopped: float = 0.0  # the last keystroke was sent
    last_answered: float | None = None
    cpu_at_stop: float = 0.0  # the server's CPU time (s) at the last keystroke
    cpu_at_answer: float | None = None  # and when the last answer arrived
    idle_at: float | None = None  # CPU time stopped growing (then stayed flat QUIET_S)


async def _sample(pid: int, storm: Storm, stop: asyncio.Event) -> None:
    while not stop.is_set():
        storm.samples.append((time.perf_counter() - storm.started, rss_mb(pid), cpu_s(pid)))
        try:
            await asyncio.wait_for(stop.wait(), SAMPLE_S)
        except asyncio.TimeoutError:
            pass


def keystroke_times(keys: int, rate: float, jitter: float, seed: int) -> list[float]:
    """When each keystroke is typed (s from the first): `rate` a second on average, each gap drawn uniformly within
    `jitter` of the mean gap (0: a metronome), seeded."""
    rng, mean = random.Random(seed), 1.0 / rate
    times = [0.0]
    for _ in range(keys - 1):
        times.append(times[-1] + mean * rng.uniform(1 - jitter, 1 + jitter))
    return times[:keys]


async def type_storm(session: ServerSession, uri: str, opened: str, keys: list[Keystroke], rate: float,
                     cancel_share: float, seed: int, answer_timeout_s: float, idle_timeout_s: float,
                     jitter: float = 0.0) -> Storm:
    """Open the buffer, type `keys` at `rate` a second (gaps within `jitter` of the mean) with a request after
    each, wait for the last answer, then for the server to go idle."""
    rng = random.Random(seed)
    times = keystroke_times(len(keys), rate, jitter, seed)
    storm, text = Storm(), opened
    pid = session.pid
    session.open(uri, opened)
    storm.started = time.perf_counter()
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(pid, storm, stop))
    try:
        for k, key in enumerate(keys):
            await asyncio.sleep(max(0.0, storm.started + times[k] - time.perf_counter()))
            session.insert(uri, position_of(text[:key.offset]), key.text)
            text = text[:key.offset] + key.text + text[key.offset:]
            fence = session.send_stats()
            if storm.requests and not storm.requests[-1].reply.future.done() and rng.random() < cancel_share:
                session.cancel_request(storm.requests[-1].reply)
                storm.requests[-1].cancelled = True
            before = text[:key.offset + len(key.text)]
            at = position_of(before)
            storm.requests.append(Request(session.version, before, at, session.send_inline(uri, at), fence))
        storm.stopped, storm.cpu_at_stop = time.perf_counter(), cpu_s(pid)
        last = storm.requests[-1].reply
        await asyncio.wait([asyncio.wrap_future(last.future)], timeout=answer_timeout_s)  # no cancel on timeout
        if not last.future.done():
            return storm  # no answer: the checks say so
        storm.last_answered, storm.cpu_at_answer = last.arrived, cpu_s(pid)
    finally:
        stop.set()
        await sampler
    storm.idle_at = await _wait_idle(pid, idle_timeout_s)
    storm.samples.append((time.perf_counter() - storm.started, rss_mb(pid), cpu_s(pid)))
    return storm


async def _wait_idle(pid: int, timeout_s: float) -> float | None:
    """When the process's CPU time last grew before it stayed flat for QUIET_S; None if it never did."""
    deadline = time.perf_counter() + timeout_s
    last, changed = cpu_s(pid), time.perf_counter()
    while time.perf_counter() < deadline:
        await asyncio.sleep(POLL_S)
        now, t = cpu_s(pid), time.perf_counter()
        if now != last:
            last, changed = now, t
        elif t - changed >= QUIET_S:
            return changed
    return None


# -- what it shows ----------------------------------------------------------------------------------------------

def _items(result) -> list:
    return list(getattr(result, "items", None) or [])


def _insert_text(item) -> str:
    text = item.insert_text
    return text if isinstance(text, str) else text.value


def _item_id(item):
    args = item.command.arguments if item.command else None
    return args[0].get("id") if args and isinstance(args[0], dict) else None


def stale_replies(requests: list[Request]) -> list[dict]:
    """The replies that do not fit their version (see the module's docstring), one record each."""
    stale = []
    fences = [r.fence.order for r in requests]  # fence i follows version of request i
    for i, r in enumerate(requests):
        if not r.reply.future.done():
            continue
        result, error = r.reply.outcome()
        if error is not None:
            continue
        later = [f for f in fences[i + 1:] if f is not None and f < r.reply.order]
        if later:
            stale.append({"version": r.version, "why": f"answered after the server took in version "
                          f"{requests[fences.index(later[-1])].version}", "items": len(_items(result))})
        for item in _items(result):
            rng = item.range
            if rng is not None and (rng.start != r.position or rng.end != r.position):
                stale.append({"version": r.version, "why": f"range {rng} is not the cursor {r.position}"})
    by_id: dict = {}
    for r in requests:
        if r.reply.future.done() and r.reply.outcome()[1] is None:
            for item in _items(r.reply.outcome()[0]):
                whole = r.before + _insert_text(item)
                first = by_id.setdefault(_item_id(item), (r.version, whole))
                if _item_id(item) is not None and first[1] != whole:
                    stale.append({"version": r.version, "why": f"suggestion {_item_id(item)} extends the text "
                                  f"differently from its answer at version {first[0]}"})
    return stale


def summarize(storm: Storm, warmup_s: float, keys: int, rate: float) -> dict:
    replies = {"suggestion": 0, "empty": 0, "content modified": 0, "request cancelled": 0, "other error": 0,
               "no reply": 0}
    for r in storm.requests:
        if not r.reply.future.done():
            replies["no reply"] += 1
            continue
        result, error = r.reply.outcome()
        if error is None:
            replies["suggestion" if _items(result) else "empty"] += 1
        else:
            replies[{CONTENT_MODIFIED: "content modified", REQUEST_CANCELLED: "request cancelled"}.get(
                error, "other error")] += 1
    last = storm.requests[-1].reply
    last_outcome = "no reply"
    if last.future.done():
        result, error = last.outcome()
        last_outcome = (f"error {error}" if error is not None else
                        f"{len(_items(result))} suggestion(s)" if _items(result) else "empty list")
    answered = [(r.reply.arrived - r.reply.sent) * 1e3 for r in storm.requests
                if r.reply.arrived is not None and r.reply.outcome()[1] is None]
    typing_s = storm.stopped - storm.started
    warm = [s for s in storm.samples if warmup_s <= s[0] <= typing_s]  # the storm after warm-up
    at_warm = warm[0][1] if warm else None
    answering = [s[1] for s in storm.samples if s[0] > typing_s]  # until the last answer, and the end
    return {
        "keystrokes": keys, "rate_per_s": rate, "typing_s": round(typing_s, 2),
        "achieved_rate_per_s": round((keys - 1) / typing_s, 2) if typing_s > 0 else None,
        "requests": len(storm.requests), "cancel_requests_sent": sum(r.cancelled for r in storm.requests),
        "replies": replies,
        "answered_ms_p50": percentile(answered, 50), "answered_ms_p95": percentile(answered, 95),
        "stale": stale_replies(storm.requests),
        "last_request": last_outcome,
        "last_answer_s_after_typing": (round(storm.last_answered - storm.stopped, 3)
                                       if storm.last_answered is not None else None),
        "server_cpu_s_answering_last": (round(storm.cpu_at_answer - storm.cpu_at_stop, 2)
                                        if storm.cpu_at_answer is not None else None),
        "rss_mb_start": round(storm.samples[0][1], 1) if storm.samples else None,
        "rss_mb_after_warmup": round(at_warm, 1) if at_warm is not None else None,
        "rss_mb_peak_after_warmup": round(max(s[1] for s in warm), 1) if warm else None,
        "rss_mb_typing_stopped": round(warm[-1][1], 1) if warm else None,
        "rss_mb_peak_answering_last": round(max(answering), 1) if answering else None,
        "rss_mb_end": round(storm.samples[-1][1], 1) if storm.samples else None,
        "rss_growth_mb": round(max(s[1] for s in warm) - at_warm, 1) if warm else None,
        "rss_mb_each_second": _each_second(storm.samples),
        "server_cpu_s_during_typing": round(_cpu_between(storm.samples, 0, typing_s), 2),
        "idle_s_after_last_answer": (round(max(0.0, storm.idle_at - storm.last_answered), 3)
                                     if storm.idle_at is not None and storm.last_answered is not None else None),
        "idle_s_after_typing": round(storm.idle_at - storm.stopped, 3) if storm.idle_at is not None else None,
    }


def _each_second(samples) -> list[float]:
    """RSS (MB) at each whole second, for the JSON."""
    out = []
    for t, rss, _ in samples:
        if t >= len(out):
            out.append(round(rss, 1))
    return out


def _cpu_between(samples, t0: float, t1: float) -> float:
    inside = [s for s in samples if t0 <= s[0] <= t1]
    return inside[-1][2] - inside[0][2] if len(inside) > 1 else 0.0


def failures(summary: dict, rss_limit_mb: float, idle_limit_s: float) -> list[str]:
    """One sentence per failed check."""
    failed = []
    if summary["stale"]:
        failed.append(f"{len(summary['stale'])} stale replies, e.g. version {summary['stale'][0]['version']}: "
                      f"{summary['stale'][0]['why']}.")
    if summary["last_request"] == "no reply" or summary["last_request"].startswith("error"):
        failed.append(f"the last request got {summary['last_request']}.")
    if summary["rss_growth_mb"] is None:
        failed.append("no memory sample after warm-up (a storm shorter than --warmup-s).")
    elif summary["rss_growth_mb"] >= rss_limit_mb:
        failed.append(f"resident memory grew {summary['rss_growth_mb']} MB after warm-up (limit {rss_limit_mb}).")
    idle = summary["idle_s_after_last_answer"]
    if idle is None:
        failed.append("no time to idle: the server never went idle after the last answer, or there was none.")
    elif idle > idle_limit_s:
        failed.append(f"the server went idle {idle} s after the last answer (limit {idle_limit_s}).")
    return failed


def table(summary: dict, failed: list[str], rss_limit_mb: float, idle_limit_s: float) -> str:
    r = summary["replies"]

    def ok(good: bool) -> str:
        return "ok" if good else "FAIL"

    def num(x, unit="") -> str:
        return "-" if x is None else f"{x:.0f}{unit}" if isinstance(x, float) and unit == " ms" else f"{x}{unit}"

    rows = [
        ("keystrokes (rate asked / achieved per s)",
         f"{summary['keystrokes']} ({summary['rate_per_s']} / {summary['achieved_rate_per_s']})", ""),
        ("requests ($/cancelRequest sent)", f"{summary['requests']} ({summary['cancel_requests_sent']})", ""),
        ("replies: suggestion / empty", f"{r['suggestion']} / {r['empty']}", ""),
        ("replies: ContentModified / RequestCancelled / other error / none",
         f"{r['content modified']} / {r['request cancelled']} / {r['other error']} / {r['no reply']}", ""),
        ("answered requests, p50 / p95 ms",
         f"{num(summary['answered_ms_p50'], ' ms')} / {num(summary['answered_ms_p95'], ' ms')}", ""),
        ("stale replies", str(len(summary["stale"])), ok(not summary["stale"])),
        ("last request", summary["last_request"],
         ok(summary["last_request"] != "no reply" and not summary["last_request"].startswith("error"))),
        ("last answer, s after the last keystroke (server CPU s meanwhile)",
         f"{num(summary['last_answer_s_after_typing'])} ({num(summary['server_cpu_s_answering_last'])})", ""),
        ("RSS MB: start / after warm-up / peak after / typing stopped",
         f"{summary['rss_mb_start']} / {summary['rss_mb_after_warmup']} / {summary['rss_mb_peak_after_warmup']}"
         f" / {summary['rss_mb_typing_stopped']}", ""),
        ("RSS MB: peak while answering the last request / end",
         f"{summary['rss_mb_peak_answering_last']} / {summary['rss_mb_end']}", ""),
        (f"RSS growth after warm-up, MB (limit {rss_limit_mb})", num(summary["rss_growth_mb"]),
         ok(summary["rss_growth_mb"] is not None and summary["rss_growth_mb"] < rss_limit_mb)),
        ("server CPU s while typing", num(summary["server_cpu_s_during_typing"]), ""),
        ("server stderr: bytes (tracebacks)",
         f"{summary.get('server_stderr_bytes')} ({summary.get('server_stderr_tracebacks')})", ""),
        (f"idle, s after the last answer (limit {idle_limit_s})", num(summary["idle_s_after_last_answer"]),
         ok(summary["idle_s_after_last_answer"] is not None and summary["idle_s_after_last_answer"] <= idle_limit_s)),
        ("idle, s after the last keystroke", num(summary["idle_s_after_typing"]), ""),
    ]
    width = max(len(name) for name, _, _ in rows)
    out = [f"{name:<{width}}  {value:<28} {check}" for name, value, check in rows]
    out += [f"FAILED: {f}" for f in failed] or ["all checks passed"]
    return "\n".join(out)


# -- the run ----------------------------------------------------------------------------------------------------

async def run(file: Path, rate: float, seconds: float, model: str | None = None, seed: int = 0,
              cancel_share: float = 0.5, warmup_s: float = 10.0, answer_timeout_s: float = 600,
              idle_timeout_s: float = 120, flags: tuple[str, ...] = (), jitter: float = 0.0) -> dict:
    """Start a server on a copy of `file`'s folder (the chosen bodies removed), type the storm, stop the
    server; the summary (see `summarize`) plus what ran."""
    text = file.read_text(encoding="utf-8")
    keys_wanted = max(1, round(rate * seconds))
    functions = choose(text, keys_wanted, seed)
    opened, keys = plan(text, functions, keys_wanted)
    tmp = Path(tempfile.mkdtemp(prefix="rest-lsp-storm-"))
    try:
        root = tmp / file.parent.name
        prepare_workspace(file.parent, root, {file.name: text}, [(file.name, f) for f in functions])
        server_flags = ["--cache-dir", str(tmp / "cache"), *flags] + (["--model", model] if model else [])
        t0 = time.perf_counter()
        session = await ServerSession.start(server_command(*server_flags), root)
        try:
            await session.wait_indexed(1)
            ready_s = time.perf_counter() - t0
            storm = await type_storm(session, (root / file.name).as_uri(), opened, keys, rate, cancel_share,
                                     seed, answer_timeout_s, idle_timeout_s, jitter)
            summary = summarize(storm, warmup_s, len(keys), rate)
            summary["final_stats"] = await session.stats()
            summary["server_stderr_bytes"] = session.stderr_bytes
            summary["server_stderr_tracebacks"] = session.stderr_tracebacks
        except BaseException:
            sys.stderr.write(f"bench_typing_storm: the server's stderr (end):\n"
                             f"{session.stderr[-3000:].decode(errors='replace')}\n")
            raise
        finally:
            await session.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary.update({"file": str(file), "functions": [f.name for f in functions], "model": model or "default",
                    "server_flags": server_flags, "seed": seed, "cancel_share": cancel_share, "jitter": jitter,
                    "warmup_s": warmup_s, "server_ready_and_indexed_s": round(ready_s, 1),
                    "cpus_allowed": len(os.sched_getaffinity(0)), "load_average": os.getloadavg()[0]})
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20, help="keystrokes a second (default 20)")
    parser.add_argument("--seconds", type=float, default=60, help="how long the person types (default 60)")
    parser.add_argument("--model", default=None, help="default: the server's (the bundled default model)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON (the table goes to stderr)")
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE, help=f"the file typed (default {DEFAULT_FILE})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cancel-share", type=float, default=0.5,
                        help="share of superseded requests given up with $/cancelRequest (default 0.5)")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="each gap between keystrokes within this share of the mean gap, seeded (default 0: even)")
    parser.add_argument("--warmup-s", type=float, default=10, help="memory growth counts after this (default 10)")
    parser.add_argument("--rss-limit-mb", type=float, default=50)
    parser.add_argument("--idle-limit-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0 or not 0 <= args.cancel_share <= 1 or not 0 <= args.jitter < 1:
        parser.error("--rate and --seconds must be positive, --cancel-share from 0 to 1, --jitter from 0 to below 1.")
    if not args.file.is_file():
        parser.error(f"--file: not a file: {args.file}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(run(args.file.resolve(), args.rate, args.seconds, args.model, args.seed,
                              args.cancel_share, args.warmup_s, jitter=args.jitter))
    failed = failures(summary, args.rss_limit_mb, args.idle_limit_s)
    text = table(summary, failed, args.rss_limit_mb, args.idle_limit_s)
    if args.json:
        print(text, file=sys.stderr)
        print(json.dumps({**summary, "failed": failed}, indent=2, default=str))
    else:
        print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
