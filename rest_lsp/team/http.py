"""JSON over HTTP(S) to a team's server, on the standard library: a kept-alive connection per thread, the bearer
token and the workspace's routing header on every call. Torch-free and ray-free (the editor's side)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from urllib.parse import urlsplit

from rest_lsp.team.protocol import CLOSING, WORKSPACE_HEADER


class Unreachable(Exception):
    """No answer from the server (refused, reset, timed out, or a replica that died: Serve's 5xx)."""


class TimedOut(Unreachable):
    """The server took longer than the call's timeout."""


class Untrusted(Unreachable):
    """The server's certificate did not verify (a self-signed one without its CA file, another host's name)."""


class Refused(Exception):
    """The server answered no (4xx); `status` and `detail` say why."""

    def __init__(self, status: int, detail: str, body: object = None):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail, self.body = status, detail, body


class Http:
    def __init__(self, url: str, token: str, workspace: str, timeout_s: float = 30.0, ca_file: str | None = None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--remote wants an http:// or https:// URL, got {url!r}")
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._base = parts.path.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", WORKSPACE_HEADER: workspace,
                         "Content-Type": "application/json"}
        self._local = threading.local()
        # https: the system's CAs, or only `ca_file`'s (a team's self-signed certificate); the host name is checked
        self._tls = ssl.create_default_context(cafile=ca_file) if parts.scheme == "https" else None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._scheme == "https":
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._tls)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def call(self, method: str, path: str, body: object = None, timeout: float | None = None,
             closing: bool = False):
        """The decoded JSON answer; Unreachable or Refused otherwise. A kept-alive connection the server closed
        meanwhile is opened again once. `closing`: the workspace's last request (protocol.CLOSING)."""
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers
        if closing:
            headers = {**headers, WORKSPACE_HEADER: headers[WORKSPACE_HEADER] + CLOSING}
        for attempt in (0, 1):
            conn = self._connection(timeout or self.timeout_s)
            try:
                conn.request(method, self._base + path, body=data, headers=headers)
                reply = conn.getresponse()
                raw = reply.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as err:
                self.close()
                if attempt:
                    raise Unreachable(str(err) or type(err).__name__) from None
            except ssl.SSLCertVerificationError as err:
                self.close()
                raise Untrusted(err.verify_message or str(err)) from None
            except (TimeoutError, socket.timeout) as err:
                self.close()
                raise TimedOut(str(err) or "timed out") from None
            except (OSError, http.client.HTTPException) as err:
                self.close()
                raise Unreachable(str(err) or type(err).__name__) from None
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = raw.decode("utf-8", "replace")[:200]
        if reply.status >= 500:
            raise Unreachable(f"HTTP {reply.status}: {answer}")
        if reply.status >= 400:
            detail = answer.get("detail") if isinstance(answer, dict) else answer
            raise Refused(reply.status, str(detail), answer)
        return answer
