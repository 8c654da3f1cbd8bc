"""JSON over HTTP(S) to a team's server, on the standard library: a kept-alive connection per thread, the bearer
token, the workspace's routing header (its id, percent-encoded) and its key on every call. Torch-free and ray-free
(the editor's side). A certificate that does not verify is an Untrusted naming its cause (TLS_CAUSES)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from urllib.parse import urlsplit

from rest_lsp.team.identity import KEY_HEADER, quoted
from rest_lsp.team.protocol import CLOSING, WORKSPACE_HEADER

# OpenSSL's verify codes (X509_V_ERR_*) by the cause the editor is told of
TLS_CAUSES = {9: "not_yet_valid", 10: "expired", 62: "wrong_host", 64: "wrong_host", 18: "unknown_ca",
              19: "unknown_ca", 20: "unknown_ca", 21: "unknown_ca", 2: "unknown_ca"}


class Unreachable(Exception):
    """No answer from the server (refused, reset, timed out, or a replica that died: Serve's 5xx)."""


class TimedOut(Unreachable):
    """The server took longer than the call's timeout."""


class Untrusted(Unreachable):
    """The server's certificate did not verify; `cause`: expired, not_yet_valid, wrong_host, unknown_ca or other."""

    def __init__(self, message: str, cause: str = "other"):
        super().__init__(message)
        self.cause = cause


class Refused(Exception):
    """The server answered no (4xx); `status` and `detail` say why."""

    def __init__(self, status: int, detail: str, body: object = None):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail, self.body = status, detail, body


class Http:
    def __init__(self, url: str, token: str, workspace: str, timeout_s: float = 30.0, ca_file: str | None = None,
                 key: str | None = None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--remote wants an http:// or https:// URL, got {url!r}")
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._base = parts.path.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", WORKSPACE_HEADER: quoted(workspace),
                         "Content-Type": "application/json"}
        if key is not None:
            self._headers[KEY_HEADER] = key
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
             closing: bool = False, raw: bytes | None = None, content_type: str = "application/octet-stream"):
        """The decoded JSON answer; Unreachable or Refused otherwise. A kept-alive connection the server closed
        meanwhile is opened again once. `closing`: the workspace's last request (protocol.CLOSING). `raw`: bytes
        sent as they are (as `content_type`) instead of `body` made JSON here."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        headers = self._headers
        if closing:
            headers = {**headers, WORKSPACE_HEADER: headers[WORKSPACE_HEADER] + CLOSING}
        if raw is not None:
            headers = {**headers, "Content-Type": content_type}
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
                raise Untrusted(err.verify_message or str(err), TLS_CAUSES.get(err.verify_code, "other")) from None
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
