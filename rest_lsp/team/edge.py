"""What a replica checks before a route's handler runs: the size of a body (413 past its route's limit) and the
shape of a body (422), each refusal one sentence that names the field and never holds the input.

FastAPI's stock 422 is a list of pydantic errors that echoes the input whole (and cannot be written at all when
the input holds a NaN); `sentence` makes one sentence of the first error instead. A body is read whole, up to its
route's limit, before the route sees it: past the limit the replica stops reading and answers 413.
"""

from __future__ import annotations

import json
import re

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from rest_lsp.team.protocol import API

MIB = 1 << 20
SNAPSHOT_BYTES = 48 * MIB  # a snapshot's JSON, in one request or decompressed from chunks (uploads.py)
CHUNK_BYTES = 4 * MIB  # one chunk of a snapshot sent in chunks
# The most a body may hold, by the route's last fixed path part; any other route takes DEFAULT_BYTES
BODY_BYTES = {"snapshot": SNAPSHOT_BYTES, "chunk": CHUNK_BYTES, "delta": 16 * MIB, "complete": 8 * MIB,
              "events": 8 * MIB}
DEFAULT_BYTES = 1 * MIB
DRAIN_BYTES = 256 * MIB  # a body past its limit read (and dropped) to its end before the 413, up to this
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_PLACES = {"body": "the body's", "path": "the path's", "header": "the header", "query": "the query's"}
MOST_CHARS = 300  # a refusal's sentence


def body_limit(path: str) -> int:
    """The most bytes a request to `path` may send."""
    parts = path[len(API) + 1:].split("/") if path.startswith(API + "/") else []
    if len(parts) >= 6 and parts[0] == "workspaces" and parts[2:4] == ["snapshot", "chunks"] and parts[-1].isdigit():
        return BODY_BYTES["chunk"]
    if len(parts) == 3 and parts[0] == "workspaces":
        return BODY_BYTES.get(parts[2], DEFAULT_BYTES)
    return DEFAULT_BYTES


def sentence(errors: list[dict]) -> str:
    """One sentence for pydantic's errors: the first one's field and what it should be (never its input)."""
    if not errors:
        return "The request is not valid."
    error = errors[0]
    loc = list(error.get("loc", ()))
    if error.get("type") == "json_invalid":
        return "The request's body is not valid JSON."
    if loc == ["body"] and error.get("type") == "missing":
        return "The request has no JSON body."
    place = _PLACES.get(str(loc[0]), "the body's") if loc and str(loc[0]) in _PLACES else "the body's"
    if loc and str(loc[0]) in _PLACES:
        loc = loc[1:]
    field = _field(loc) or "body"
    msg = str(error.get("msg", "is not valid")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    text = f"{place[0].upper()}{place[1:]} field {field} is not valid: {msg[:1].lower()}{msg[1:]}".rstrip(".")
    return text[: MOST_CHARS - 1] + "."


def _field(loc: list) -> str:
    """`docs[0].tokens[3]`: model field names and indexes as they are, anything else (a key the client chose,
    a type tag of pydantic's) as `[…]`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _NAME.match(str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += "[…]"
    return out


async def invalid_request(request, err: RequestValidationError) -> JSONResponse:
    return JSONResponse({"detail": sentence(err.errors())}, status_code=422)


async def invalid_model(request, err: ValidationError) -> JSONResponse:
    return JSONResponse({"detail": sentence(err.errors(include_input=False))}, status_code=422)


class BodyLimit:
    """ASGI middleware: reads a request's body whole, up to its route's limit (`body_limit`), then hands it on;
    a larger one (by its Content-Length or as it arrives) is answered 413 and not read further."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = body_limit(scope.get("path", ""))
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await _too_large(receive, send, limit, int(length) if length.isdigit() else None)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > limit:
                return await _too_large(receive, send, limit, None, more)
        body, sent = b"".join(chunks), [False]

        async def replay():
            if sent[0]:
                return await receive()  # the app waits for a disconnect
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


async def _too_large(receive, send, limit: int, length: int | None, more: bool = True) -> None:
    """413. A body up to DRAIN_BYTES is read to its end first, each piece dropped as it comes (the memory of one
    piece): a client that sends its whole body before it reads the answer (most do) then reads the 413 rather
    than a connection cut under it. A larger one is cut."""
    if more and (length is None or length <= DRAIN_BYTES):
        drained = 0
        while more and drained <= DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            more = message.get("more_body", False)
    body = json.dumps({"detail": f"The request's body is larger than the {limit // MIB} MiB this route takes."}
                      ).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
