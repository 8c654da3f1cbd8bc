"""Issue 42's scenario, N times: a plain LSP client beside a busy core, and whether `rest-lsp --stdio` survives.

Each run starts a niced `yes > /dev/null` (one core kept busy) and `rest-lsp --stdio` on the default model (the
mode gguf, which the load picked in issue 42; --dtype), then speaks raw JSON-RPC as a plain editor does: initialize
with inlineCompletion, completion, didSave, workspace configuration and workDoneProgress capabilities, answers
the server's own requests, opens the last file of a real package (the standard library's email.mime by default)
and asks `textDocument/inlineCompletion` at its end once a second until the first answer with text. Then shutdown
and exit. A run fails when the server dies before that (its stderr's last lines are printed, glibc's "corrupted
size vs. prev_size" among them in issue 42) or never answers within the time limit.

    .venv/bin/python benchmarks/busy_core_runs.py --runs 20

Prints one line per run and a last line: `runs: N, died: D, no answer: A`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CAPABILITIES = {
    "textDocument": {"inlineCompletion": {"dynamicRegistration": False},
                     "completion": {"completionItem": {"snippetSupport": False}},
                     "synchronization": {"didSave": True}},
    "workspace": {"configuration": True},
    "window": {"workDoneProgress": True},
}


class Rpc:
    """JSON-RPC over the server's stdin and stdout: requests, notifications, and replies to the server's requests."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.next_id, self.replies = proc, 0, {}
        self.cv, self.lock = threading.Condition(), threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _write(self, message: dict) -> None:
        body = json.dumps(message).encode()
        with self.lock:
            self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.proc.stdin.flush()

    def _read(self) -> None:
        out = self.proc.stdout
        try:
            while True:
                length = None
                while (line := out.readline().strip()) != b"":
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length is None:
                    return
                message = json.loads(out.read(length))
                if "method" in message and "id" in message:  # the server asks: configuration, progress tokens
                    self._write({"jsonrpc": "2.0", "id": message["id"],
                                 "result": [{}] * len(message["params"].get("items", []))
                                 if message["method"] == "workspace/configuration" else None})
                elif "id" in message:
                    with self.cv:
                        self.replies[message["id"]] = message
                        self.cv.notify_all()
        except (OSError, ValueError):
            return
        finally:
            with self.cv:
                self.cv.notify_all()

    def notify(self, method: str, params: dict) -> None:
        self._write({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: dict, timeout: float) -> dict | None:
        """The reply, or None when the server died or did not answer in time."""
        self.next_id += 1
        msg_id = self.next_id
        self._write({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        end = time.monotonic() + timeout
        with self.cv:
            while msg_id not in self.replies:
                left = end - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return None
                self.cv.wait(min(left, 0.2))
            return self.replies.pop(msg_id)


def answered(reply: dict) -> bool:
    """Whether an inlineCompletion reply holds a suggestion with text."""
    items = reply.get("result") or {}
    items = items.get("items", []) if isinstance(items, dict) else items
    return any(item.get("insertText") for item in items or [])


def last_file(package: str) -> Path:
    import importlib

    folder = Path(importlib.import_module(package).__file__).parent
    return sorted(folder.glob("*.py"))[-1]


def one_run(server: list[str], path: Path, limit_s: float) -> tuple[str, float, str]:
    """("ok" | "died" | "no answer", seconds to the first answer or to the end, the last reply)."""
    busy = subprocess.Popen(["nice", "-n", "10", "sh", "-c", "exec yes > /dev/null"])
    root = Path(tempfile.mkdtemp(prefix="busy-core-"))
    err = open(root / "server.stderr", "wb")
    proc = subprocess.Popen([*server, "--stdio"], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err)
    start = time.monotonic()
    try:
        rpc = Rpc(proc)
        if rpc.request("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(),
                                      "capabilities": CAPABILITIES}, limit_s) is None:
            return "died" if proc.poll() is not None else "no answer", time.monotonic() - start, ""
        rpc.notify("initialized", {})
        text = path.read_text()
        uri = (root / path.name).as_uri()
        rpc.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                             "text": text}})
        lines = text.split("\n")
        at = {"line": len(lines) - 1, "character": len(lines[-1])}
        reply = None
        while time.monotonic() - start < limit_s:
            asked = time.monotonic()
            reply = rpc.request("textDocument/inlineCompletion",
                                {"textDocument": {"uri": uri}, "position": at, "context": {"triggerKind": 2}}, 1.0)
            if proc.poll() is not None:
                return "died", time.monotonic() - start, ""
            with rpc.cv:  # this reply, or an earlier request's that came after its second
                answers = [reply] + [rpc.replies.pop(i) for i in list(rpc.replies)]
            if any(answered(answer) for answer in answers if answer):
                rpc.request("shutdown", {}, 30)
                rpc.notify("exit", {})
                proc.wait(30)
                return ("ok" if proc.returncode == 0 else "died"), time.monotonic() - start, ""
            time.sleep(max(0.0, 1.0 - (time.monotonic() - asked)))
        return "no answer", time.monotonic() - start, json.dumps(reply)[:300]
    finally:
        busy.kill()
        busy.wait()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
        tail = (root / "server.stderr").read_bytes()[-600:].decode(errors="replace")
        if proc.returncode not in (0, -9):
            print(f"  server exit {proc.returncode}; stderr ends: {tail!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--package", default="email.mime", help="the package whose last file is opened")
    parser.add_argument("--dtype", default="gguf", help="the server's --dtype (gguf: issue 42's mode, without the "
                                                        "timing of the modes a loaded machine repeats every start)")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds a run may take to its first answer")
    parser.add_argument("--server", default=os.path.join(os.path.dirname(sys.executable), "rest-lsp"))
    args = parser.parse_args()
    path = last_file(args.package)
    counts = {"ok": 0, "died": 0, "no answer": 0}
    for i in range(args.runs):
        outcome, seconds, last = one_run([args.server, "--dtype", args.dtype], path, args.limit)
        counts[outcome] += 1
        print(f"run {i + 1}: {outcome} after {seconds:.1f} s" + (f" (last reply: {last})" if last else ""),
              flush=True)
    print(f"runs: {args.runs}, died: {counts['died']}, no answer: {counts['no answer']}")


if __name__ == "__main__":
    main()
