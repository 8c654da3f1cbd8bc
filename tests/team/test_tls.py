"""HTTPS between editors and a team's server, without Ray: the replica app on uvicorn with the certificate and key
that `rest-lsp serve --tls-cert/--tls-key` gives Ray Serve's proxy (uvicorn too), self-signed as a team makes one.
The editor trusts it with --remote-ca-file; without it, it says so in one sentence. An http:// URL to another
machine is refused: the token and the code would cross in clear."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from support import TEAM_TOKEN as TOKEN
from support import Said, wait_for
from support import command, cursor_at_end, greedy, inline, open_doc, start

from rest_lsp.errors import UserError
from rest_lsp.settings import Settings
from rest_lsp.team.remote import RemoteService, remote_target

TEXT = "def add(a, b):\n    return a + b\n\nresult = add("


def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def client(tmp_path, shared, url, said, ca_file=None):
    settings = Settings(model=shared.settings.model, max_new_tokens=8, debounce_ms=0, prefetch=False,
                        cache_dir=str(tmp_path / "client-cache"))
    root = tmp_path / "ws"
    root.mkdir(exist_ok=True)
    (root / "lib.py").write_text("def frobnicate_widget(count):\n    return count * 7\n")
    service = RemoteService(settings, said, url, TOKEN, str(ca_file) if ca_file else None)
    service.start([root])
    return service


def test_the_editor_completes_over_https_when_given_the_ca_file(tls_live, tmp_path, shared):
    url, replica, cert = tls_live
    said = Said()
    service = client(tmp_path, shared, url, said, ca_file=cert)
    try:
        assert service.wait_ready(30)
        wait_for(lambda: service.stats()["snapshots_sent"] >= 1, what="the snapshot over https")
        got = service.submit("file:///m.py", TEXT, len(TEXT)).future.result(60)
        assert got is not None and service.stats()["replica"] == "tls0"
        assert [level for level, _ in said.messages if level != "info"] == []
    finally:
        service.close()


def test_without_the_ca_file_a_self_signed_server_is_refused_in_one_sentence(tls_live, tmp_path, shared):
    url, replica, _ = tls_live
    said = Said()
    service = client(tmp_path, shared, url, said)  # the system's CAs only
    try:
        wait_for(lambda: service.stats()["status"] == "untrusted", 10, "the untrusted status")
        time.sleep(2.5)  # one more attempt: still one message
        errors = [text for level, text in said.messages if level == "error"]
        assert len(errors) == 1, errors
        [error] = errors
        assert "\n" not in error and "Traceback" not in error
        assert url in error and "does not trust" in error and "--remote-ca-file" in error, error
        assert service.submit("file:///m.py", TEXT, len(TEXT)).future.result(1) is None
        assert replica.workspaces.names() == []  # nothing crossed
    finally:
        service.close()


def test_remote_targets_http_only_to_loopback_and_a_ca_file_only_with_https(tmp_path, certificate):
    tokens = str(token_file(tmp_path))
    cert = str(certificate[0])
    for url in ("http://gpu-box:8000", "http://10.1.2.3:8000", "http://[2001:db8::1]:8000"):
        said = remote_target(url, tokens)
        assert isinstance(said, str) and "clear text" in said and "https://" in said and said.count(". ") == 0, said
    for url in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000", "http://127.0.0.5:1"):
        assert remote_target(url, tokens) == (url, TOKEN, None)
    assert remote_target("https://gpu-box:8000", tokens, cert) == ("https://gpu-box:8000", TOKEN, cert)
    said = remote_target("http://127.0.0.1:8000", tokens, cert)
    assert isinstance(said, str) and "https://" in said
    for bad in (tmp_path / "missing.pem", token_file(tmp_path)):  # no file; a file that holds no certificate
        said = remote_target("https://gpu-box:8000", tokens, str(bad))
        assert isinstance(said, str) and "--remote-ca-file" in said and "\n" not in said, said


def test_the_language_server_refuses_a_clear_text_remote_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rest_lsp.cli", "--stdio", "--remote", "http://10.1.2.3:8000",
                          "--token-file", str(token_file(tmp_path))], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "clear text" in out.stderr


async def test_the_language_server_completes_over_https_with_remote_ca_file(tls_live, tmp_path, tiny_models):
    url, _, cert = tls_live
    root = tmp_path / "ws"
    root.mkdir()
    cmd = [sys.executable, "-m", "rest_lsp.cli", "--stdio", "--remote", url, "--token-file",
           str(token_file(tmp_path)), "--remote-ca-file", str(cert)]
    client, _ = await start(cmd, root, "visual-studio-code",
                            {"maxNewTokens": 8, "debounceMs": 0, "cacheDir": str(tmp_path / "cache")})
    try:
        uri = (root / "main.py").as_uri()
        after = ")\nprint(result)\n"
        open_doc(client, uri, TEXT + after)
        deadline = time.monotonic() + 60
        while True:  # empty until the tokenizer and the snapshot have crossed
            result = await inline(client, uri, *cursor_at_end(TEXT))
            if result.items or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert [i.insert_text for i in result.items] == [greedy(tiny_models["random"], TEXT, after, 8)]
        stats = await command(client, "rest-lsp.stats")  # what the editor shows: decoding is remote, and where
        assert (stats["mode"], stats["status"], stats["remote"]) == ("remote", "connected", url)
    finally:
        await client.shutdown_session()


def test_serve_refuses_a_certificate_and_key_that_do_not_load_before_starting_ray(tmp_path, certificate):
    import argparse

    import ray

    from rest_lsp.commands import serve as serve_command

    cert, key = certificate
    serve_command.check_tls(str(cert), str(key))  # the pair the tests serve with loads
    args = argparse.Namespace(model=None, dtype=None, device=None, replicas=1, num_cpus=1, num_gpus=0,
                              host="127.0.0.1", port=9, token_file=str(token_file(tmp_path)), tls_cert=str(cert),
                              tls_key=None, workspace_mb=64, cache_dir=None, max_new_tokens=64,
                              completion_ms=2000, kv_cache_mb=256)
    for tls_key, says in ((None, "go together"), (str(cert), "does not load"), (str(tmp_path / "gone.key"),
                                                                               "does not load")):
        args.tls_key = tls_key
        with pytest.raises(UserError) as err:
            serve_command.start(args)
        assert says in str(err.value) and "\n" not in str(err.value)
    assert not ray.is_initialized()


def _dated(folder, days_from: float, days_to: float):
    """A self-signed certificate valid from `days_from` to `days_to` days from now, and its key."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rest-lsp dated")])
    now = datetime.datetime.now(datetime.timezone.utc)
    made = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now + datetime.timedelta(days=days_from))
            .not_valid_after(now + datetime.timedelta(days=days_to)).sign(private, hashes.SHA256()))
    cert, key = folder / f"c{days_from}_{days_to}.crt", folder / f"c{days_from}_{days_to}.key"
    cert.write_bytes(made.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return str(cert), str(key)


@pytest.mark.parametrize("days_from,days_to,says", [(-30, -1, "expired on"), (7, 30, "is not valid until")])
def test_serve_refuses_a_certificate_that_is_not_valid_now_in_one_sentence(tmp_path, days_from, days_to, says):
    from rest_lsp.commands import serve as serve_command

    cert, key = _dated(tmp_path, days_from, days_to)
    with pytest.raises(UserError) as err:
        serve_command.check_tls(cert, key)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_serve_warns_of_a_certificate_that_expires_within_14_days(tmp_path, capsys):
    from rest_lsp.commands import serve as serve_command

    serve_command.check_tls(*_dated(tmp_path, -1, 5))
    said = capsys.readouterr().err
    assert "expires on" in said and "renew" in said and said.count("\n") == 1
    serve_command.check_tls(*_dated(tmp_path, -1, 60))
    assert capsys.readouterr().err == ""
