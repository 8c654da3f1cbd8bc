"""A team server the editor's side can be tested against without a model: the routes the client calls, on a local
http.server, each request recorded, its answers set by the test (a tokenizer of a few words, a refusal, a dropped
connection, an old server without the chunk routes)."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

DROP = object()  # an answer that closes the connection without a reply


def word_tokenizer(words: list[str]) -> dict:
    """The /v1/tokenizer answer for a word-level tokenizer of `words` (another list: another key)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from rest_lsp.engine.saved_tokenizer import tokenizer_key

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    blob = tok.to_str()
    return {"key": tokenizer_key(blob), "tokenizer": blob, "split_special_tokens": False, "vocab_size": len(vocab)}


@dataclass
class Seen:
    method: str
    path: str  # as sent (percent-encoded)
    headers: dict
    body: bytes
    at: float = field(default_factory=time.monotonic)


class FakeTeam:
    """Answers as a replica does; `refuse` (status, body) answers every request so; `chunks` False: an old server
    (404 on the chunk routes); `drop(seen)` True drops that request's connection."""

    def __init__(self, words=("def", "return", "count", "x"), chunks: bool = True, tls=None):
        self.tokenizer = word_tokenizer(list(words))
        self.chunks, self.refuse, self.drop = chunks, None, lambda seen: False
        self.need_snapshot = False
        self.seen: list[Seen] = []
        self.snapshots: list[dict] = []
        self.uploads: dict[str, dict[int, bytes]] = {}
        self._lock = threading.Lock()
        self.server = _Quiet(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def under_workspaces(self) -> list[Seen]:
        return [s for s in self.seen if s.path.startswith("/v1/workspaces/")]

    def answer(self, seen: Seen):
        if self.drop(seen):
            return DROP
        if self.refuse is not None:
            return self.refuse
        if seen.path == "/v1/tokenizer":
            return 200, self.tokenizer
        parts = seen.path.split("/")[4:]  # after /v1/workspaces/{id}
        route = "/".join(p for p in parts if not re.fullmatch(r"[A-Za-z0-9_-]{12,}|\d+", p))
        if route.startswith("snapshot/chunks"):
            return self._chunk(seen, parts) if self.chunks else (404, {"detail": "Not Found"})
        if route == "snapshot":
            return self._snapshot(json.loads(seen.body))
        if route == "complete":
            need, self.need_snapshot = self.need_snapshot, False
            return 200, {"text": " 1", "id": 1, "tokens": 1, "steps": 1, "latency_ms": 1.0, "source": "model",
                         "need_snapshot": need, "replica": "f0"}
        if route == "drafts":
            return 200, []
        return 200, {"epoch": None, "seq": 0, "replica": "f0"}

    def _snapshot(self, body: dict):
        if body["tokenizer_key"] != self.tokenizer["key"]:
            return 409, {"detail": "This replica runs another tokenizer.", "kind": "tokenizer"}
        with self._lock:
            self.snapshots.append(body)
        return 200, {"epoch": body["epoch"], "seq": 0, "replica": "f0"}

    def _chunk(self, seen: Seen, parts: list[str]):
        upload = parts[2]
        with self._lock:
            held = self.uploads.setdefault(upload, {})
            if seen.method == "GET":
                return 200, {"received": sorted(held)}
            if parts[-1] != "commit":
                held[int(parts[-1])] = seen.body
                return 200, {"received": int(parts[-1])}
        commit = json.loads(seen.body)
        if sorted(held) != list(range(commit["count"])):
            return 409, {"detail": "chunks are missing", "kind": "snapshot"}
        text = gzip.decompress(b"".join(held[i] for i in range(commit["count"])))
        assert hashlib.sha256(text).hexdigest() == commit["sha256"]
        return self._snapshot(json.loads(text))


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that gave up (a timeout the test wants) breaks the pipe of its answer


def _handler(team: FakeTeam):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _any(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen = Seen(self.command, self.path, dict(self.headers), body)
            team.seen.append(seen)
            got = team.answer(seen)
            if got is DROP:
                self.close_connection = True
                return
            status, answer = got
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _any

    return Handler


def decoded_id(seen: Seen) -> str:
    """The workspace id a request names in its path."""
    return unquote(seen.path.split("/")[3])
