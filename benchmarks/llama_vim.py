"""llama.vim's side of llama.cpp's `llama-server`, for bench_replay's `llama-server` configuration: the server
process started with the flags llama.vim recommends for a small model on a CPU, and an editor that asks it exactly
as llama.vim does (autoload/llama.vim of ggml-org/llama.vim: `s:fim_ctx_local`, `llama#fim`, `s:fim_try_hint`,
`s:fim_render`, `s:pick_chunk`, `s:ring_update`), so that the same person's requests can be replayed against it.

What is copied, rule by rule:
  - the request: `POST /infill` with `input_prefix` = the 256 lines above the cursor line and a line break,
    `input_suffix` = the rest of the cursor line, a line break, the 64 lines below and a line break, `prompt` =
    the cursor line before the cursor (on a line of only whitespace: "" and `n_indent` 0, the model writes the
    indentation), `input_extra` = the ring buffer's chunks, `n_predict` 128, samplers top_k 40 / top_p 0.90 /
    infill, `cache_prompt`, `t_max_prompt_ms` 500, `t_max_predict_ms` 250 for a first request and 1000 for a
    speculative one (one after a shown suggestion, as if it were accepted);
  - its suggestion cache: responses kept under the hash of prefix + middle + suffix (and of the prefix less its
    first 1-3 lines); a position whose hash is not there looks up to 128 characters back for a cached response
    that the typed characters continue;
  - one request at a time: a request while one is in flight waits for it (llama.vim retries every 100 ms);
  - the ring buffer: a chunk of up to 32 lines around the cursor picked on entering a buffer, chunks from far
    above and below the cursor picked when a request is 32+ lines from the last pick; one queued chunk moves into
    the ring (16 chunks at most) each second when the cursor has not moved for 3 s, with a prefill-only request;
    chunks like the text around the cursor are evicted before a request;
  - the display (`s:fim_render`): trailing empty lines dropped, on a line of only whitespace the suggestion's
    leading whitespace trimmed against what is typed, a suggestion that only repeats the following lines
    discarded, a whitespace-only one shows nothing.
What is not: the sampling seed is fixed (llama.vim leaves it to the server) so that a run can be repeated.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

N_PREFIX, N_SUFFIX, N_PREDICT = 256, 64, 128
T_MAX_PROMPT_MS, T_MAX_PREDICT_MS, T_MAX_PREDICT_FIRST_MS = 500, 1000, 250
MAX_CACHE_KEYS = 250
RING_N_CHUNKS, RING_CHUNK_SIZE, RING_SCOPE, RING_UPDATE_S, RING_QUEUE = 16, 64, 1024, 1.0, 16
RING_IDLE_S = 3.0  # a queued chunk moves into the ring once the cursor has not moved for this long
RETRY_S = 0.1  # a request while one is in flight is retried after this
CACHE_SCAN_CHARS = 128
# llama.vim's advice for a small model on a CPU (the --fim-qwen-*-default presets): a 1024-token batch, the
# model's whole context, prompt chunks reused from the cache at 256 tokens or more
SERVER_FLAGS = ("-ub", "1024", "-b", "1024", "--ctx-size", "0", "--cache-reuse", "256")
# llama-server's model-free speculation, the strongest setting a llama.vim user can turn on (docs/speculative.md of
# the llama.cpp sources): ngram-mod with the documented draft settings (those of its `--spec-default`), and
# ngram-cache, which takes no draft settings (it drafts at most 8 tokens, a constant of common/speculative.cpp)
SPEC_FLAGS = {
    "ngram-mod": ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24", "--spec-ngram-mod-n-min", "48",
                  "--spec-ngram-mod-n-max", "64"),
    "ngram-cache": ("--spec-type", "ngram-cache"),
}
BUILD_SCRIPT = Path(__file__).resolve().parent / "build_llama_server.sh"
# the fields of a reply's `timings` a replay keeps per request
TIMINGS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "draft_n", "draft_n_accepted")


def find_binary(explicit: str | None = None) -> Path | None:
    """The llama-server to run: `explicit`, else $LLAMA_SERVER, else what build_llama_server.sh built."""
    for candidate in (explicit, os.environ.get("LLAMA_SERVER"),
                      BUILD_SCRIPT.parent / ".llama.cpp" / "build" / "bin" / "llama-server"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server process on a free local port; `await LlamaServer.start(...)`, then `stop()`."""

    def __init__(self, process: subprocess.Popen, port: int, log: Path, flags: list[str]):
        self.process, self.port, self.log, self.flags = process, port, log, flags

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    async def start(cls, binary: Path, gguf: Path, threads: int, log: Path, timeout_s: float = 300,
                    extra: tuple[str, ...] = ()) -> "LlamaServer":
        """`extra`: more flags after llama.vim's (SPEC_FLAGS' speculation)."""
        port = _free_port()
        flags = ["-m", str(gguf), "-t", str(threads), "-tb", str(threads), *SERVER_FLAGS, *extra,
                 "--host", "127.0.0.1", "--port", str(port)]
        with open(log, "wb") as out:
            process = subprocess.Popen([str(binary), *flags], stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        server = cls(process, port, log, flags)
        t0 = time.perf_counter()
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited ({process.returncode}):\n{server.log_tail()}")
            try:
                status, _ = await asyncio.to_thread(server._get, "/health")
                if status == 200:
                    return server
            except OSError:
                pass
            if time.perf_counter() - t0 > timeout_s:
                server.stop()
                raise RuntimeError(f"llama-server not ready after {timeout_s:.0f} s:\n{server.log_tail()}")
            await asyncio.sleep(0.25)

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def post(self, path: str, body: dict, timeout_s: float = 600) -> tuple[int, dict]:
        """(HTTP status, the JSON reply); blocking (run it in a thread)."""
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as reply:
                return reply.status, json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as err:
            try:
                return err.code, json.loads(err.read() or b"{}")
            except ValueError:
                return err.code, {}

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# -- llama.vim's rules: pure functions of the buffer ------------------------------------------------------------

def _blank(line: str) -> bool:
    return re.fullmatch(r"\s*", line) is not None


def _leading_ws(text: str) -> int:
    return len(text) - len(text.lstrip(" \t"))


@dataclass(frozen=True)
class Context:
    prefix: str
    middle: str
    suffix: str
    indent: int
    line_cur_suffix: str


def fim_ctx_local(lines: list[str], pos_x: int, pos_y: int, prev: list[str] | None = None,
                  indent_last: int = -1) -> Context:
    """`s:fim_ctx_local`: the local context at (pos_x, pos_y), 0-based here (llama.vim's lines are 1-based); with
    `prev` (a suggestion's lines) as if it were inserted at the cursor."""
    y = pos_y + 1  # llama.vim's line number
    def getline(a: int, b: int) -> list[str]:  # 1-based, inclusive, as Vim's getline(a, b)
        return lines[max(a, 1) - 1:max(b, 0)]
    max_y = len(lines)
    if not prev:
        line_cur = lines[pos_y]
        line_cur_prefix, line_cur_suffix = line_cur[:pos_x], line_cur[pos_x:]
        lines_prefix = getline(max(1, y - N_PREFIX), y - 1)
        if _blank(line_cur):  # a line of only whitespace: start from the line's beginning
            indent, line_cur_prefix, line_cur_suffix = 0, "", ""
        else:
            indent = _leading_ws(line_cur)
    else:
        line_cur = lines[pos_y] + prev[0] if len(prev) == 1 else prev[-1]
        line_cur_prefix, line_cur_suffix = line_cur, ""
        lines_prefix = getline(max(1, y - N_PREFIX + len(prev) - 1), y - 1)
        if len(prev) > 1:
            lines_prefix = lines_prefix + [lines[pos_y] + prev[0], *prev[1:-1]]
        indent = indent_last
    lines_suffix = getline(y + 1, min(max_y, y + N_SUFFIX))
    return Context("\n".join(lines_prefix) + "\n", line_cur_prefix,
                   line_cur_suffix + "\n" + "\n".join(lines_suffix) + "\n", indent, line_cur_suffix)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def context_hashes(ctx: Context) -> list[str]:
    """The keys a response is cached under: the context, and the context less the prefix's first 1-3 lines."""
    hashes = [_sha(ctx.prefix + ctx.middle + "Î" + ctx.suffix)]
    trimmed = ctx.prefix
    for _ in range(3):
        trimmed = re.sub(r"^[^\n]*\n", "", trimmed, count=1)
        if not trimmed:
            break
        hashes.append(_sha(trimmed + ctx.middle + "Î" + ctx.suffix))
    return hashes


def render(content: str, lines: list[str], pos_x: int, pos_y: int) -> list[str] | None:
    """`s:fim_render`: the suggestion's lines as shown at (pos_x, pos_y), the first from the cursor on; None when
    nothing would be shown (empty, only whitespace, or only a repeat of the following lines)."""
    parts = content.split("\n")
    while parts and parts[-1] == "":
        parts.pop()
    if not parts:
        return None
    line_cur = lines[pos_y]
    if _blank(line_cur):  # trim the suggestion's leading whitespace against what is typed
        lead = min(_leading_ws(parts[0]), len(line_cur))
        line_cur, parts[0] = parts[0][:lead], parts[0][lead:]
    line_cur_prefix, line_cur_suffix = line_cur[:pos_x], line_cur[pos_x:]
    after = lines[pos_y + 1:]
    if len(parts) > 1 and parts[0] == "" and parts[1:] == after[:len(parts) - 1]:
        return None
    if len(parts) == 1 and parts[0] == line_cur_suffix:
        return None
    cmp_y = pos_y + 1  # the first non-blank line below (Vim's loop stops at the last line)
    while cmp_y < len(lines) - 1 and _blank(lines[cmp_y]):
        cmp_y += 1
    below = lines[cmp_y] if cmp_y < len(lines) else ""
    if line_cur_prefix + parts[0] == below:
        if len(parts) == 1:
            return None
        next_line = lines[cmp_y + 1] if cmp_y + 1 < len(lines) else ""
        if len(parts) == 2 and parts[-1] == (next_line[:len(parts[-1])] if parts[-1] else next_line):
            return None
        if len(parts) > 2 and parts[1:] == lines[cmp_y + 1:cmp_y + len(parts)]:
            return None
    parts[-1] += line_cur_suffix
    if _blank("\n".join(parts)):
        return None
    return parts


def _chunk_sim(c0: list[str], c1: list[str]) -> float:
    common = sum(1 for line in c0 if line in c1)
    return 2.0 * common / (len(c0) + len(c1)) if c0 or c1 else 0.0


# -- the editor ------------------------------------------------------------------------------------------------

@dataclass
class Shown:
    """What the person sees at a position: the rendered lines, how they came, and the request's timings."""

    lines: list[str] | None
    how: str  # "request", "cache" (a cached or speculative response), "empty", "error"
    timings: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join(self.lines) if self.lines else ""


class LlamaVim:
    """One editor with llama.vim, talking to one llama-server: a buffer, a suggestion cache, a ring buffer of
    chunks and at most one request in flight."""

    def __init__(self, server: LlamaServer, seed: int = 0, speculative: bool = True):
        self.server, self.speculative = server, speculative
        self.rng = random.Random(seed)
        self.seed = seed
        self.lines: list[str] = []
        self.filename = ""
        self.cache: dict[str, str] = {}
        self.ring_chunks: list[dict] = []
        self.ring_queued: list[dict] = []
        self.pos_y_pick = -9999
        self.indent_last = -1
        self.current: asyncio.Task | None = None  # the FIM request in flight
        self.last_move = time.perf_counter()
        self.ring_task: asyncio.Task | None = None
        self.background: set[asyncio.Task] = set()
        self.requests = 0  # every /infill with n_predict > 0 sent, speculative ones included
        self.edits = 0  # buffer changes so far
        self.at: tuple[int, int, int] | None = None  # where the cursor waits: (x, y, edits then)
        self.errors: list[str] = []

    # the buffer
    def open(self, path: str, text: str, line: int) -> None:
        self.filename, self.lines = path, text.split("\n")
        if self.lines and self.lines[-1] == "" and text.endswith("\n"):
            self.lines.pop()  # Vim's lines have no last empty line for a final line break
        self.move()
        # BufEnter: a chunk around the cursor (100 ms later in llama.vim; the buffer is an unmodified file)
        half = RING_CHUNK_SIZE // 2
        self.pick_chunk(self.lines[max(0, line - half):min(line + half + 1, len(self.lines))])
        if self.ring_task is None:
            self.ring_task = asyncio.create_task(self._ring_loop())

    def set_text(self, text: str) -> None:
        self.lines = text.split("\n")
        if self.lines and self.lines[-1] == "" and text.endswith("\n"):
            self.lines.pop()
        self.move()

    def move(self) -> None:
        self.last_move = time.perf_counter()
        self.edits += 1

    # the ring buffer of chunks
    def pick_chunk(self, text: list[str]) -> None:
        if len(text) < 3:
            return
        if len(text) + 1 < RING_CHUNK_SIZE:
            chunk = list(text)
        else:
            l0 = self.rng.randint(0, max(0, len(text) - RING_CHUNK_SIZE // 2))
            chunk = text[l0:min(l0 + RING_CHUNK_SIZE // 2, len(text)) + 1]  # Vim's [l0:l1] holds l1
        if any(c["data"] == chunk for c in self.ring_chunks + self.ring_queued):
            return
        for queue in (self.ring_queued, self.ring_chunks):
            queue[:] = [c for c in queue if _chunk_sim(c["data"], chunk) <= 0.9]
        if len(self.ring_queued) == RING_QUEUE:
            self.ring_queued.pop(0)
        self.ring_queued.append({"data": chunk, "str": "\n".join(chunk) + "\n", "time": time.time(),
                                 "filename": self.filename})

    def extra(self) -> list[dict]:
        return [{"text": c["str"], "time": c["time"], "filename": c["filename"]} for c in self.ring_chunks]

    async def _ring_loop(self) -> None:
        while True:
            await asyncio.sleep(RING_UPDATE_S)
            if time.perf_counter() - self.last_move < RING_IDLE_S or not self.ring_queued:
                continue
            if len(self.ring_chunks) == RING_N_CHUNKS:
                self.ring_chunks.pop(0)
            self.ring_chunks.append(self.ring_queued.pop(0))
            body = {"input_prefix": "", "input_suffix": "", "input_extra": self.extra(), "prompt": "",
                    "n_predict": 0, "temperature": 0.0, "stream": False, "samplers": [], "cache_prompt": True,
                    "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}
            self._spawn(asyncio.to_thread(self.server.post, "/infill", body))

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    # the requests
    def _body(self, ctx: Context, t_max_predict_ms: int) -> dict:
        return {"input_prefix": ctx.prefix, "input_suffix": ctx.suffix, "input_extra": self.extra(),
                "prompt": ctx.middle, "n_predict": N_PREDICT, "stop": [], "n_indent": ctx.indent,
                "top_k": 40, "top_p": 0.90, "stream": False, "samplers": ["top_k", "top_p", "infill"],
                "cache_prompt": True, "t_max_prompt_ms": T_MAX_PROMPT_MS, "t_max_predict_ms": t_max_predict_ms,
                "seed": self.seed}

    async def _request(self, ctx: Context, hashes: list[str], t_max_predict_ms: int) -> dict:
        self.requests += 1
        status, reply = await asyncio.to_thread(self.server.post, "/infill", self._body(ctx, t_max_predict_ms))
        if status != 200:
            message = (reply.get("error") or {}).get("message", f"HTTP {status}")
            self.errors.append(message)
            return {"error": message}
        if reply.get("content"):
            raw = json.dumps({"content": reply["content"]})
            for h in hashes:
                if len(self.cache) >= MAX_CACHE_KEYS and h not in self.cache:
                    self.cache.pop(self.rng.choice(list(self.cache)))
                self.cache[h] = raw
        return reply

    def fim(self, pos_x: int, pos_y: int, prev: list[str] | None = None) -> asyncio.Task | None:
        """`llama#fim` once no request is in flight: the request as a task, or None when its context is
        cached."""
        ctx = fim_ctx_local(self.lines, pos_x, pos_y, prev, self.indent_last)
        hashes = context_hashes(ctx)
        if any(h in self.cache for h in hashes):
            return None
        self.indent_last = ctx.indent
        # evict ring chunks like the text around the cursor (they make the model repeat what is there)
        half = RING_CHUNK_SIZE // 2
        near = self.lines[max(0, pos_y - half):min(pos_y + half + 1, len(self.lines))]
        l0 = self.rng.randint(0, max(0, len(near) - half))
        chunk = near[l0:min(l0 + half, len(near)) + 1]
        self.ring_chunks = [c for c in self.ring_chunks if _chunk_sim(c["data"], chunk) <= 0.5]
        t_max = T_MAX_PREDICT_FIRST_MS if not prev else T_MAX_PREDICT_MS
        task = self._spawn(self._request(ctx, hashes, t_max))
        self.current = task
        if abs(pos_y - self.pos_y_pick) > 32 and not prev:  # only an automatic request at the cursor picks
            y = pos_y + 1
            self.pick_chunk(self.lines[max(1, y - RING_SCOPE) - 1:max(1, y - N_PREFIX)])
            end = len(self.lines)
            self.pick_chunk(self.lines[min(end, y + N_SUFFIX) - 1:min(end, y + N_SUFFIX + RING_CHUNK_SIZE)])
            self.pos_y_pick = pos_y
        return task

    def try_hint(self, pos_x: int, pos_y: int) -> list[str] | None:
        """`s:fim_try_hint`'s lookup: a cached response for this position, or one up to 128 characters back that
        the typed characters continue; rendered."""
        ctx = fim_ctx_local(self.lines, pos_x, pos_y)
        raw = self.cache.get(_sha(ctx.prefix + ctx.middle + "Î" + ctx.suffix))
        if raw is None:
            pm, best = ctx.prefix + ctx.middle, 0
            for i in range(min(CACHE_SCAN_CHARS, len(pm))):
                removed = pm[len(pm) - 1 - i:]
                cached = self.cache.get(_sha(pm[:len(pm) - 1 - i] + "Î" + ctx.suffix))
                if not cached:
                    continue
                content = json.loads(cached)["content"]
                if content[:i + 1] != removed:
                    continue
                rest = content[i + 1:]
                if rest and (raw is None or len(rest) > best):
                    best, raw = len(rest), json.dumps({"content": rest})
        if raw is None:
            return None
        return render(json.loads(raw)["content"], self.lines, pos_x, pos_y) or []

    async def ask(self, pos_x: int, pos_y: int) -> Shown:
        """The cursor arrives at (pos_x, pos_y): what llama.vim shows there, once it shows something (or knows it
        shows nothing). The time a caller measures around this is the person's wait."""
        self.move()
        self.at = (pos_x, pos_y, self.edits)
        hint = self.try_hint(pos_x, pos_y)
        how, timings = "cache", {}
        while hint is None:
            if self.current is not None and not self.current.done():
                await asyncio.wait([self.current], timeout=RETRY_S)
                if self.current.done():  # its response is shown where the cursor is now, if it fits
                    hint = self.try_hint(pos_x, pos_y)
                continue
            task = self.fim(pos_x, pos_y)
            if task is None:  # cached after all
                hint = self.try_hint(pos_x, pos_y)
                break
            reply = await task
            if "error" in reply:
                return Shown(None, "error", {"error": reply["error"]})
            how, timings = "request", reply.get("timings", {})
            hint = self.try_hint(pos_x, pos_y)
            if hint is None:  # an empty reply is not cached: nothing to show
                hint = []
        if hint and self.speculative:  # the suggestion is shown: compute the one after accepting it
            self._speculate(pos_x, pos_y, hint)
        if how == "cache":  # the automatic request at the cursor still goes out unless its own context is cached
            self._spawn(self._auto(self.at))
        return Shown(hint or None, how if hint else "empty", timings)

    async def _auto(self, at: tuple[int, int, int]) -> None:
        """llama.vim's automatic request at a cursor whose suggestion came from the cache: retried every 100 ms
        while a request is in flight, then sent if the cursor is still there and its context is not cached."""
        while self.current is not None and not self.current.done():
            await asyncio.wait([self.current], timeout=RETRY_S)
        if self.at == at:
            self.fim(at[0], at[1])

    def _speculate(self, pos_x: int, pos_y: int, hint: list[str]) -> None:
        """The request for what follows the shown suggestion, as if accepted; sent now, or once the one in flight
        is done (llama.vim's 100 ms retries)."""
        if self.current is None or self.current.done():
            self.fim(pos_x, pos_y, hint)
            return

        async def later() -> None:
            while self.current is not None and not self.current.done():
                await asyncio.wait([self.current], timeout=RETRY_S)
            self.fim(pos_x, pos_y, hint)
        self._spawn(later())

    async def idle(self) -> None:
        """Wait for the requests in flight (not the ring's timer)."""
        while self.current is not None and not self.current.done():
            await asyncio.wait([self.current])
        pending = [t for t in self.background if not t.done()]
        if pending:
            await asyncio.wait(pending)

    async def close(self) -> None:
        if self.ring_task is not None:
            self.ring_task.cancel()
            try:
                await self.ring_task
            except asyncio.CancelledError:
                pass
            self.ring_task = None
        for task in list(self.background):
            task.cancel()


def _index(line: str, utf16_column: int) -> int:
    """The str index of an LSP column (UTF-16 code units) in `line`."""
    units = 0
    for i, ch in enumerate(line):
        if units >= utf16_column:
            return i
        units += 2 if ord(ch) > 0xFFFF else 1
    return len(line)


class LlamaVimSession:
    """bench_replay's session interface (open, cursor, insert, close, inline, stats, stop) over LlamaVim: the
    person's edits change the editor's buffer, and `inline` is the cursor arriving where the person waits."""

    def __init__(self, server: LlamaServer, seed: int, speculative: bool):
        self.server = server
        self.vim = LlamaVim(server, seed, speculative)
        self.texts: dict[str, str] = {}
        self.messages: list[str] = []
        self.generated = {"generated_tokens": 0, "decode_steps": 0, "decode_ms": 0.0}

    @property
    def pid(self) -> int:
        return self.server.pid

    def open(self, uri: str, text: str) -> None:
        self.texts[uri] = text
        self._opened = uri

    def cursor(self, uri: str, at) -> None:  # the click after opening: BufEnter's chunk is picked around it
        self.vim.open(uri, self.texts[uri], at.line)

    def insert(self, uri: str, at, text: str) -> None:
        lines = self.texts[uri].split("\n")
        line = lines[at.line]
        column = _index(line, at.character)
        lines[at.line] = line[:column] + text + line[column:]
        self.texts[uri] = "\n".join(lines)
        self.vim.set_text(self.texts[uri])

    def close(self, uri: str) -> None:
        """The buffer is left: the ring's timer stops until the next one is entered (so that it sends nothing
        while another configuration takes its turn); the chunks stay."""
        self.texts.pop(uri, None)
        if self.vim.ring_task is not None:
            self.vim.ring_task.cancel()
            self.vim.ring_task = None

    async def inline(self, uri: str, at, timeout_s: float = 600) -> tuple[float, str, str, dict, dict]:
        """(ms from the cursor's arrival to the suggestion shown, its text, how it came: model | cache | empty |
        error, the counters before and after).

        Counted as llama-server's own timings count them: its first token comes from the prompt's pass (timed in
        prompt_ms), so generated_tokens are the tokens after it, decode_ms their time (predicted_ms) and
        decode_steps the passes that made them (one per token less the draft tokens accepted): decode_ms /
        generated_tokens is its predicted_per_token_ms, over many requests. The reply's own timings ride along in
        `after` (prompt_n, prompt_ms, predicted_n, predicted_ms, draft_n, draft_n_accepted)."""
        self.vim.set_text(self.texts[uri])
        lines = self.vim.lines
        pos_x = _index(lines[at.line], at.character)
        before = dict(self.generated)
        t0 = time.perf_counter()
        shown = await asyncio.wait_for(self.vim.ask(pos_x, at.line), timeout_s)
        ms = (time.perf_counter() - t0) * 1e3
        if shown.how == "error":
            self.messages.append(shown.timings.get("error", "error"))
        self.count(shown.timings)
        how = {"request": "model"}.get(shown.how, shown.how)
        if not shown.text and how != "error":
            how = "empty"
        after = {**self.generated, **{k: shown.timings.get(k) for k in TIMINGS}}
        return ms, shown.text, how, before, after

    def count(self, timings: dict) -> None:
        """Add one reply's timings to the running totals (see `inline`)."""
        n = int(timings.get("predicted_n", 0) or 0)
        after_first = max(0, n - 1)
        accepted = min(after_first, int(timings.get("draft_n_accepted", 0) or 0))
        self.generated["generated_tokens"] += after_first
        self.generated["decode_steps"] += after_first - accepted
        self.generated["decode_ms"] += float(timings.get("predicted_ms", 0.0) or 0.0)

    async def stats(self) -> dict:
        return {**self.generated, "requests_sent": self.vim.requests, "errors": len(self.vim.errors),
                "cache_keys": len(self.vim.cache), "ring_chunks": len(self.vim.ring_chunks)}

    async def stop(self) -> None:
        await self.vim.close()
        self.server.stop()
