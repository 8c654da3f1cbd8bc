"""benchmarks/llama_vim.py: llama.vim's request, cache and display rules, and the editor against a stand-in
llama-server (a local HTTP server answering /health and /infill with canned text)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import llama_vim  # noqa: E402
from benchmarks.bench_replay import kept_chars, written_from, plan_episode, find_functions  # noqa: E402
from benchmarks.llama_vim import context_hashes, fim_ctx_local, render  # noqa: E402

BUFFER = ["import os", "", "def add(a, b):", "    ", "", "def sub(a, b):", "    return a - b"]


def test_a_whitespace_only_line_sends_no_middle_and_no_indent_and_the_windows_end_with_a_line_break():
    ctx = fim_ctx_local(BUFFER, 4, 3)
    assert ctx.prefix == "import os\n\ndef add(a, b):\n"
    assert ctx.middle == "" and ctx.indent == 0
    assert ctx.suffix == "\n\ndef sub(a, b):\n    return a - b\n"


def test_mid_line_the_middle_is_the_line_before_the_cursor_and_the_indent_what_it_starts_with():
    lines = BUFFER[:3] + ["    ret x"] + BUFFER[4:]
    ctx = fim_ctx_local(lines, 7, 3)
    assert ctx.middle == "    ret" and ctx.indent == 4 and ctx.suffix.startswith(" x\n\n")


def test_the_prefix_window_is_256_lines_and_the_suffix_window_64():
    lines = [f"x{i}" for i in range(400)]
    ctx = fim_ctx_local(lines, 0, 300)
    assert ctx.prefix.split("\n")[0] == "x44" and ctx.prefix.endswith("x299\n")
    assert ctx.suffix.split("\n")[1] == "x301" and ctx.suffix.endswith("x364\n")


def test_a_speculative_context_is_the_line_with_the_suggestion_inserted():
    ctx = fim_ctx_local(BUFFER, 4, 3, prev=["return a + b"], indent_last=0)
    assert ctx.middle == "    return a + b" and ctx.prefix.endswith("def add(a, b):\n")
    two = fim_ctx_local(BUFFER, 4, 3, prev=["x = a", "    return x"], indent_last=0)
    assert two.middle == "    return x" and two.prefix.endswith("def add(a, b):\n    x = a\n")


def test_a_response_is_cached_under_the_context_and_the_context_less_its_first_lines():
    hashes = context_hashes(fim_ctx_local(BUFFER, 4, 3))  # a 3-line prefix: trimmed of 1 and 2 lines, not 3
    assert len(hashes) == 3 and len(set(hashes)) == 3
    assert len(context_hashes(fim_ctx_local(["#"] * 5 + BUFFER, 4, 8))) == 4


@pytest.mark.parametrize("content, shown", [
    ("    return a + b\n\n", ["return a + b"]),  # trailing empty lines dropped, indent trimmed against the typed one
    ("        return a + b", ["    return a + b"]),  # deeper than typed: the rest of the indentation stays
    ("  return a + b", ["return a + b"]),
    ("\n\n", None),  # nothing
    ("   \n  ", None),  # whitespace only
    ("\n\ndef sub(a, b):", None),  # only repeats the following lines
    ("\ndef sub(a, b):", ["", "def sub(a, b):"]),  # not quite: llama.vim shows it
])
def test_the_display_is_llama_vims(content, shown):
    assert render(content, BUFFER, 4, 3) == shown


def test_a_suggestion_that_is_the_next_non_blank_line_is_discarded():
    lines = ["def f():", "    ", "", "    return 1"]
    assert render("    return 1", lines, 4, 1) is None
    assert render("    return 2", lines, 4, 1) == ["return 2"]


def test_kept_characters_are_the_common_prefix_with_what_was_written():
    assert kept_chars("return a + b\n    x", "return a + c\n") == 11
    assert kept_chars("", "abc") == 0
    text = "def f(a):\n    x = a\n\n    return x\n"
    episode = plan_episode(text, find_functions(text)[0], 5, __import__("random").Random(0))
    assert written_from(episode, 0) == "x = a\n\n    return x" and written_from(episode, 1) == "return x"


class _Stub(BaseHTTPRequestHandler):
    replies: list[str] = []
    bodies: list[dict] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Stub.bodies.append(body)
        content = _Stub.replies.pop(0) if body["n_predict"] and _Stub.replies else ""
        out = json.dumps({"content": content, "timings": {"predicted_n": 3, "predicted_ms": 30.0}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture
def stub_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Stub.replies, _Stub.bodies = [], []
    server = llama_vim.LlamaServer.__new__(llama_vim.LlamaServer)
    server.port = httpd.server_address[1]
    yield server
    httpd.shutdown()


def test_the_editor_asks_as_llama_vim_then_speculates_and_the_next_line_comes_from_the_cache(stub_server):
    async def scenario():
        vim = llama_vim.LlamaVim(stub_server, seed=0, speculative=True)
        vim.set_text("\n".join(BUFFER) + "\n")
        _Stub.replies = ["    x = a + b\n", "\n    return x\n"]
        first = await vim.ask(4, 3)
        await vim.idle()
        # the person writes the suggested line, Enter, the editor indents: the speculative answer is ready
        vim.set_text("\n".join(BUFFER[:3] + ["    x = a + b", "    "] + BUFFER[4:]) + "\n")
        second = await vim.ask(4, 4)
        await vim.idle()
        await asyncio.sleep(0.3)  # the automatic request waits for the speculative one in 100 ms retries
        await vim.idle()
        await vim.close()
        return first, second

    first, second = asyncio.run(scenario())
    assert first.how == "request" and first.text == "x = a + b"
    body = _Stub.bodies[0]
    assert body["prompt"] == "" and body["n_indent"] == 0 and body["n_predict"] == 128
    assert body["t_max_predict_ms"] == 250 and body["cache_prompt"] and body["samplers"] == ["top_k", "top_p", "infill"]
    speculative = _Stub.bodies[1]
    assert speculative["t_max_predict_ms"] == 1000 and speculative["prompt"] == "    x = a + b"
    assert second.how == "cache" and second.text == "return x"
    # shown from the cache, then the speculative request after it, then the automatic one at the cursor (its own
    # context was not cached: the suggestion came from the look-back)
    later = [(b["prompt"], b["t_max_predict_ms"]) for b in _Stub.bodies[2:] if b["n_predict"]]
    assert later == [("    return x", 1000), ("", 250)]


def test_the_session_applies_the_persons_edits_and_counts_the_tokens_of_measured_requests(stub_server):
    from lsprotocol import types

    async def scenario():
        session = llama_vim.LlamaVimSession(stub_server, seed=0, speculative=False)
        uri = "file:///w/a.py"
        session.open(uri, "\n".join(BUFFER) + "\n")
        session.cursor(uri, types.Position(3, 4))
        _Stub.replies = ["    return a + b\n"]
        first = await session.inline(uri, types.Position(3, 4))
        session.insert(uri, types.Position(3, 4), "return a + b")
        session.close(uri)
        return first, session.texts, await session.stats()

    (ms, text, how, before, after), texts, stats = asyncio.run(scenario())
    assert text == "return a + b" and how == "model" and ms > 0
    # 3 tokens: the first came with the prompt's pass (prompt_ms), 2 after it in predicted_ms, one pass each
    assert after["generated_tokens"] - before["generated_tokens"] == 2 and after["decode_ms"] == 30.0
    assert after["decode_steps"] == 2 and after["predicted_n"] == 3
    assert stats["requests_sent"] == 1 and texts == {}


def test_accepted_draft_tokens_are_tokens_without_a_pass_of_their_own(stub_server):
    session = llama_vim.LlamaVimSession(stub_server, seed=0, speculative=False)
    session.count({"predicted_n": 11, "predicted_ms": 50.0, "draft_n": 12, "draft_n_accepted": 6})
    session.count({"predicted_n": 1, "predicted_ms": 0.001})  # stopped at once: nothing after the first token
    assert session.generated == {"generated_tokens": 10, "decode_steps": 4, "decode_ms": 50.001}


def test_speculation_is_llama_vims_server_with_the_documented_draft_settings():
    from benchmarks.bench_replay import CONFIGS, LLAMAS

    assert LLAMAS == ("llama-server", "llama-server-ngram-mod", "llama-server-ngram-cache")
    mod = CONFIGS["llama-server-ngram-mod"]
    assert mod[:len(llama_vim.SERVER_FLAGS)] == llama_vim.SERVER_FLAGS
    assert " ".join(mod[len(llama_vim.SERVER_FLAGS):]) == (
        "--spec-type ngram-mod --spec-ngram-mod-n-match 24 --spec-ngram-mod-n-min 48 --spec-ngram-mod-n-max 64")
    assert CONFIGS["llama-server-ngram-cache"][-2:] == ("--spec-type", "ngram-cache")


def test_the_table_puts_llama_server_beside_rest_and_says_when_it_cannot_answer():
    from benchmarks.bench_replay import add_summary, table

    requests = []
    for config, ms, text in (("rest", 300.0, "x = 1"), ("plain", 600.0, "x = 1"), ("llama-server", 900.0, "x = 2")):
        for step in range(3):
            requests.append({"config": config, "corpus": "json", "mode": "line", "file": "t.py", "function": "f",
                             "step": step, "kind": "line-start", "line": 5 + step, "text": text, "ms": ms + step,
                             "first_after_open": step == 0, "answer": "model", "first_line_match": text == "x = 1",
                             "shown_chars": 5, "kept_chars": 5 if text == "x = 1" else 4, "generated_tokens": 4,
                             "decode_steps": 2 if config == "rest" else 4, "decode_ms": 40.0})
    results = {"requests": requests, "processes": [], "modes": ["line"], "functions_per_corpus": 1, "max_lines": 3,
               "plans": [{"corpus": "/x/json"}], "seed": 0, "pause_ms": 0, "max_new_tokens": 8, "model": "m",
               "driver": "d", "load_average_before_after": [0, 0], "cpu_count": 2}
    configs = ["rest", "plain", "llama-server"]
    add_summary(results, configs)
    out = table(results, configs)
    assert "| line mode | rest | plain | llama-server | rest/plain | rest/llama-server |" in out
    assert "| first line exactly right | 3/3 | 3/3 | 0/3 | 1.00x | - |" in out
    assert "| characters kept (common prefix with what was written) / shown | 15/15 | 15/15 | 12/15 | 1.00x | 1.25x |" in out
    assert "Identical suggestions: 3/3" in out  # llama-server is not held to rest-lsp's exactness
    results["processes"] = [{"config": "llama-server", "mode": "line", "final_stats": {},
                             "unsupported": "Infill is not supported by this model"}]
    add_summary(results, configs)
    assert "llama-server answered no request with this model: Infill is not supported" in table(results, configs)
