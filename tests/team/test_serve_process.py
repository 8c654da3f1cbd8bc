"""`rest-lsp serve` as an operator runs it (a process of its own, loopback, the tiny model, 1 replica): no socket of
its Ray cluster listens beyond loopback, Ray's token is nowhere another user reads it, the files it writes are
its user's alone, and SIGTERM stops it cleanly (status 0, no crash banner). Slow: the cluster takes about 30 s."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support import TEAM_TOKEN as TOKEN

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.slow  # a Ray cluster: one at a time under pytest-xdist (support.py: SAME_WORKER)

MAIN = "import sys; from rest_lsp.cli import main; sys.argv[0] = 'rest-lsp'; sys.exit(main())"


@pytest.fixture(scope="module")
def served(tiny_models):
    folder = Path(tempfile.mkdtemp(prefix="rlp", dir="/tmp"))  # short: Ray's socket paths have a length limit
    home = folder / "home"
    home.mkdir()
    token = folder / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
    env.update(HOME=str(home), RAY_TMPDIR=str(folder), OMP_NUM_THREADS="1")
    log = folder / "serve.log"
    cmd = [sys.executable, "-c", MAIN, "serve", "--model", str(tiny_models["random"]), "--dtype", "float32",
           "--device", "cpu", "--replicas", "1", "--num-cpus", "1", "--port", str(port), "--token-file", str(token),
           "--cache-dir", str(folder / "cache")]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "editors: rest-lsp --stdio --remote" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        yield proc, folder, home, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        for child in _left(folder):
            child.kill()
        subprocess.run(["rm", "-rf", str(folder)])


def _left(folder: Path) -> list:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if str(folder) in " ".join(p.info["cmdline"] or ()):
            out.append(p)
    return out


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # an IPv6 socket bound to ::ffff:127.0.0.1 takes loopback only
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def test_no_socket_of_the_cluster_listens_beyond_loopback(served):
    proc, folder, _, _ = served
    ours = {p.pid for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]}
    ours |= {p.pid for p in _left(folder)}
    listening = [(c.laddr.ip, c.laddr.port, c.pid) for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.pid in ours]
    assert len(listening) >= 3  # the HTTP proxy, the GCS, a raylet at least: the listing sees the cluster
    assert [x for x in listening if not _loopback(x[0])] == []


def test_rays_token_and_the_servers_files_are_its_users_alone(served):
    _, folder, home, _ = served
    assert not (home / ".ray").exists()  # Ray's token went to a private folder of the server's
    logs = list(folder.glob("ray/session_*/logs/serve/replica_*.log"))
    assert logs
    assert stat.S_IMODE((folder / "ray").stat().st_mode) == 0o700  # nothing under it opens to another user
    files = [p for p in (folder / "ray").rglob("*") if p.is_file() and not p.is_symlink()]
    loose = [(str(p.relative_to(folder)), oct(stat.S_IMODE(p.stat().st_mode))) for p in files
             if stat.S_IMODE(p.stat().st_mode) & 0o077]
    assert len(files) > 10 and loose == []


def test_sigterm_drains_and_exits_0(served):
    proc, _, _, log = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    said = log.read_text(errors="replace")
    assert "SIGTERM received" not in said and "stopping" in said
