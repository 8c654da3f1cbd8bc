"""A snapshot sent in chunks: its JSON gzip-compressed, cut into numbered slices of at most CHUNK_BYTES, each one
request with a timeout of its own (so a slow link that makes progress is never cut off, and a dead one is found a
chunk's time after it stops), then a commit that names the count and the sha256 of the JSON. A connection that
drops is resumed: the server says which chunks it holds and only the others go again. A server without the chunk
routes (it answers 404) is an OldServer: the caller sends the snapshot in one request instead.

The routes, under /v1/workspaces/{workspace}/snapshot/chunks/{upload_id}: POST /{index} (the raw bytes), GET (which
arrived: {"received": [indexes]}), POST /commit ({"count": N, "sha256": hex}: the one-shot snapshot route's answer).
Slices grow or shrink with the measured rate so that one takes about CHUNK_S.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import secrets
import threading
import time

from rest_lsp.team.backoff import Backoff
from rest_lsp.team.http import Http, Refused, Unreachable

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20  # the most a chunk may hold (the server's limit)
FIRST_CHUNK_BYTES = 64 << 10  # before the link's rate is known
LEAST_CHUNK_BYTES = 16 << 10
CHUNK_S = 10.0  # a chunk's size aims at this long at the measured rate
FIRST_RATE = 16_000  # bytes/s assumed before a chunk has landed
SLACK_S = 30.0  # a chunk's timeout: this, plus four times its expected time
TRIES_WITHOUT_PROGRESS = 4  # failures in a row with no chunk landing in between: the upload is given up
RETRY_FIRST_S, RETRY_MOST_S = 1.0, 16.0
COMMIT_TRIES = 3
GZIP_LEVEL = 6


class OldServer(Exception):
    """The server has no chunk routes (404): send the snapshot in one request."""


def one_shot_timeout(size: int) -> float:
    """A snapshot in one request: SLACK_S plus its time at a slow link's rate (never fixed for every size)."""
    return max(120.0, SLACK_S + 4 * size / FIRST_RATE)


class ChunkedUpload:
    def __init__(self, http: Http, base: str, payload: bytes, stop: threading.Event):
        """`base`: the workspace's snapshot path (.../workspaces/{quoted id}/snapshot); `payload`: its JSON."""
        self._http, self._stop = http, stop
        self.upload_id = secrets.token_urlsafe(12)
        self._path = f"{base}/chunks/{self.upload_id}"
        self.sha256 = hashlib.sha256(payload).hexdigest()
        self.data = gzip.compress(payload, GZIP_LEVEL)
        self.slices: list[tuple[int, int]] = []  # (start, end) of chunk i in `data`, cut as they are sent
        self.landed: set[int] = set()
        self.rate = float(FIRST_RATE)
        self.sent_requests = 0  # chunk requests made, resent ones included

    def send(self) -> dict:
        """The commit's answer (the server's SyncReply); OldServer, Refused or Unreachable otherwise."""
        failures, resuming, backoff = 0, False, Backoff(RETRY_FIRST_S, RETRY_MOST_S)
        while True:
            before = len(self.landed)
            try:
                if resuming:
                    self._ask_received()
                self._send_chunks()
                return self._commit()
            except Unreachable as err:  # a dropped connection, a timeout, a replica that died
                failures = 1 if len(self.landed) > before else failures + 1
                if failures >= TRIES_WITHOUT_PROGRESS or self._stop.is_set():
                    raise
                log.info("snapshot upload %s: %s; %d of %d chunks landed, resuming", self.upload_id, err,
                         len(self.landed), len(self.slices))
                if self._stop.wait(backoff.next()):
                    raise
                resuming = True

    def _send_chunks(self) -> None:
        for index in [i for i in range(len(self.slices)) if i not in self.landed]:
            self._send(index)
        while not self.slices or self.slices[-1][1] < len(self.data):
            start = self.slices[-1][1] if self.slices else 0
            size = FIRST_CHUNK_BYTES if not self.landed else int(self.rate * CHUNK_S)
            self.slices.append((start, min(len(self.data), start + max(LEAST_CHUNK_BYTES, min(CHUNK_BYTES, size)))))
            self._send(len(self.slices) - 1)

    def _send(self, index: int) -> None:
        start, end = self.slices[index]
        size = end - start
        timeout = SLACK_S + 4 * size / self.rate
        began = time.monotonic()
        self.sent_requests += 1
        try:
            self._http.call("POST", f"{self._path}/{index}", raw=self.data[start:end], timeout=timeout)
        except Refused as err:
            if err.status == 404:
                raise OldServer(str(err)) from None
            raise
        self.landed.add(index)
        self.rate = max(1000.0, size / max(time.monotonic() - began, 1e-3))

    def _ask_received(self) -> None:
        """What the server holds of this upload (none after a replica died: it starts over)."""
        try:
            found = self._http.call("GET", self._path, timeout=SLACK_S)
        except Refused as err:
            if err.status == 404:
                raise OldServer(str(err)) from None
            raise
        held = found.get("received", []) if isinstance(found, dict) else []
        self.landed = {i for i in held if isinstance(i, int) and 0 <= i < len(self.slices)}

    def _commit(self) -> dict:
        """The commit; chunks the server lost meanwhile (a replica that restarted) are sent again first."""
        body = {"count": len(self.slices), "sha256": self.sha256}
        timeout = SLACK_S + 4 * len(self.data) / 1e6  # the server decompresses and applies it before it answers
        for _ in range(COMMIT_TRIES - 1):
            try:
                return self._http.call("POST", f"{self._path}/commit", body, timeout=timeout)
            except Refused as err:
                if not _chunks_missing(err):
                    raise
            self._ask_received()
            self._send_chunks()
        return self._http.call("POST", f"{self._path}/commit", body, timeout=timeout)


def _chunks_missing(err: Refused) -> bool:
    """The server's answer to a commit of chunks it does not all hold (409, kind "snapshot")."""
    return err.status == 409 and isinstance(err.body, dict) and err.body.get("kind") == "snapshot"
