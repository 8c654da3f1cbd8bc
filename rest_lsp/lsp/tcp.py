"""`--tcp`: the language server on a socket for one client, loopback by default, a token where one is set."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
from typing import Any

from pygls.exceptions import JsonRpcException
from pygls.io_ import run_async
from pygls.lsp.server import LanguageServer

from rest_lsp.auth import TokenError, is_loopback, read_token
from rest_lsp.lsp import admission

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
FIRST_MESSAGE_SECONDS = 30.0  # a connection that sends no message by then is closed
MAX_FIRST_BODY = 1 << 20  # bytes: an initialize is a few KB; a refused peer may not make us buffer more


def parse_address(text: str) -> tuple[str, int]:
    """'PORT', 'HOST:PORT' or '[IPv6]:PORT' -> (host, port); ValueError with one sentence otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = LOOPBACK, text
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"--tcp wants an IPv6 host in brackets, e.g. [::1]:PORT, got {text!r}.")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--tcp wants PORT, HOST:PORT or [IPv6]:PORT (a port 1-65535), got {text!r}.")
    return host, int(port)


def run(server: LanguageServer, address: str, token_file: str | None) -> int:
    """Serve one client on `address` until it leaves; 2 (after one sentence on stderr) when it cannot start."""
    try:
        host, port = parse_address(address)
        token = read_token(token_file) if token_file else None
    except (ValueError, TokenError) as err:
        print(f"rest-lsp: {err}", file=sys.stderr)
        return 2
    if not is_loopback(host):
        if token is None:
            print(f"rest-lsp: --tcp on {host} (not a loopback address) needs --token-file: anyone who can reach the "
                  "port would read your code.", file=sys.stderr)
            return 2
        log.warning("Listening on %s:%d, not a loopback address: anyone who can reach it and holds the token reads "
                    "this workspace's code; traffic is not encrypted.", host, port)
    try:
        OneClient(server, token).serve(host, port)
    except OSError as err:
        print(f"rest-lsp: cannot listen on {address} ({err.strerror or err}).", file=sys.stderr)
        return 2
    return 0


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The body of the next LSP message (Content-Length framing), or None at its end or on garbage."""
    length = None
    try:
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                return None
            if not line.strip():
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip()) if value.strip().isdigit() else -1
        if length is None or not 0 < length <= limit:
            return None
        return await reader.readexactly(length)
    except (ValueError, asyncio.IncompleteReadError, ConnectionError):  # an overlong line, a cut body, a reset
        return None


def _decode(body: bytes | None) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


class OneClient:
    """Listens on one address; the first connection whose first message is an admitted `initialize` becomes the
    client, and the server ends when it leaves (as pygls' start_tcp). Any other connection gets, for each of its
    requests, an error saying why, and nothing else, until it closes."""

    def __init__(self, server: LanguageServer, token: str | None):
        self.server, self.token = server, token
        self.client: asyncio.StreamWriter | None = None

    def serve(self, host: str, port: int) -> None:
        self.server._stop_event = threading.Event()  # pygls' shutdown() sets it and closes server._server

        async def listen() -> None:
            self.server._server = await asyncio.start_server(self.connection, host, port)
            log.info("Serving on %s", ", ".join(str(s.getsockname()) for s in self.server._server.sockets))
            async with self.server._server:
                await self.server._server.serve_forever()

        try:
            asyncio.run(listen())
        except asyncio.CancelledError:  # shutdown() closed the listener
            pass

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            body = await asyncio.wait_for(read_frame(reader, MAX_FIRST_BODY), FIRST_MESSAGE_SECONDS)
        except asyncio.TimeoutError:
            body = None
        first = _decode(body)
        if first is None:
            writer.close()
            return
        reason = admission.BUSY if self.client is not None else admission.admit(first, self.token)
        if reason is not None:
            log.warning("Refused a connection from %s: %s", writer.get_extra_info("peername"), reason)
            await self.refuse(first, reader, writer, reason)
            return
        self.client = writer
        await self.attend(first, reader, writer)

    async def attend(self, first: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The admitted client: its initialize goes to pygls first, then the rest of its stream."""
        protocol = self.server.protocol
        protocol.set_writer(writer)
        try:
            protocol.handle_message(json.loads(json.dumps(first), object_hook=protocol.structure_message))
        except JsonRpcException as err:  # params pygls cannot read: say so (the client may initialize again)
            log.warning("The first initialize was refused: %s", err)
            protocol._send_response(first["id"], None, err.to_response_error())
        try:
            await run_async(stop_event=self.server._stop_event, reader=reader, protocol=protocol, logger=log,
                            error_handler=self.server.report_server_error)
        except ConnectionError as err:  # a reset: the client is gone all the same
            log.info("The client's connection ended: %s", err)
        finally:
            self.server.shutdown()

    async def refuse(self, message: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     reason: str) -> None:
        """Answer each request with `reason` until the peer closes: a socket closed at once would turn its next
        write into a broken pipe instead of telling it why."""
        try:
            while True:
                if isinstance(message, dict) and "method" in message and message.get("id") is not None:
                    body = json.dumps({"jsonrpc": "2.0", "id": message["id"],
                                       "error": {"code": -32600, "message": reason}}).encode()
                    writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()  # a peer that never reads stops being read
                body = await read_frame(reader, MAX_FIRST_BODY)
                if body is None:
                    break
                message = _decode(body)
        except ConnectionError:
            pass
        finally:
            writer.close()
