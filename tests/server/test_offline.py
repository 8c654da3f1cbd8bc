"""The README's "nothing needs the network at run time": the CLI and the language server, with the default model,
run in subprocesses whose every connection outside this machine (and every DNS lookup) is refused and logged by
tests/netguard/sitecustomize.py, with HF_HUB_OFFLINE=1 as a user without a network would set it.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import command, cursor_at_end, inline, open_doc, start, wait_until
from rest_lsp.lsp.server import STATS_COMMAND

pytestmark = pytest.mark.slow

GUARD = Path(__file__).resolve().parents[1] / "netguard"
LOAD_TIMEOUT_S = 600  # a slow CI machine converting the .gguf


@pytest.fixture
def offline(tmp_path):
    """(environment for a guarded subprocess, the file where the guard logs every attempt)."""
    log = tmp_path / "network-attempts.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(GUARD), *filter(None, [env.get("PYTHONPATH")])])
    env["REST_LSP_NETGUARD_LOG"] = str(log)
    env["HF_HUB_OFFLINE"] = "1"
    return env, log


def attempts(log: Path) -> str:
    return log.read_text() if log.exists() else ""


def test_the_guard_refuses_and_logs_connections(offline):
    env, log = offline
    code = (
        "import socket\n"
        "for call in (lambda: socket.create_connection(('192.0.2.1', 443), timeout=5),\n"
        "             lambda: socket.getaddrinfo('huggingface.example', 443)):\n"
        "    try:\n"
        "        call()\n"
        "    except OSError:\n"
        "        pass\n"
        "server = socket.socket(); server.bind(('127.0.0.1', 0)); server.listen()\n"
        "socket.create_connection(server.getsockname(), timeout=5).close()  # loopback stays allowed\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    logged = attempts(log)
    assert "connect ('192.0.2.1', 443)" in logged and "name lookup 'huggingface.example'" in logged, logged
    assert "127.0.0.1" not in logged


def test_cli_generate_offline(offline, tmp_path):
    env, log = offline
    prompt = tmp_path / "prompt.py"
    prompt.write_text("def add(a, b):\n    return")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "lib.py").write_text("def add(a, b):\n    return a + b\n")
    done = subprocess.run(
        [sys.executable, "-m", "rest_lsp.cli", "generate", str(prompt), "--workspace", str(workspace),
         "--max-new-tokens", "8", "--json"],
        env=env, capture_output=True, text=True, timeout=LOAD_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert '"new_tokens": 8' in done.stdout
    assert attempts(log) == ""


async def test_server_offline(offline, tmp_path):
    env, log = offline
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "lib.py").write_text("def add(a, b):\n    return a + b\n")
    options = {"maxNewTokens": 8, "cacheDir": str(tmp_path / "index")}
    client, _ = await start([sys.executable, "-m", "rest_lsp.cli", "--stdio"], root, "neovim", options, env=env)
    try:
        async def ready():
            stats = await command(client, STATS_COMMAND)
            assert not stats["load_error"], stats["load_error"]
            return stats if stats["ready"] and stats["documents"] >= 1 else None

        assert await wait_until(ready, timeout=LOAD_TIMEOUT_S), "the server did not load the model and the workspace"
        uri = (root / "main.py").as_uri()
        text = "from lib import add\n\nprint(add(1, "
        open_doc(client, uri, text)
        result = await inline(client, uri, *cursor_at_end(text))
        assert result.items and result.items[0].insert_text.strip()
    finally:
        await client.shutdown_session()
    assert attempts(log) == ""
