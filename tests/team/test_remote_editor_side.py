"""The editor's side of a team server, issue 40: any folder name syncs (its id percent-encoded), every call under
a workspace carries the workspace's own key, a refusal is said once with its cause and asked again later and later,
a server that changed its model gets the workspace indexed again with its tokenizer, and TLS failures get the
advice that matches them. Against the replica app on a local uvicorn (`live`) or fake_team.FakeTeam."""

from __future__ import annotations

import logging
import re
import time
from urllib.parse import quote

import pytest
from fake_team import FakeTeam, decoded_id, word_tokenizer
from support import TEAM_TOKEN as TOKEN
from support import Said, wait_for

from rest_lsp.settings import Settings
from rest_lsp.team import remote
from rest_lsp.team.backoff import Backoff
from rest_lsp.team.identity import KEY_HEADER
from rest_lsp.team.remote import RemoteService

TEXT = "def add(a, b):\n    return a + b\n\nresult = add("
LIB = "def count(x):\n    return x\n"


def editor(url, tmp_path, root, said, **kwargs) -> RemoteService:
    settings = Settings(max_new_tokens=8, debounce_ms=0, prefetch=False, cache_dir=str(tmp_path / "client-cache"))
    service = RemoteService(settings, said, url, TOKEN, **kwargs)
    service.start([root])
    return service


def folder(tmp_path, name: str, text: str = LIB):
    root = tmp_path / name
    root.mkdir()
    (root / "lib.py").write_text(text)
    return root


@pytest.fixture()
def team():
    made = []

    def make(**kwargs) -> FakeTeam:
        made.append(FakeTeam(**kwargs))
        return made[-1]

    yield make
    for fake in made:
        fake.close()


def complaints(said: Said) -> list[str]:
    return [text for level, text in said.messages if level in ("error", "warning")]


# -- t14: any folder name -----------------------------------------------------------------------------------------
def test_a_folder_of_any_name_syncs_and_completes(live, tmp_path):
    url, holder, _ = live
    for name in ("my project", "проект", "notes#2", "50% done?&x=1"):
        said = Said()
        service = editor(url, tmp_path, folder(tmp_path, name, "def frobnicate_widget(count):\n    return 7\n"),
                         said)
        try:
            wait_for(lambda: service.stats()["snapshots_sent"] >= 1, 30, f"the snapshot of {name!r}")
            got = service.submit("file:///m.py", TEXT, len(TEXT)).future.result(60)
            assert got is not None and got.text, name
            assert service.stats()["status"] == "connected" and not complaints(said), (name, said.messages)
        finally:
            service.close()


# -- t13, the editor's half: the workspace's key -------------------------------------------------------------------
def test_every_call_under_a_workspace_carries_its_key_and_a_new_workspace_a_new_key(team, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    fake = team()
    root = folder(tmp_path, "проект #1")
    keys = []
    for _ in range(2):
        said = Said()
        service = editor(fake.url, tmp_path, root, said)
        try:
            wait_for(lambda: fake.snapshots and service.stats()["snapshots_sent"] >= 1, 30, "the snapshot")
            got = service.submit("file:///m.py", "def count(", 10).future.result(30)
            assert got is not None and service.accept(got.id, got.text) is False
            assert service.drafts("def") == []
            service.stats()
            workspace = service.workspace
        finally:
            service.close()
        calls = [s for s in fake.under_workspaces() if s not in sum((k[2] for k in keys), [])]
        assert {s.path.split("/")[-1] for s in calls} >= {"complete", "accept", "drafts", "stats", "commit"}
        assert any(s.method == "DELETE" for s in calls)
        headers = [{k.lower(): v for k, v in s.headers.items()} for s in calls]
        assert {decoded_id(s) for s in calls} == {workspace}
        assert {h["x-session-id"].removesuffix("#closing") for h in headers} == {quote(workspace, safe="")}
        [key] = {h[KEY_HEADER.lower()] for h in headers}
        assert re.fullmatch(r"[A-Za-z0-9_-]{32,128}", key)
        assert all(v.isascii() for h in headers for v in h.values())
        keys.append((workspace, key, calls))
        assert key not in caplog.text and not any(key in text for _, text in said.messages)
    assert keys[0][0] != keys[1][0] and keys[0][1] != keys[1][1]


# -- t08: a refusal ---------------------------------------------------------------------------------------------------
def test_a_refused_token_is_said_once_with_its_cause_and_asked_again_later_and_later(team, tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "RETRY_S", 0.05)
    fake = team()
    fake.refuse = (401, {"detail": "a bearer token is required"})  # what the server says to a wrong token
    said = Said()
    service = editor(fake.url, tmp_path, folder(tmp_path, "ws"), said)
    try:
        time.sleep(2.5)
        errors = [text for level, text in said.messages if level == "error"]
        assert len(errors) == 1, errors
        assert "refused the token" in errors[0] and "bearer token is required" not in errors[0]
        assert service.stats()["status"] == "refused"
        asked = [s.at for s in fake.seen]
        gaps = [b - a for a, b in zip(asked, asked[1:])]
        assert 3 <= len(asked) <= 8 and all(b > 1.5 * a for a, b in zip(gaps, gaps[1:])), gaps
        fake.refuse = None  # the token file was fixed on the server's side: the next try goes through
        wait_for(lambda: service.stats()["snapshots_sent"] >= 1, 15, "the snapshot once taken")
        assert service.stats()["status"] == "connected" and len(said.messages) == 1
    finally:
        service.close()


def test_the_wait_between_tries_doubles_up_to_its_cap_and_starts_over_after_a_success():
    backoff = Backoff(1.0, 5.0)
    assert [backoff.next() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.next() == 1.0


# -- t09: the server's model changed ----------------------------------------------------------------------------------
def test_a_snapshot_refused_for_another_tokenizer_indexes_again_with_the_new_one(team, tmp_path):
    from rest_lsp.engine.saved_tokenizer import SavedTokenizer

    fake = team(words=("def", "count", "x", "return"))
    said = Said()
    service = editor(fake.url, tmp_path, folder(tmp_path, "ws"), said)
    try:
        wait_for(lambda: len(fake.snapshots) == 1, 30, "the first snapshot")
        fake.tokenizer = new = word_tokenizer(["return", "x", "count", "def", "another"])  # restarted: another model
        fake.need_snapshot = True  # what the restarted server answers a workspace it does not know
        assert service.submit("file:///m.py", "def count(", 10).future.result(30) is not None
        wait_for(lambda: len(fake.snapshots) == 2, 30, "the snapshot with the new tokenizer")
        [doc] = fake.snapshots[1]["docs"]
        assert fake.snapshots[1]["tokenizer_key"] == new["key"]
        assert doc["tokens"] == SavedTokenizer(new["tokenizer"], False).encode(LIB)
        assert service.stats()["status"] == "connected" and not complaints(said)
        assert any("another model" in text for level, text in said.messages if level == "info")
        assert service.submit("file:///m.py", "def count(", 10).future.result(30) is not None
    finally:
        service.close()


# -- t11: TLS advice --------------------------------------------------------------------------------------------------
def certificate(folder, stem, days=(-1, 2), names=("localhost", "127.0.0.1")):
    """(certificate, key) files of a self-signed certificate valid from days[0] to days[1] from now for `names`."""
    import datetime
    import ipaddress

    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def san(name):
        try:
            return x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            return x509.DNSName(name)

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"rest-lsp {stem}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    made = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now + datetime.timedelta(days=days[0]))
            .not_valid_after(now + datetime.timedelta(days=days[1]))
            .add_extension(x509.SubjectAlternativeName([san(n) for n in names]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert, private = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert.write_bytes(made.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, private


CA_ADVICE = "give its CA certificate with --remote-ca-file"


@pytest.mark.parametrize("case, days, names, advice", [
    ("expired", (-30, -1), ("127.0.0.1",), "expired certificate"),
    ("not yet valid", (2, 30), ("127.0.0.1",), "not valid yet"),
    ("another host", (-1, 2), ("gpu-box",), "made for another host name"),
    ("another CA", (-1, 2), ("127.0.0.1",), "not signed by the CA in --remote-ca-file"),
    ("no CA file", (-1, 2), ("127.0.0.1",), CA_ADVICE),
])
def test_a_tls_failure_gets_the_advice_that_matches_it(team, tmp_path, case, days, names, advice):
    import ssl

    cert, key = certificate(tmp_path, "server", days, names)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    fake = team(tls=tls)
    ca_file = {"another CA": str(certificate(tmp_path, "other")[0]), "no CA file": None}.get(case, str(cert))
    said = Said()
    service = editor(fake.url, tmp_path, folder(tmp_path, "ws"), said, ca_file=ca_file)
    try:
        wait_for(lambda: service.stats()["status"] == "untrusted", 20, "the untrusted status")
        [error] = [text for level, text in said.messages if level == "error"]
        assert advice in error and (CA_ADVICE in error) == (case == "no CA file"), error
    finally:
        service.close()
