"""A credential (a .env, a key, a file below ~/.ssh: ignore.is_secret's rule) never goes to the team server: the mirror
leaves it out of snapshots and deltas whatever put it in the local datastore (rest_lsp/team/mirror.py), and the
editor's buffer of one is neither sent as a hint nor as a completion request (rest_lsp/team/remote.py)."""

from __future__ import annotations

from rest_lsp.datastore import Source
from rest_lsp.settings import Settings
from rest_lsp.team.mirror import Mirror, RecordingDatastore
from rest_lsp.team.remote import RemoteService


def test_credentials_are_left_out_of_snapshots_and_deltas(tmp_path):
    ds = RecordingDatastore(background_merges=False)
    code, env, key = (str(tmp_path / rel) for rel in ("main.py", "app/.env", ".ssh/id_ed25519"))
    try:
        ds.put(code, list(b"def main(): pass\n"), Source.WORKSPACE)
        ds.put(env, list(b"DB_PASSWORD=hunter2\n"), Source.OPEN_BUFFER)
        mirror = Mirror(ds, "bytes")
        assert [d.doc_id for d in mirror.snapshot({}).docs] == [code]

        ds.put(key, list(b"-----BEGIN OPENSSH PRIVATE KEY-----\n"), Source.OPEN_BUFFER)
        ds.put("buffer:untitled:.env", list(b"TOKEN=abc\n"), Source.OPEN_BUFFER)
        assert mirror.delta() is None  # only credentials changed: nothing to send

        ds.put(env, list(b"DB_PASSWORD=changed\n"), Source.OPEN_BUFFER)
        ds.put(code, list(b"def main(): return 1\n"), Source.OPEN_BUFFER)
        delta = mirror.delta()
        assert [d.doc_id for d in delta.puts] == [code] and delta.removes == []

        ds.remove(env)
        assert mirror.delta() is None
    finally:
        ds.close()


class RecordingHttp:
    def __init__(self):
        self.bodies = []

    def call(self, method, path, body=None, timeout=None):
        self.bodies.append(body)
        return {"text": None, "replica": "r0"}


def test_a_credentials_buffer_sends_neither_hints_nor_completion_requests(tmp_path):
    service = RemoteService(Settings(cache_dir=str(tmp_path / "cache")), None, "http://127.0.0.1:9", "token")
    service.status, service._http = "connected", RecordingHttp()
    env, code = str(tmp_path / ".env"), str(tmp_path / "main.py")
    try:
        for doc_id in (env, "buffer:untitled:.env"):
            service.expect(doc_id, "DB_PASSWORD=hunter2\n", 3)
            service.moved(doc_id, "DB_PASSWORD=hunter2\n", 3)
            assert service._events == []  # no hint waits to ride along with the next request
            assert service.submit(doc_id, "DB_PASSWORD=hunter2\n", 3).future.result(30) is None
        assert service._http.bodies == []
        # the same calls for code do reach the server
        service.expect(code, "x = 1\n", 3)
        assert service.submit(code, "x = 1\n", 3).future.result(30) is None
        assert [b["doc_id"] for b in service._http.bodies] == [code]
        assert [e["doc_id"] for e in service._http.bodies[0]["events"]["events"]] == [code]  # the hint rode along
    finally:
        service.status = "closed"
        service.close()
