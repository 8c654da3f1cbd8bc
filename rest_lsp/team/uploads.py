"""A snapshot sent in chunks: an editor whose workspace is big, or whose link is slow, sends its snapshot's JSON
gzip-compressed in numbered chunks of at most edge.CHUNK_BYTES, may ask which arrived (to resume after a dropped
connection), then commits: the replica joins them in order, decompresses at most edge.SNAPSHOT_BYTES, checks the
sha256 the editor gives, validates the JSON as a protocol.Snapshot and applies it as the one-shot snapshot route
does. A chunk may be one slice of a gzip stream or a gzip stream of its own: joined, they decompress alike.

Uploads in progress are bounded: per workspace (MOST_PER_WORKSPACE, each at most MOST_UPLOAD_BYTES), per replica
(MOST_BYTES in all), and forgotten IDLE_S after their last chunk. They live in the replica's memory: the router
keeps a workspace's requests on its replica, and a replica that died takes them along (the editor starts over).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse

from rest_lsp.team.edge import CHUNK_BYTES, MIB, SNAPSHOT_BYTES
from rest_lsp.team.protocol import ChunkCommit, ChunksReceived, Problem, Snapshot, SyncReply

MOST_CHUNKS = 1 << 16
MOST_PER_WORKSPACE = 2
MOST_UPLOAD_BYTES = SNAPSHOT_BYTES + MIB  # compressed: gzip may add a little to what does not compress
MOST_BYTES = 4 * SNAPSHOT_BYTES
IDLE_S = 300.0
UPLOAD_ID = r"^[A-Za-z0-9_-]{1,64}$"


class Refused(Exception):
    """An upload the replica does not take or cannot finish: `status`, and one sentence for the editor."""

    def __init__(self, status: int, sentence: str, kind: str | None = None):
        super().__init__(sentence)
        self.status, self.kind = status, kind


@dataclass
class _Upload:
    owner: object  # workspaces.Owner
    upload_id: str
    touched: float
    chunks: dict[int, bytes] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(len(c) for c in self.chunks.values())


class Uploads:
    """A replica's snapshots in progress, by workspace (its Owner: id and key) and upload id."""

    def __init__(self, most_per_workspace: int = MOST_PER_WORKSPACE, most_upload_bytes: int = MOST_UPLOAD_BYTES,
                 most_bytes: int = MOST_BYTES, idle_s: float = IDLE_S, clock: Callable[[], float] = time.monotonic):
        self.most_per_workspace, self.most_upload_bytes = most_per_workspace, most_upload_bytes
        self.most_bytes, self.idle_s, self._clock = most_bytes, idle_s, clock
        self._lock = threading.Lock()
        self._uploads: list[_Upload] = []

    def put(self, owner, upload_id: str, index: int, data: bytes) -> None:
        """Keep chunk `index` (again: the later copy wins)."""
        with self._lock:
            self._expire()
            upload = self._find(owner, upload_id)
            if upload is None:
                if sum(1 for u in self._uploads if u.owner.matches(owner)) >= self.most_per_workspace:
                    raise Refused(429, f"This workspace already sends {self.most_per_workspace} snapshots in chunks; "
                                       "commit or abandon one first.")
                upload = _Upload(owner, upload_id, self._clock())
                self._uploads.append(upload)
            old = len(upload.chunks.get(index, b""))
            if upload.size - old + len(data) > self.most_upload_bytes:
                raise Refused(413, f"A snapshot's chunks may hold {self.most_upload_bytes // MIB} MiB at most.")
            if self.held() - old + len(data) > self.most_bytes:
                raise Refused(429, "The replica holds as many snapshot chunks as it takes now; send them again "
                                   "later.")
            upload.chunks[index] = data
            upload.touched = self._clock()

    def received(self, owner, upload_id: str) -> list[int]:
        with self._lock:
            self._expire()
            upload = self._find(owner, upload_id)
            return sorted(upload.chunks) if upload is not None else []

    def take(self, owner, upload_id: str, count: int, sha256: str) -> bytes:
        """The snapshot's JSON, its chunks joined and decompressed; the upload is gone unless chunks are missing."""
        with self._lock:
            self._expire()
            upload = self._find(owner, upload_id)
            if upload is None:
                raise Refused(409, "No snapshot upload of that id is in progress here; send its chunks again.",
                              "snapshot")
            missing = [i for i in range(count) if i not in upload.chunks]
            if missing or len(upload.chunks) != count:
                raise Refused(409, f"The upload holds {len(upload.chunks)} chunks, not chunks 0 to {count - 1}; "
                                   "send the missing ones, then commit again.", "snapshot")
            self._uploads.remove(upload)
        text = inflate(b"".join(upload.chunks[i] for i in range(count)), SNAPSHOT_BYTES)
        if not hmac.compare_digest(hashlib.sha256(text).hexdigest(), sha256.lower()):
            raise Refused(409, "The chunks decompress to JSON whose sha256 is not the one committed; send the "
                               "snapshot again.", "snapshot")
        return text

    def drop(self, owner) -> None:
        """Forget every upload of a workspace (its editor closed it)."""
        with self._lock:
            self._uploads = [u for u in self._uploads if not u.owner.matches(owner)]

    def held(self) -> int:
        return sum(u.size for u in self._uploads)

    def _find(self, owner, upload_id: str) -> _Upload | None:
        found = None
        for upload in self._uploads:
            if upload.owner.matches(owner) and upload.upload_id == upload_id:
                found = upload
        return found

    def _expire(self) -> None:
        now = self._clock()
        self._uploads = [u for u in self._uploads if now - u.touched <= self.idle_s]


def inflate(data: bytes, most: int) -> bytes:
    """`data` (one or more gzip streams, one after the other) decompressed, refused past `most` bytes."""
    out = bytearray()
    rest = data
    try:
        while rest:
            stream = zlib.decompressobj(wbits=31)
            pending = rest
            while pending and not stream.eof:
                out += stream.decompress(pending, most + 1 - len(out))
                if len(out) > most:
                    raise Refused(413, f"The snapshot decompresses past the {most // MIB} MiB a snapshot may hold.")
                pending = stream.unconsumed_tail
            if not stream.eof:
                raise Refused(422, "The snapshot's chunks end inside a gzip stream: one is missing or cut short.")
            rest = stream.unused_data
    except zlib.error:
        raise Refused(422, "The snapshot's chunks are not gzip-compressed data.") from None
    return bytes(out)


_CHUNK_BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary", "maxLength": CHUNK_BYTES}}}}}


def chunk_routes(api: APIRouter, owned, current, apply) -> None:
    """The three routes of a snapshot in chunks on `api`: `owned` and `current` are the app's dependencies (the
    workspace as its editor's, the replica), `apply(owner, snapshot, replica)` the one-shot route's work."""
    prefix = "/workspaces/{workspace}/snapshot/chunks/{upload_id}"

    @api.post(prefix + "/commit", response_model=SyncReply)
    async def commit(body: ChunkCommit, upload_id: str = Path(pattern=UPLOAD_ID), ws=Depends(owned),
                     r=Depends(current)):
        try:
            text = r.uploads.take(ws, upload_id, body.count, body.sha256)
        except Refused as err:
            return _refusal(err)
        return await apply(ws, Snapshot.model_validate_json(text), r)

    @api.post(prefix + "/{index}", openapi_extra=_CHUNK_BODY)
    async def chunk(request: Request, upload_id: str = Path(pattern=UPLOAD_ID),
                    index: int = Path(ge=0, lt=MOST_CHUNKS), ws=Depends(owned), r=Depends(current)):
        try:
            r.uploads.put(ws, upload_id, index, await request.body())
        except Refused as err:
            return _refusal(err)
        return {"received": index}

    @api.get(prefix)
    async def received(upload_id: str = Path(pattern=UPLOAD_ID), ws=Depends(owned),
                       r=Depends(current)) -> ChunksReceived:
        return ChunksReceived(received=r.uploads.received(ws, upload_id))


def _refusal(err: Refused) -> JSONResponse:
    if err.kind is not None:
        return JSONResponse(Problem(detail=str(err), kind=err.kind).model_dump(), status_code=err.status)
    return JSONResponse({"detail": str(err)}, status_code=err.status)
