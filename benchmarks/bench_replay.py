"""A person writing code, replayed through the real language server over stdio (pygls' LanguageClient).

What is measured: for N functions of each corpus folder (a seeded choice), the function's body is removed, the
file is opened, and the body is written again line by line, as a person with an auto-indenting editor would:
  - at each line start (its indentation already present) the client sends `textDocument/inlineCompletion`,
    waits for the reply, then inserts the true line with one incremental `didChange` (the line, the line
    break, blank lines, and the next line's indentation);
  - mode `typed` (for when the suggestion was wrong): when the line-start suggestion's first line was not the
    true line, the person types the line's first 1-3 characters (seeded), then requests again;
  - right after opening a file the person clicks where they will start writing (the first body line's start,
    its indentation present: where the first request comes), and the client sends `restLsp/cursor` there,
    as an editor with the rest-lsp extension does; typing sends didChange, so no other cursor notification;
  - before each request the person pauses `--pause-ms` (3x right after opening a file, after the click).
Blank lines are written without a request. Every request is timed from sent to reply received.

The same request sequence goes to each configuration: `rest` (the server's defaults, REST on) and `plain`
(`--draft-budget 0`), each in a fresh server process (`python -m rest_lsp.cli --stdio`, default settings
but the flags named here). The processes run side by side and take turns, one function each (the machine's speed
drifts over minutes: a ratio should compare work done at the same time); the one whose turn it is works alone,
the others idle (a turn ends once its server's process uses no CPU: what it computes ahead, a closed buffer
indexed again). In `typed` mode the first configuration's suggestions
decide where the person types (a person reacts to what they see); the others replay those decisions.

`llama-server` replays the same requests against llama.cpp's server on the same GGUF and threads, asked exactly as
llama.vim asks it; `llama-server-ngram-mod` and `llama-server-ngram-cache` the same with its model-free speculation
on (llama_vim.SPEC_FLAGS) (benchmarks/llama_vim.py: its windows, ring chunks, time caps, suggestion cache, speculative
request and display); its latency runs from the cursor's arrival to the suggestion shown. Build it once with
`bash benchmarks/build_llama_server.sh`. A model without FIM tokens gets no answer from it (the table says so).

The workspace folder of each server is a temporary copy of the corpus in which the chosen functions' bodies
are removed on disk too, so neither the index nor the opened buffer holds the answer. One unmeasured
request in a scratch buffer warms each process up first. Each server starts with an empty cache folder (nothing
learned: acceptance tables, step costs and the draft gate all start cold) unless `--served-before DIR` keeps them
between runs, as a person's server keeps them between sessions (warm it on other corpora than those measured).

Per configuration it prints: requests, p50/p95 latency (ms, and in plain decoding steps: the plain
server's ms/token in this run), the first request after opening a file (median, on its own line; p50/p95
cover the other requests), first line exactly right (the suggestion's first line equals the rest of the true
line), characters kept (the suggestion's longest common prefix with what the person wrote from the cursor on) and
suggestions shown, tokens/step and ms/token (server stats; llama-server's own timings, one token a step; ms/token
also as the median of the requests' own), the REST/plain and REST/llama-server ratios, REST's decode time over
plain's per request both decoded (median, with a 90% bootstrap interval, and sum), and the requests whose
suggestions differ between rest-lsp's configurations. It writes every request's record to a JSON file (with the
run's date, commit and machine) and each configuration's latency distribution to a PNG beside it
(benchmarks/results/ by default).

    .venv/bin/python benchmarks/bench_replay.py [--corpus DIR ...] [--functions 4] [--lines 8] [--mode line]
        [--pause-ms 100] [--configs rest,plain,llama-server] [--seed 0] [--model M] [--max-new-tokens N] [--dtype T]
        [--llama-server BIN] [--threads N] [--no-speculative] [--dear-rows MS]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import llama_vim  # noqa: E402
from benchmarks.harness import RESULTS, corpus_files, percentile, stdlib_corpora, write_json  # noqa: E402
from benchmarks.lsp_client import ServerSession, position_of, server_command, utf16_len  # noqa: E402
from rest_lsp.drafting.drafts import SOURCE_NAMES  # noqa: E402

DEFAULT_CORPORA = (*stdlib_corpora("json", "email"), REPO / "rest_lsp")
CONFIGS = {"rest": (), "plain": ("--draft-budget", "0")}  # name -> server CLI flags
LLAMA = "llama-server"  # llama.cpp's server asked as llama.vim asks it (benchmarks/llama_vim.py)
CONFIGS[LLAMA] = llama_vim.SERVER_FLAGS
# the same with llama-server's model-free speculation on (llama-server-ngram-mod, llama-server-ngram-cache)
for _spec, _flags in llama_vim.SPEC_FLAGS.items():
    CONFIGS[f"{LLAMA}-{_spec}"] = (*llama_vim.SERVER_FLAGS, *_flags)
LLAMAS = tuple(c for c in CONFIGS if c.startswith(LLAMA))
# Ablations: REST with one draft source left out
for _source in SOURCE_NAMES:
    CONFIGS[f"rest-no-{_source}"] = ("--draft-exclude", _source)
# Other files' context (--extra-context-tokens): off, and on at a few budgets
for _tokens in (0, 256, 512, 1024):
    CONFIGS[f"rest-extra{_tokens}"] = ("--extra-context-tokens", str(_tokens))
MODES = ("line", "typed")
# Cumulative counters the stats would need for exact per-request deltas (not in the server's stats yet: without
# them tokens/step and ms/token fall back to each process's running means, warm-up included).
COUNTERS = ("generated_tokens", "decode_steps", "decode_ms")
# more of the rest-lsp server's counters kept per request where its stats have them: prompt tokens computed for
# requests, and of decode_ms the drafting's share
MORE_COUNTERS = ("prefill_tokens", "draft_ms")
WARMUP_TEXT = "import os\n\n\ndef main():\n    "
MIN_FOR_INTERVAL = 5  # requests both decoded that the median's bootstrap interval is printed for
BOOTSTRAP_ROUNDS = 2000  # resamples behind that interval
MIN_BODY_LINES = 2
# After a configuration's turn (one function written) its server settles before the next one's turn: what it
# computes ahead, a closed buffer indexed again (after its 0.25 s debounce), a datastore merge must not take the
# cores from another's requests. Idle = under IDLE_CPU_MS of CPU in each of SETTLE_QUIET windows in a row, longer
# together than the server's timers (the buffer feed's debounce, the longest typing debounce).
IDLE_CPU_MS = 10
SETTLE_WINDOW_S = 0.25
SETTLE_QUIET = 3
SETTLE_MAX_S = 60.0


# -- the person's plan: pure functions --------------------------------------------------------------------------

@dataclass(frozen=True)
class Function:
    name: str  # qualified name, e.g. "JSONEncoder.encode"
    body_start: int  # 0-based index of the first line after the header (comments and blank lines included)
    body_end: int  # 0-based index past the last body line


@dataclass(frozen=True)
class LineStep:
    """One line the person writes: the cursor waits at `line` after `indent`; `rest` is what they write there,
    then `after` (line break, blank lines, the next line's indentation; empty for the last line)."""

    line: int  # 0-based line of the document
    indent: str
    rest: str
    after: str
    typed_chars: int  # how many characters of `rest` the person types before asking again (typed mode; 0: never)


@dataclass(frozen=True)
class Episode:
    """One function to write: the buffer as opened, the lines to write, and where it comes from."""

    file: str  # relative to the corpus
    function: str
    opened: str
    steps: tuple[LineStep, ...]


def split_lines(text: str) -> list[str]:
    """Lines with their "\\n", split on "\\n" only (as `ast` and LSP count lines; `str.splitlines` also breaks
    at form feeds and other separators)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _is_code(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def find_functions(text: str) -> list[Function]:
    """The functions (and methods, nested ones too) whose body starts on a line after the header."""
    tree = ast.parse(text)
    lines = split_lines(text)
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                first = child.body[0].lineno - 1  # 0-based line of the first statement
                if first > child.lineno - 1:
                    header_end = first - 1  # back over the comments and blank lines above the first statement
                    while header_end > child.lineno - 1 and not _is_code(lines[header_end]):
                        header_end -= 1
                    found.append(Function(name, header_end + 1, child.end_lineno))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def body_lines(text: str, fn: Function) -> list[str]:
    return split_lines(text)[fn.body_start:fn.body_end]


def written_lines(body: list[str]) -> int:
    return sum(1 for line in body if line.strip())


def without_bodies(text: str, functions: list[Function]) -> str:
    """`text` with the bodies of `functions` (not overlapping) removed: what the corpus holds on disk."""
    lines = split_lines(text)
    for fn in sorted(functions, key=lambda f: f.body_start, reverse=True):
        del lines[fn.body_start:fn.body_end]
    return "".join(lines)


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


def plan_episode(text: str, fn: Function, max_lines: int, rng: random.Random, file: str = "") -> Episode:
    """The buffer with `fn`'s body removed and the cursor line of its first written line (indentation present),
    and the steps that write up to `max_lines` non-blank lines of the body back."""
    if not text.endswith("\n"):
        text += "\n"
    lines = split_lines(text)
    head, body, tail = lines[:fn.body_start], lines[fn.body_start:fn.body_end], lines[fn.body_end:]
    written = [j for j, line in enumerate(body) if line.strip()][:max_lines]
    if not written:
        raise ValueError(f"{fn.name} has no body line to write.")
    steps = []
    for n, j in enumerate(written):
        content = body[j].rstrip("\n")
        indent = _indent(content)
        rest = content[len(indent):]
        if n + 1 < len(written):
            nxt = written[n + 1]
            after = "\n" + "".join(body[j + 1:nxt]) + _indent(body[nxt])
        else:
            after = ""
        typed = min(rng.randint(1, 3), len(rest) - 1)
        steps.append(LineStep(len(head) + j, indent, rest, after, max(typed, 0)))
    first = steps[0]
    opened = "".join(head) + "".join(body[:written[0]]) + first.indent + "\n" + "".join(tail)
    return Episode(file, fn.name, opened, tuple(steps))


def first_line(suggestion: str) -> str:
    return suggestion.split("\n", 1)[0]


def first_line_matches(suggestion: str, expected: str) -> bool:
    """The suggestion's first line is the rest of the true line (trailing whitespace aside: nobody sees it)."""
    return bool(expected.strip()) and first_line(suggestion).rstrip() == expected.rstrip()


def written_from(episode: Episode, s: int) -> str:
    """What the person writes from step `s`'s cursor (after its indentation) to the end of the episode."""
    return "".join(step.rest + step.after for step in episode.steps[s:])


def kept_chars(suggestion: str, truth: str) -> int:
    """Characters of the suggestion the person would keep: its longest common prefix with what they wrote."""
    n = 0
    for a, b in zip(suggestion, truth):
        if a != b:
            break
        n += 1
    return n


def choose_functions(files: dict[str, str], n: int, rng: random.Random,
                     min_lines: int = MIN_BODY_LINES) -> list[tuple[str, Function]]:
    """n functions with at least `min_lines` non-blank body lines, spread over the files (one per file per
    round, files in a seeded order), none inside another chosen one."""
    candidates = {}
    for name in sorted(files):
        text = files[name]
        fns = [f for f in find_functions(text) if written_lines(body_lines(text, f)) >= min_lines]
        if fns:
            candidates[name] = fns
    order = sorted(candidates)
    rng.shuffle(order)
    chosen: list[tuple[str, Function]] = []
    while len(chosen) < n and any(candidates.values()):
        for name in order:
            if len(chosen) == n or not candidates[name]:
                continue
            fn = candidates[name].pop(rng.randrange(len(candidates[name])))
            chosen.append((name, fn))
            candidates[name] = [f for f in candidates[name]
                                if f.body_end <= fn.body_start or f.body_start >= fn.body_end]
    return chosen


# -- the run ---------------------------------------------------------------------------------------------------

def counter_deltas(before: dict, after: dict) -> dict:
    if not all(k in before and k in after for k in COUNTERS):
        return {}
    return {k: after[k] - before[k] for k in COUNTERS}


class Person:
    """Writes the episodes of one (corpus, mode) into one server, recording every request."""

    def __init__(self, session: ServerSession, config: str, corpus: str, mode: str, pause_s: float,
                 decisions: dict, decide: bool):
        self.session, self.config, self.corpus, self.mode = session, config, corpus, mode
        self.pause_s = pause_s
        self.decisions, self.decide = decisions, decide  # (function, step) -> type and ask again?
        self.records: list[dict] = []

    async def write(self, uri: str, episode: Episode) -> None:
        self.session.open(uri, episode.opened)
        first = episode.steps[0]
        self.session.cursor(uri, types.Position(first.line, utf16_len(first.indent)))
        pause = 3 * self.pause_s
        for s, step in enumerate(episode.steps):
            await asyncio.sleep(pause)
            pause = self.pause_s
            column = utf16_len(step.indent)
            truth = written_from(episode, s)
            record = await self.ask(uri, episode, s, step, "", first=s == 0, truth=truth)
            typed = ""
            key = f"{episode.file}:{episode.function}:{s}"
            if self.mode == "typed" and step.typed_chars:
                if self.decide:
                    self.decisions[key] = not record["first_line_match"]
                if self.decisions.get(key, False):
                    typed = step.rest[:step.typed_chars]
                    self.session.insert(uri, types.Position(step.line, column), typed)
                    await asyncio.sleep(self.pause_s)
                    await self.ask(uri, episode, s, step, typed, first=False, truth=truth[len(typed):])
            at = types.Position(step.line, column + utf16_len(typed))
            self.session.insert(uri, at, step.rest[len(typed):] + step.after)
        self.session.close(uri)

    async def ask(self, uri: str, episode: Episode, s: int, step: LineStep, typed: str, first: bool,
                  truth: str) -> dict:
        at = types.Position(step.line, utf16_len(step.indent + typed))
        ms, text, how, before, after = await self.session.inline(uri, at)
        expected = step.rest[len(typed):]
        record = {
            "config": self.config, "corpus": self.corpus, "mode": self.mode, "file": episode.file,
            "function": episode.function, "step": s, "kind": "typed" if typed else "line-start",
            "first_after_open": first, "line": step.line + 1, "character": at.character, "typed": typed,
            "expected": expected, "ms": round(ms, 1), "text": text, "answer": how,
            "first_line_match": first_line_matches(text, expected),
            "shown_chars": len(text), "kept_chars": kept_chars(text, truth),
            **counter_deltas(before, after),
            **{k: after[k] - before[k] for k in MORE_COUNTERS if k in before and k in after},
            **{k: after[k] for k in llama_vim.TIMINGS if k in after},  # llama-server's own timings of this reply
        }
        self.records.append(record)
        print(f"{self.config:5} {self.mode:5} {episode.file}:{step.line + 1:<5} {record['kind']:10} "
              f"{ms:7.0f} ms {how:12} {'=' if record['first_line_match'] else 'x'} {first_line(text)[:50]!r}",
              file=sys.stderr)
        return record


def prepare_workspace(corpus: Path, dest: Path, files: dict[str, str], chosen: list[tuple[str, Function]]) -> None:
    """A copy of the corpus whose chosen bodies are gone on disk too."""
    shutil.copytree(corpus, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))
    by_file: dict[str, list[Function]] = {}
    for name, fn in chosen:
        by_file.setdefault(name, []).append(fn)
    for name, fns in by_file.items():
        (dest / name).write_text(without_bodies(files[name], fns), encoding="utf-8")


# -- taking turns ------------------------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, all its threads (Linux /proc); None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def settle(pid: int) -> float:
    """Wait until the process is idle (or SETTLE_MAX_S passed, which it says); returns the seconds waited. Without
    /proc, one second."""
    t0 = time.perf_counter()
    before = cpu_seconds(pid)
    if before is None:
        await asyncio.sleep(1.0)
        return time.perf_counter() - t0
    quiet = 0
    while quiet < SETTLE_QUIET:
        if time.perf_counter() - t0 > SETTLE_MAX_S:
            print(f"bench_replay: server {pid} still busy after {SETTLE_MAX_S:.0f} s; the next turn starts anyway",
                  file=sys.stderr)
            break
        await asyncio.sleep(SETTLE_WINDOW_S)
        now = cpu_seconds(pid)
        if now is None:
            break
        quiet = quiet + 1 if (now - before) * 1e3 < IDLE_CPU_MS else 0
        before = now
    return time.perf_counter() - t0


def rest_lsp_command(args: argparse.Namespace, flags: list[str]) -> list[str]:
    """The command of a rest-lsp server: the user's, or with `--dear-rows` the same server run by
    benchmarks/dear_rows.py (real compute added per row of a pass: a CPU whose tree rows are dear)."""
    if not args.dear_rows:
        return server_command(*flags)
    return [sys.executable, str(Path(__file__).resolve().parent / "dear_rows.py"), "--row-ms", str(args.dear_rows),
            "--", "--stdio", *flags]


def server_flags(args: argparse.Namespace, config: str, tag: str, work: Path) -> list[str]:
    """The rest-lsp server's flags for `config`: its log, its cache folder (in this run's `work` folder, else under
    --served-before, kept between runs), the configuration's own flags and the run's model settings."""
    flags = ["--log-level", "WARNING", "--log-file", str(work / f"server-{tag}.log"),
             "--cache-dir", str((args.served_before or work) / f"cache-{tag}"), *CONFIGS[config]]
    if args.model:
        flags += ["--model", args.model]
    if args.max_new_tokens:
        flags += ["--max-new-tokens", str(args.max_new_tokens)]
    if args.dtype:
        flags += ["--dtype", args.dtype]
    return flags


class Replay:
    """One server process of one configuration: started, indexed and warmed up, then given episodes to write."""

    def __init__(self, config: str, corpus: str, mode: str, tag: str, flags: list[str], work: Path):
        self.config, self.corpus, self.mode, self.tag, self.flags, self.work = config, corpus, mode, tag, flags, work
        self.session: ServerSession | llama_vim.LlamaVimSession | None = None
        self.person: Person | None = None
        self.load_s = self.index_s = 0.0
        self.unsupported = ""  # why this configuration cannot run here (llama-server: a model without FIM tokens)

    @classmethod
    async def start(cls, args: argparse.Namespace, config: str, root: Path, work: Path, corpus: str, mode: str,
                    decisions: dict, decide: bool) -> "Replay":
        tag = f"{config}-{mode}"
        if config in LLAMAS:
            return await cls.start_llama(args, config, corpus, mode, tag, work, decisions, decide)
        flags = server_flags(args, config, tag, work)
        replay = cls(config, corpus, mode, tag, flags, work)
        t0 = time.perf_counter()
        replay.session = await ServerSession.start(rest_lsp_command(args, flags), root)
        try:
            replay.load_s = time.perf_counter() - t0
            await replay.session.wait_indexed(1)
            replay.index_s = time.perf_counter() - t0 - replay.load_s
            await replay.warm_up()
        except BaseException:
            await replay.stop(failed=True)
            raise
        replay.person = Person(replay.session, config, corpus, mode, args.pause_ms / 1e3, decisions, decide)
        return replay

    @classmethod
    async def start_llama(cls, args: argparse.Namespace, config: str, corpus: str, mode: str, tag: str, work: Path,
                          decisions: dict, decide: bool) -> "Replay":
        """llama-server on the same GGUF and threads, and an editor that asks it as llama.vim does."""
        binary = llama_vim.find_binary(args.llama_server)
        if binary is None:
            raise SystemExit("bench_replay: no llama-server; build it with `bash benchmarks/build_llama_server.sh` "
                             "or name one with --llama-server.")
        gguf = llama_gguf(args.model)
        extra = tuple(CONFIGS[config][len(llama_vim.SERVER_FLAGS):])
        server = await llama_vim.LlamaServer.start(binary, gguf, args.threads, work / f"server-{tag}.log",
                                                   extra=extra)
        replay = cls(config, corpus, mode, tag, [str(binary), *server.flags], work)
        replay.session = llama_vim.LlamaVimSession(server, args.seed, speculative=not args.no_speculative)
        try:
            replay.unsupported = await replay.warm_up()
        except BaseException:
            await replay.stop(failed=True)
            raise
        if replay.unsupported:
            print(f"bench_replay: llama-server answers no request here: {replay.unsupported}", file=sys.stderr)
        replay.person = Person(replay.session, config, corpus, mode, args.pause_ms / 1e3, decisions, decide)
        return replay

    async def warm_up(self) -> str:
        """One unmeasured request in a scratch buffer outside the workspace; returns the error it met, if any."""
        warm_uri = (self.work / f"warmup-{self.tag}.py").as_uri()
        self.session.open(warm_uri, WARMUP_TEXT)
        _, _, how, _, _ = await self.session.inline(warm_uri, position_of(WARMUP_TEXT))
        self.session.close(warm_uri)
        await settle(self.session.pid)
        return self.session.messages[-1] if how == "error" and self.session.messages else ""

    async def write(self, root: Path, episode: Episode) -> None:
        if self.unsupported:
            return
        try:
            await self.person.write((root / episode.file).as_uri(), episode)
            await settle(self.session.pid)
        except BaseException:
            await self.stop(failed=True)
            raise

    async def finish(self) -> tuple[list[dict], dict]:
        final = await self.session.stats()
        info = {"config": self.config, "corpus": self.corpus, "mode": self.mode, "flags": self.flags,
                "model_load_s": round(self.load_s, 1), "index_s": round(self.index_s, 1), "final_stats": final,
                "messages": self.session.messages, "unsupported": self.unsupported}
        await self.stop()
        return self.person.records, info

    async def stop(self, failed: bool = False) -> None:
        if failed:
            log = self.work / f"server-{self.tag}.log"
            if log.exists():  # the temporary folder goes away: say what the server said
                print(f"bench_replay: {self.config} server log (end):\n{log.read_text(errors='replace')[-3000:]}",
                      file=sys.stderr)
        if self.session is not None:
            session, self.session = self.session, None
            await session.stop()


def llama_gguf(model: str | None) -> Path:
    """The GGUF file llama-server loads: --model when it is one, else the default model's bundled file."""
    if model is None:
        from rest_lsp.engine.model_source import DEFAULT_MODEL, resolve

        folder, name = resolve(DEFAULT_MODEL)
        return Path(folder) / name
    if Path(model).is_file() and model.endswith(".gguf"):
        return Path(model)
    raise SystemExit(f"bench_replay: llama-server needs a .gguf file; --model is {model!r}.")


async def run(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()  # the cores may be shared: say how busy they were
    modes = list(MODES) if args.mode == "both" else [args.mode]
    tmp = Path(tempfile.mkdtemp(prefix="rest-lsp-replay-"))
    records, processes, plans = [], [], []
    try:
        for c, corpus in enumerate(args.corpus):
            files = corpus_files(corpus)
            rng = random.Random(f"{args.seed}:{corpus.name}")
            chosen = choose_functions(files, args.functions, rng)
            if not chosen:
                raise SystemExit(f"bench_replay: no function with {MIN_BODY_LINES}+ body lines in {corpus}.")
            episodes = [plan_episode(files[name], fn, args.lines, rng, name) for name, fn in chosen]
            plans.append({"corpus": str(corpus), "functions": [
                {"file": e.file, "function": e.function, "lines": len(e.steps)} for e in episodes]})
            work = tmp / f"{c}-{corpus.name}"
            root = work / corpus.name
            prepare_workspace(corpus, root, files, chosen)
            for mode in modes:
                decisions: dict = {}
                # the configurations take turns, function by function: the machine's speed drifts over minutes,
                # and each ratio should compare work done at the same time
                replays = []
                try:
                    for k, config in enumerate(args.configs):
                        replays.append(await Replay.start(args, config, root, work, corpus.name, mode, decisions,
                                                          decide=k == 0))
                    for episode in episodes:
                        for replay in replays:
                            await replay.write(root, episode)
                    for replay in replays:
                        got, info = await replay.finish()
                        records += got
                        processes.append(info)
                finally:
                    for replay in replays:
                        await replay.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "driver": "the real server over stdio (pygls LanguageClient); time from request sent to reply received; "
                  "llama-server: from the cursor's arrival to the suggestion shown, as llama.vim asks it",
        "model": args.model or "default (SmolLM2-135M-Instruct, from its .gguf)",
        "device": "server default (cpu here)", "dtype": args.dtype or "server default", "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
        "seed": args.seed, "functions_per_corpus": args.functions, "max_lines": args.lines, "modes": modes,
        "served_before": str(args.served_before) if args.served_before else None, "dear_rows_ms": args.dear_rows,
        "pause_ms": args.pause_ms, "max_new_tokens": args.max_new_tokens or "server default",
        "configs": {c: list(CONFIGS[c]) for c in args.configs}, "plans": plans, "threads": args.threads,
        "llama_vim_speculative": not args.no_speculative if set(LLAMAS) & set(args.configs) else None,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "processes": processes, "requests": records,
    }


# -- summary -----------------------------------------------------------------------------------------------------

def decode_rates(records: list[dict], processes: list[dict]) -> dict:
    """tokens/step and ms/token of these requests: exact from counter deltas when the server has the counters;
    else its running means per process (warm-up included), weighted by decoded completions (an approximation)."""
    if records and all(k in r for r in records for k in COUNTERS):
        tokens = sum(r["generated_tokens"] for r in records)
        steps = sum(r["decode_steps"] for r in records)
        ms = sum(r["decode_ms"] for r in records)
        return {"tokens_per_step": tokens / steps if steps else None, "ms_per_token": ms / tokens if tokens else None,
                "source": "stats counter deltas over the measured requests"}
    means = [(p["final_stats"].get("mean_tokens_per_step"), p["final_stats"].get("mean_ms_per_token"),
              p["final_stats"].get("completions_decoded") or 0) for p in processes]
    means = [m for m in means if m[0] is not None and m[1] is not None and m[2]]
    total = sum(m[2] for m in means)
    if not total:
        return {"tokens_per_step": None, "ms_per_token": None, "source": "no decoded completion"}
    return {"tokens_per_step": sum(m[0] * m[2] for m in means) / total,
            "ms_per_token": sum(m[1] * m[2] for m in means) / total,
            "source": "the server's running means per process (warm-up included), weighted by completions decoded"}


def _per_answer(records: list[dict]) -> float | None:
    answered = [r for r in records if r["answer"] in ("model", "prefetch")]
    counts = [r.get("prefill_tokens", r.get("prompt_n")) for r in answered]
    counts = [c for c in counts if c is not None]
    return sum(counts) / len(counts) if counts else None


def summarize(records: list[dict], processes: list[dict]) -> dict:
    later = [r["ms"] for r in records if not r["first_after_open"]]
    first = [r["ms"] for r in records if r["first_after_open"]]
    return {
        "requests": len(records), "first_after_open": len(first),
        "type_through": sum(r["answer"] == "type-through" for r in records),
        "empty": sum(r["answer"] == "empty" for r in records),
        "ready": sum(r["answer"] in ("prefetch", "cache") for r in records),
        "p50_ms": percentile(later, 50), "p95_ms": percentile(later, 95),
        "first_after_open_median_ms": statistics.median(first) if first else None,
        "first_line_matches": sum(r["first_line_match"] for r in records),
        "shown": sum(bool(r["text"]) for r in records),
        "shown_chars": sum(r.get("shown_chars", 0) for r in records),
        "kept_chars": sum(r.get("kept_chars", 0) for r in records),
        "unsupported": next((p.get("unsupported") for p in processes if p.get("unsupported")), ""),
        # llama-server's speculation: draft tokens it proposed and the model accepted (its replies' timings)
        "drafted": sum(r.get("draft_n") or 0 for r in records),
        # prompt tokens computed per model answer (rest-lsp: its prefill_tokens counter; llama-server: prompt_n)
        "prompt_tokens_per_answer": _per_answer(records),
        "draft_accepted": sum(r.get("draft_n_accepted") or 0 for r in records),
        **decode_rates(records, processes),
        "ms_per_token_median": _median_ms_per_token(records),
    }


def _median_ms_per_token(records: list[dict]) -> float | None:
    """The median over decoded requests of each one's decode time per token: unlike the ratio of sums, a few slow
    requests (llama-server decoding while llama.vim's ring-buffer prompts are computed beside it) do not set it."""
    rates = [r["decode_ms"] / r["generated_tokens"] for r in records
             if r.get("decode_ms") and r.get("generated_tokens")]
    return statistics.median(rates) if rates else None


def key_of(r: dict) -> tuple:
    return (r["corpus"], r["mode"], r["file"], r["function"], r["step"], r["kind"])


def compare(records: list[dict], configs: list[str]) -> dict:
    """Per mode: were the request sequences identical, and which suggestions differ from the first config's (none
    to compare: nothing)."""
    out = {}
    if not configs:
        return out
    base = configs[0]
    for mode in sorted({r["mode"] for r in records}):
        by_config = {c: [r for r in records if r["config"] == c and r["mode"] == mode] for c in configs}
        keys = {c: [key_of(r) for r in rs] for c, rs in by_config.items()}
        mismatches, cut = [], []
        for c in configs[1:]:
            theirs = {key_of(r): r for r in by_config[c]}
            for r in by_config[base]:
                other = theirs.get(key_of(r))
                if other is not None and other["text"] != r["text"]:
                    found = {"config": c, "corpus": r["corpus"], "file": r["file"], "line": r["line"],
                             "kind": r["kind"], base: r["text"], c: other["text"]}
                    (cut if line_prefix(r["text"], other["text"]) else mismatches).append(found)
        out[mode] = {"same_requests": all(keys[c] == keys[base] for c in configs),
                     "compared": len(by_config[base]) if len(configs) > 1 else 0, "mismatches": mismatches,
                     "cut_at_a_line_end": cut}
    return out


def line_prefix(a: str, b: str) -> bool:
    """One suggestion is the other cut at a line end: the server's time budget ends a request at the first line
    end after it runs out, and a faster configuration gets further in that time; the tokens are the same."""
    short, long = sorted((a, b), key=len)
    return long.startswith(short) and long[len(short):].lstrip(" \t").startswith("\n")


def add_summary(results: dict, configs: list[str]) -> None:
    records, processes = results["requests"], results["processes"]
    results["summary"] = {
        mode: {c: summarize([r for r in records if r["config"] == c and r["mode"] == mode],
                            [p for p in processes if p["config"] == c and p["mode"] == mode]) for c in configs}
        for mode in results["modes"]
    }
    for mode, per in results["summary"].items():
        plain_step = per.get("plain", {}).get("ms_per_token")
        for s in per.values():
            s["plain_step_ms"] = plain_step
            s["p50_plain_steps"] = s["p50_ms"] / plain_step if plain_step and s["p50_ms"] is not None else None
            s["p95_plain_steps"] = s["p95_ms"] / plain_step if plain_step and s["p95_ms"] is not None else None
    results["identical"] = compare(records, exact_configs(configs))
    results["decoded_by_both"] = {mode: decoded_by_both(records, mode) for mode in results["modes"]}


def decoded_by_both(records: list[dict], mode: str, a: str = "rest", b: str = "plain") -> dict | None:
    """Over the requests of `mode` that both `a` and `b` decoded (decode time counted, neither answered from a
    cache or an earlier decode), a's decode time over b's: {"requests", "median", "sum"} (issue 41's measure of
    whether REST pays per request); None without such a request."""
    mine = {key_of(r): r for r in records if r["config"] == a and r["mode"] == mode and r.get("decode_ms")}
    pairs = [(mine[key_of(r)]["decode_ms"], r["decode_ms"]) for r in records
             if r["config"] == b and r["mode"] == mode and r.get("decode_ms") and key_of(r) in mine]
    if not pairs:
        return None
    ratios = [x / y for x, y in pairs]
    out = {"requests": len(pairs), "median": statistics.median(ratios),
           "sum": sum(x for x, _ in pairs) / sum(y for _, y in pairs)}
    if len(ratios) >= MIN_FOR_INTERVAL:
        out["median_interval"] = median_interval(ratios)
    return out


def median_interval(values: list[float], rounds: int = BOOTSTRAP_ROUNDS, coverage: float = 0.9,
                    seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the median of `values`: the medians of `rounds` resamples drawn with
    replacement (seeded), cut at (1 - coverage) / 2 on each side: how far the median moves with which requests a run
    happens to hold."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(rounds))
    cut = int(rounds * (1 - coverage) / 2)
    return medians[cut], medians[rounds - 1 - cut]


def exact_configs(configs: list[str]) -> list[str]:
    """The configurations whose suggestions must be identical: rest-lsp's (llama-server is another engine on the
    GGUF's quantized weights, sampling as llama.vim asks)."""
    return [c for c in configs if c not in LLAMAS]


MS_PER_TOKEN_NOTE = (
    "ms/token is not counted alike: rest-lsp's is its decode time per token generated, from the first step on "
    "(that step also computes the prompt's uncached tail of up to 64 tokens, e.g. the line just written; drafting "
    "and the stop checks included; the first token counted); llama-server's is predicted_ms per token after the "
    "first (the first comes from the prompt's pass, timed in its prompt_ms), as its predicted_per_token_ms. "
    "llama-server decodes beside llama.vim's other requests (its ring buffer's chunks, its speculative requests): "
    "a decode that shares the server with their prompts takes seconds, which sets the ratio of sums; the median "
    "row is each request's own rate.")


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _num(x, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def table(results: dict, configs: list[str]) -> str:
    corpora = ", ".join(Path(p["corpus"]).name for p in results["plans"])
    out = [f"Replay of a person writing code: {results['functions_per_corpus']} functions x up to "
           f"{results['max_lines']} lines per corpus ({corpora}), seed {results['seed']}, pause "
           f"{results['pause_ms']} ms, max new tokens {results['max_new_tokens']}; {results['model']}; "
           f"{results['driver']}."]
    if results.get("dear_rows_ms"):
        out[0] += (f" Rows made dear: every rest-lsp pass did about {results['dear_rows_ms']:g} ms more compute a row "
                   "past the first (benchmarks/dear_rows.py).")
    ratios = [(a, b) for a, b in (("rest", "plain"), *(("rest", c) for c in LLAMAS)) if a in configs and b in configs]
    for mode, per in results["summary"].items():
        s = [per[c] for c in configs]
        cell = lambda f: [f(x) for x in s]  # noqa: E731
        head = "| " + mode + " mode | " + " | ".join(configs) + "".join(f" | {a}/{b}" for a, b in ratios) + " |"
        rows = [
            ("requests (first after open / type-through / empty / ready before asked)",
             cell(lambda x: f"{x['requests']} ({x['first_after_open']}/{x['type_through']}/{x['empty']}/"
                            f"{x.get('ready', 0)})"), None),
            ("p50 latency, ms (plain steps)", cell(lambda x: f"{_num(x['p50_ms'])} ({_num(x['p50_plain_steps'], '.1f')})"),
             "p50_ms"),
            ("p95 latency, ms (plain steps)", cell(lambda x: f"{_num(x['p95_ms'])} ({_num(x['p95_plain_steps'], '.1f')})"),
             "p95_ms"),
            ("first request after opening a file, median ms", cell(lambda x: _num(x["first_after_open_median_ms"])),
             "first_after_open_median_ms"),
            ("first line exactly right", cell(lambda x: f"{x['first_line_matches']}/{x['requests']}"),
             "first_line_matches"),
            ("characters kept (common prefix with what was written) / shown",
             cell(lambda x: f"{x['kept_chars']}/{x['shown_chars']}"), "kept_chars"),
            ("suggestions shown", cell(lambda x: f"{x['shown']}/{x['requests']}"), None),
            ("tokens/step", cell(lambda x: _num(x["tokens_per_step"], ".2f")), "tokens_per_step"),
            ("ms/token", cell(lambda x: _num(x["ms_per_token"], ".1f")), "ms_per_token"),
            ("ms/token, median of the decoded requests", cell(lambda x: _num(x.get("ms_per_token_median"), ".1f")),
             "ms_per_token_median"),
        ]
        rows.append(("prompt tokens computed per model answer",
                     cell(lambda x: _num(x.get("prompt_tokens_per_answer"), ".0f")), None))
        if any(c in LLAMAS for c in configs):
            rows.append(("llama-server draft tokens accepted / drafted",
                         cell(lambda x: f"{x.get('draft_accepted', 0)}/{x.get('drafted', 0)}"), None))
        out += ["", head, "|---" * (len(configs) + 1 + len(ratios)) + "|"]
        for label, cells, key in rows:
            extra = "".join(f" {_ratio(per[a][key], per[b][key]) if key else ''} |" for a, b in ratios)
            out.append(f"| {label} | " + " | ".join(cells) + " |" + extra)
        for c in configs:
            if per[c].get("unsupported"):
                out.append(f"\n{c} answered no request with this model: {per[c]['unsupported']}")
        plain_step = s[0]["plain_step_ms"]
        out.append("")
        both = results.get("decoded_by_both", {}).get(mode)
        if both is not None:
            spread = both.get("median_interval")
            spread = f" (90% bootstrap interval {spread[0]:.2f}-{spread[1]:.2f}x)" if spread else ""
            out.append(f"Requests decoded by both rest and plain ({both['requests']}): REST's decode time over "
                       f"plain's, median {both['median']:.2f}x{spread}, summed {both['sum']:.2f}x.")
        out.append(f"Plain decoding step in this run (ms/token of the plain server): {_num(plain_step, '.1f')} ms. "
                   f"tokens/step and ms/token: {s[0]['source']}.")
        if any(c in LLAMAS for c in configs):
            out.append(MS_PER_TOKEN_NOTE)
        if len(exact_configs(configs)) > 1:
            same = results["identical"][mode]
            cut = len(same.get("cut_at_a_line_end", []))
            out.append(f"Request sequences identical across configurations: {'yes' if same['same_requests'] else 'NO'}. "
                       f"Identical suggestions: {same['compared'] - len(same['mismatches']) - cut}/{same['compared']} "
                       f"requests, {cut} more the same up to a line end where the time budget cut one of them, "
                       f"{len(same['mismatches'])} mismatches.")
            for m in same["mismatches"]:
                out.append(f"  mismatch {m['corpus']}/{m['file']}:{m['line']} ({m['kind']}): "
                           + "  vs  ".join(f"{c}={m[c]!r}" for c in exact_configs(configs) if c in m))
    load = results["load_average_before_after"]
    out += ["", f"Load average (1 min) before/after: {load} on {results['cpu_count']} cores."]
    return "\n".join(out)


def plot(results: dict, configs: list[str], path: Path) -> None:
    """Both latency distributions (requests after the first of each file): ECDF and histogram, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    series = {f"{c} ({mode})" if len(results["modes"]) > 1 else c:
              sorted(r["ms"] for r in results["requests"]
                     if r["config"] == c and r["mode"] == mode and not r["first_after_open"])
              for mode in results["modes"] for c in configs}
    series = {k: v for k, v in series.items() if v}
    fig, (ecdf, hist) = plt.subplots(1, 2, figsize=(12, 4.5))
    everything = [x for v in series.values() for x in v] or [1.0]
    bins = np.geomspace(max(min(everything), 1.0) * 0.9, max(everything) * 1.1, 30)
    for label, values in series.items():
        fractions = np.arange(len(values) + 1) / len(values)  # from 0 at the fastest request to 1 at the slowest
        ecdf.step([values[0], *values], fractions, where="post", label=f"{label}, n={len(values)}")
        hist.hist(values, bins=bins, alpha=0.5, label=label)
    for ax in (ecdf, hist):
        ax.set_xscale("log")
        ax.set_xlabel("inline completion latency, ms (request sent to reply received)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ecdf.set_ylabel("fraction of requests")
    hist.set_ylabel("requests")
    corpora = ", ".join(Path(p["corpus"]).name for p in results["plans"])
    fig.suptitle(f"bench_replay: a person writing code ({corpora}; first request after each open left out)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, action="append",
                        help="folder of Python files (repeatable; default: the standard library's json and email, "
                             "and this repository's rest_lsp)")
    parser.add_argument("--functions", type=int, default=4, help="functions written per corpus (default 4)")
    parser.add_argument("--lines", type=int, default=8, help="most lines written per function (default 8)")
    parser.add_argument("--mode", choices=("line", "typed", "both"), default="line")
    parser.add_argument("--pause-ms", type=float, default=100,
                        help="the person's time before each request; 3x after opening a file (default 100)")
    parser.add_argument("--configs", default="rest,plain", help="comma-separated, from: " + ", ".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="default: the server's (the bundled default model)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the server's")
    parser.add_argument("--dtype", default=None,
                        help="the servers' --dtype (default: theirs; float32 is the exact mode, float16-weights the "
                             "default for the bundled .gguf model on a CPU without bf16)")
    parser.add_argument("--llama-server", default=None,
                        help="the llama-server binary of the llama-server configuration (default: $LLAMA_SERVER, "
                             "else what benchmarks/build_llama_server.sh built)")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama-server's threads (default: the cores this process may use, as torch's default "
                             "in our server)")
    parser.add_argument("--no-speculative", action="store_true",
                        help="llama-server configuration: no speculative request after a shown suggestion")
    parser.add_argument("--served-before", type=Path, default=None, metavar="DIR",
                        help="the servers' cache folders under DIR, kept between runs: a server that has served "
                             "before (its acceptance tables, learned step costs and draft gate, keyed by model, mode "
                             "and machine), as a person's server after its first session; default: fresh ones")
    parser.add_argument("--dear-rows", type=float, default=0, metavar="MS",
                        help="every rest-lsp server does about MS milliseconds more compute a row past the first of "
                             "each pass (benchmarks/dear_rows.py: a CPU whose tree rows are dear); default 0")
    parser.add_argument("--out", type=Path, default=RESULTS / "replay.json",
                        help="the JSON of all requests; the PNG goes beside it")
    args = parser.parse_args(argv)
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if args.served_before is not None:
        args.served_before = args.served_before.resolve()
        args.served_before.mkdir(mode=0o700, parents=True, exist_ok=True)
    args.corpus = [c.resolve() for c in args.corpus or DEFAULT_CORPORA]
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad or not args.configs or len(set(args.configs)) != len(args.configs):
        parser.error(f"--configs takes distinct names from {', '.join(CONFIGS)}; got {','.join(args.configs)}")
    missing = [str(c) for c in args.corpus if not c.is_dir()]
    if missing:
        parser.error(f"--corpus: not a folder: {', '.join(missing)}")
    if args.functions < 1 or args.lines < 1 or args.pause_ms < 0 or args.dear_rows < 0:
        parser.error("--functions and --lines must be at least 1, --pause-ms and --dear-rows at least 0.")
    return args


def learned_step_costs(processes: list[dict]) -> str:
    """Per server process, the step cost its decoder learned from the steps it ran (ratio to a plain step, by
    rows), the thread count its steps ran on, and its draft gate, from its last stats reply."""
    lines = []
    for p in processes:
        stats = p["final_stats"] if isinstance(p.get("final_stats"), dict) else {}
        cost = stats.get("step_cost")
        if cost and cost.get("learned"):
            learned = ", ".join(f"{k}: {r:.2f}x ({n})" for k, (n, r) in cost["learned"].items())
            lines.append(f"{p['config']} {p['mode']} {p['corpus']}: step cost learned (seed {cost['seed']}, "
                         f"{cost['growth_probes']} growth probes; rows: ratio (steps in window)): {learned}")
        threads = stats.get("step_threads")
        if threads:
            medians = ", ".join(f"{c}: {ms:.1f} ms" for c, ms in threads["plain_step_ms"].items()) or "none timed"
            lines.append(f"{p['config']} {p['mode']} {p['corpus']}: steps on {threads['threads']} threads "
                         f"({threads['probes']} probes, {threads['switches']} switches; plain step by threads: "
                         f"{medians})")
        gate = dict(stats.get("draft_gate") or {})
        lite = gate.pop("lite", None) or {}
        for kind, ledgers in (("draft gate", gate), ("draft gate, lite steps (the context alone)", lite)):
            if any(g["seen"] for g in ledgers.values()):
                said = ", ".join(f"{name} {g['gain']:+.2f} ({g['seen']} drafted, {g['plain_steps']} not"
                                 f"{'' if g['drafts'] else ', off'})" for name, g in ledgers.items())
                lines.append(f"{p['config']} {p['mode']} {p['corpus']}: {kind}, gain a drafted step brought in "
                             f"plain steps: {said}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    add_summary(results, args.configs)
    print(table(results, args.configs))
    print(learned_step_costs(results["processes"]))
    write_json(args.out, results, ["benchmarks/bench_replay.py", *(sys.argv[1:] if argv is None else argv)])
    png = args.out.with_suffix(".png")
    plot(results, args.configs, png)
    print(f"\nsaved {args.out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
