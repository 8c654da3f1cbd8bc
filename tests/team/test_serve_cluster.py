"""`rest-lsp serve` on a real local Ray cluster (2 replicas x 1 thread, the tiny model, float32), over HTTPS with a
self-signed certificate (--tls-cert, --tls-key; the editors trust it by its file): completions equal the in-process
service's, a workspace stays on its replica and its log lines name it, workspaces spread over replicas, a client
timeout stops the replica's work, a replica killed under load costs at most a retry, and teardown leaves nothing
behind. Slow: the cluster takes about 30 s to start."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from support import TEAM_TOKEN as TOKEN

from rest_lsp.service.completion import CompletionService, NoEvents
from rest_lsp.settings import Settings
from rest_lsp.team.http import Http
from rest_lsp.team.protocol import API
from rest_lsp.team.remote import RemoteService

pytestmark = pytest.mark.slow  # a Ray cluster: one at a time under pytest-xdist (support.py: SAME_WORKER)

TEXTS = ["def add(a, b):\n    return a + b\n\nresult = add(", "def frobnicate_widget(count):\n    return count",
         "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.", "for i in range(10):\n    "]


def ray_processes(marker: str) -> list[int]:
    """Processes whose command line names this cluster's temp folder."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.fixture(scope="module")
def cluster(tiny_models, certificate):
    from rest_lsp.commands import serve as serve_command

    folder = Path(tempfile.mkdtemp(prefix="rlt", dir="/tmp"))  # short: Ray's socket paths have a length limit
    ray_token = folder / "ray_auth_token"  # Ray's own control-plane token, here rather than in ~/.ray
    ray_token.write_text(secrets.token_hex(32))
    ray_token.chmod(0o600)
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(ray_token)
    home_ray = Path.home() / ".ray"
    had_home_ray = home_ray.exists()
    token_file = folder / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    args = argparse.Namespace(model=str(tiny_models["random"]), dtype="float32", device="cpu", replicas=2,
                              num_cpus=1, num_gpus=0, host="127.0.0.1", port=port, token_file=str(token_file),
                              tls_cert=str(certificate[0]), tls_key=str(certificate[1]), workspace_mb=512,
                              # the server's caps let an editor ask for a long completion (the timeout test)
                              max_new_tokens=4000, completion_ms=60000, kv_cache_mb=256,
                              cache_dir=str(folder / "cache"))
    url = serve_command.start(args, ray_init={"_temp_dir": str(folder / "ray")})
    assert url.startswith("https://")
    try:
        yield url, folder, str(certificate[0])
    finally:
        serve_command.stop()
        deadline = time.monotonic() + 30
        while ray_processes(str(folder)) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = ray_processes(str(folder))
        assert not left, f"Ray processes left after teardown: {left}"
        assert had_home_ray or not home_ray.exists(), "Ray wrote ~/.ray"
        shutil.rmtree(folder, ignore_errors=True)


def settings(tmp_path, **kw):
    values = dict(max_new_tokens=8, debounce_ms=0, prefetch=False, dtype="float32", device="cpu",
                  cache_dir=str(tmp_path / "client-cache"))
    return Settings(**(values | kw))


def workspace(tmp_path, name="ws"):
    root = tmp_path / name
    root.mkdir()
    (root / "lib.py").write_text("def frobnicate_widget(count):\n    return count * 7\n")
    return root


def remote(cluster, root, tmp_path, **kw):
    url, _, cert = cluster
    service = RemoteService(settings(tmp_path), NoEvents(), url, TOKEN, cert, **kw)
    service.start([root])
    assert service.wait_ready(60) and service.wait_indexed(60)
    deadline = time.monotonic() + 60
    while service.stats()["snapshots_sent"] < 1:
        assert time.monotonic() < deadline, "no snapshot"
        time.sleep(0.1)
    return service


def test_completions_equal_the_in_process_service_and_stay_on_one_replica(cluster, tiny_models, tmp_path):
    root = workspace(tmp_path)
    local = CompletionService(settings(tmp_path, model=str(tiny_models["random"])))
    local.start([root])
    service = remote(cluster, root, tmp_path)
    try:
        assert local.wait_ready(60) and local.wait_indexed(60)
        shown = 0
        for i, text in enumerate(TEXTS * 2):
            expected = local.submit(f"file:///m{i % 4}.py", text, len(text)).future.result(60)
            got = service.submit(f"file:///m{i % 4}.py", text, len(text)).future.result(60)
            assert (got and got.text) == (expected and expected.text), text
            shown += got is not None
        assert shown >= 4
        stats = service.stats()
        assert len(stats["replicas"]) == 1 and sum(stats["replicas"].values()) == len(TEXTS) * 2
        assert stats["snapshots_sent"] == 1 and stats["retried"] == 0 and stats["documents"] == 1
        # the replica's log (Serve's file for it) has the workspace's lines, each naming it
        logs = list((cluster[1] / "ray").glob("session_*/logs/serve/replica_*.log"))
        text = "".join(p.read_text(errors="replace") for p in logs)
        assert f"[{service.workspace}] new on this replica" in text and f"[{service.workspace}] snapshot" in text
    finally:
        service.close()
        local.close()


def test_workspaces_spread_over_the_replicas(cluster, tmp_path):
    """New workspaces go to the replica holding the fewest: four editors, two on each replica, each on one."""
    services = [remote(cluster, workspace(tmp_path, f"w{i}"), tmp_path) for i in range(4)]
    try:
        placed = []
        for service in services:
            text = TEXTS[0]
            service.submit("file:///m.py", text, len(text)).future.result(60)
            service.submit("file:///m.py", text + "1", len(text) + 1).future.result(60)
            [replica] = service.stats()["replicas"]  # both requests on one replica
            placed.append(replica)
        assert sorted(Counter(placed).values()) == [2, 2]
    finally:
        for service in services:
            service.close()


def test_a_client_timeout_stops_the_replicas_work(cluster, tmp_path):
    url, _, cert = cluster
    # a give-up time well below what the tiny model takes to fill its context, so the replica is still decoding
    service = remote(cluster, workspace(tmp_path), tmp_path, timeout_s=0.25)
    try:
        service.update_settings(settings(tmp_path, max_new_tokens=4000, max_lines=0, time_budget_ms=0,
                                         wait_budget_ms=0))
        # the random model's continuation here runs to the token cap (after "x = [" a stop rule ends it at 237
        # tokens, which a fast engine decodes within the give-up time)
        text = "x = [\n"
        started = time.monotonic()
        assert service.submit("file:///long.py", text, len(text)).future.result(30) is None
        assert time.monotonic() - started < 5
        http = Http(url, TOKEN, service.workspace, ca_file=cert, key=service._key)
        deadline = time.monotonic() + 20
        while http.call("GET", f"{API}/workspaces/{service.workspace}/stats")["cancelled"] < 1:
            assert time.monotonic() < deadline, "the replica never cancelled"
            time.sleep(0.2)
        assert service.stats()["cancelled"] == 1
    finally:
        service.close()


def test_a_replica_killed_under_load_costs_at_most_a_retry(cluster, tiny_models, tmp_path):
    from ray import serve

    url, _, cert = cluster
    root = workspace(tmp_path)
    service = remote(cluster, root, tmp_path)
    local = CompletionService(settings(tmp_path, model=str(tiny_models["random"])))
    local.start([root])
    try:
        assert local.wait_ready(60) and local.wait_indexed(60)
        expected = {t: local.submit("file:///e.py", t, len(t)).future.result(60) for t in TEXTS}
        http = Http(url, TOKEN, service.workspace, ca_file=cert, key=service._key)
        service.submit("file:///m.py", TEXTS[0], len(TEXTS[0])).future.result(60)
        pid = http.call("GET", f"{API}/workspaces/{service.workspace}/stats")["pid"]
        tickets = [(t, service.submit(f"file:///k{i}.py", t, len(t))) for i, t in enumerate(TEXTS)]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        for i, text in enumerate(TEXTS * 2):
            tickets.append((text, service.submit(f"file:///a{i}.py", text, len(text))))
        for text, ticket in tickets:
            got = ticket.future.result(120)
            assert got is None or got.text == expected[text].text  # never wrong text
        after = service.submit("file:///z.py", TEXTS[1], len(TEXTS[1])).future.result(60)
        assert (after and after.text) == (expected[TEXTS[1]] and expected[TEXTS[1]].text)
        assert service.stats()["retried"] <= len(TEXTS)  # at most the requests in flight
        seen_down = False  # Serve notices the death at a health check: RUNNING drops, then comes back
        while True:  # a replacement serving within 60 s
            running = serve.status().applications["rest-lsp"].deployments["rest-lsp"].replica_states.get("RUNNING", 0)
            seen_down = seen_down or running < 2
            if seen_down and running == 2:
                break
            assert time.monotonic() - killed < 60, "no replacement replica within 60 s"
            time.sleep(0.25)
        # the workspace is served again, by the replica now its own
        http = Http(url, TOKEN, service.workspace, ca_file=cert, key=service._key)
        assert http.call("GET", f"{API}/workspaces/{service.workspace}/stats")["pid"] != pid
    finally:
        service.close()
        local.close()
