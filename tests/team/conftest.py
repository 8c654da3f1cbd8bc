"""Fixtures of the team tests: one replica's shared model (the tiny random model) and its app without Ray."""

from __future__ import annotations

import pytest

from support import TEAM_TOKEN as TOKEN  # noqa: E402

WORKSPACE_KEY = "k" * 22 + "test-key-0"  # protocol.KEY_HEADER: an editor's key for its workspaces


@pytest.fixture(scope="module")
def shared(tiny_models, tmp_path_factory):
    from rest_lsp.settings import Settings
    from rest_lsp.team.shared_model import SharedModel

    settings = Settings(model=str(tiny_models["random"]), max_new_tokens=8, debounce_ms=0, prefetch=False,
                        cache_dir=str(tmp_path_factory.mktemp("replica-cache")))
    return SharedModel(settings)


@pytest.fixture()
def replica(shared):
    from rest_lsp.team.app import Replica
    from rest_lsp.team.workspaces import Workspaces

    workspaces = Workspaces(shared, shared.settings, budget_bytes=1 << 30)
    yield Replica(workspaces, TOKEN, "r0")
    workspaces.close()


@pytest.fixture()
def client(replica):
    from fastapi.testclient import TestClient

    from rest_lsp.team.app import create_app

    with TestClient(create_app(lambda: replica)) as c:
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        c.headers["X-Rest-Lsp-Workspace-Key"] = WORKSPACE_KEY
        yield c


class Faults:
    """Makes the next `dies` completions fail as a replica that died does: its state gone, a 500 (Serve's)."""

    def __init__(self):
        self.dies = 0
        self.completes = 0


def _serve(app, **ssl):
    """Serve `app` on a local uvicorn (a thread) with `ssl` (uvicorn's ssl_certfile, ssl_keyfile: what Ray Serve's
    proxy is given by `rest-lsp serve --tls-cert/--tls-key`); yields the port."""
    import socket
    import threading
    import time

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", **ssl))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture()
def live(shared):
    """The replica app on a local uvicorn (a thread): (url, holder of the current Replica, Faults)."""
    import threading
    from types import SimpleNamespace

    from fastapi.responses import JSONResponse

    from rest_lsp.team.app import Replica, create_app
    from rest_lsp.team.workspaces import Workspaces

    holder = SimpleNamespace(replica=Replica(Workspaces(shared, shared.settings, 1 << 30), TOKEN, "r0"))
    faults = Faults()
    app = create_app(lambda: holder.replica)

    @app.middleware("http")
    async def die(request, call_next):
        if request.url.path.endswith("/complete"):
            faults.completes += 1
            if faults.dies > 0:
                faults.dies -= 1
                old = holder.replica
                holder.replica = Replica(Workspaces(shared, shared.settings, 1 << 30), TOKEN, "r1")
                threading.Thread(target=old.workspaces.close, daemon=True).start()
                return JSONResponse({"detail": "replica died"}, status_code=500)
        return await call_next(request)

    try:
        for port in _serve(app):
            yield f"http://127.0.0.1:{port}", holder, faults
    finally:
        holder.replica.workspaces.close()


def self_signed(folder):
    """(certificate, key) files of a self-signed certificate for localhost and 127.0.0.1, as a team makes one with
    `openssl req -x509`: by the cryptography package, else by the openssl command; skipped without either."""
    import shutil
    import subprocess

    cert, key = folder / "server.crt", folder / "server.key"
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl command is here to make a certificate")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-days", "2", "-subj", "/CN=rest-lsp test server", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True)
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rest-lsp test server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    made = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(private.public_key()), False)
            .sign(private, hashes.SHA256()))
    cert.write_bytes(made.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    key.chmod(0o600)
    return cert, key


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture()
def tls_live(shared, certificate):
    """The replica app over HTTPS with the self-signed certificate: (url, its Replica, the certificate file)."""
    from rest_lsp.team.app import Replica, create_app
    from rest_lsp.team.workspaces import Workspaces

    cert, key = certificate
    replica = Replica(Workspaces(shared, shared.settings, 1 << 30), TOKEN, "tls0")
    try:
        for port in _serve(create_app(lambda: replica), ssl_certfile=str(cert), ssl_keyfile=str(key)):
            yield f"https://127.0.0.1:{port}", replica, cert
    finally:
        replica.workspaces.close()
