"""An LSP tap: runs the server as a child and passes every message through, writing each one to a log.

    python lsp_tap.py LOG.jsonl -- SERVER_COMMAND [ARGS...]

The end-to-end test puts it between VS Code and rest-lsp, so that it can read what the server was asked and what
it answered (the completion shown at a position, the `rest-lsp.accept` it received) without trusting either side's
own account. Each log line is {"dir": "client->server" | "server->client", "msg": <the JSON-RPC message>}.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import BinaryIO


def read_message(stream: BinaryIO) -> bytes | None:
    """One framed message's body, or None at the end of the stream."""
    length = None
    while True:
        line = stream.readline()
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("ascii").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length is None:
        raise ValueError("an LSP message without a Content-Length header")
    body = stream.read(length)
    return body if len(body) == length else None


class Log:
    def __init__(self, path: str):
        self.file = open(path, "a", encoding="utf-8")
        self.lock = threading.Lock()

    def write(self, direction: str, body: bytes) -> None:
        try:
            msg = json.loads(body)
        except ValueError:
            msg = {"unparsed": body.decode("utf-8", "replace")}
        with self.lock:
            self.file.write(json.dumps({"dir": direction, "msg": msg}) + "\n")
            self.file.flush()


def pump(source: BinaryIO, sink: BinaryIO, log: Log, direction: str) -> None:
    """Copies messages until the source ends, then closes the sink (the peer sees the end too)."""
    try:
        while (body := read_message(source)) is not None:
            log.write(direction, body)
            sink.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            sink.flush()
    except (BrokenPipeError, ValueError, OSError):
        pass
    finally:
        try:
            sink.close()
        except OSError:
            pass


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: lsp_tap.py LOG.jsonl -- SERVER_COMMAND [ARGS...]", file=sys.stderr)
        return 2
    log = Log(argv[0])
    server = subprocess.Popen(argv[2:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    to_server = threading.Thread(target=pump, args=(sys.stdin.buffer, server.stdin, log, "client->server"),
                                 daemon=True)
    to_server.start()
    pump(server.stdout, sys.stdout.buffer, log, "server->client")
    return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
