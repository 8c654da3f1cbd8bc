"""`shutdown` and `exit`: the process ends at `exit` with LSP's code (0 after `shutdown`, 1 without), even while a
model load that nothing can stop is under way, and without writing into the closed stream while it decodes."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import threading

from support import (cache_with_kernels, command, cursor_at_end, inline, open_doc, server_command, start, wait_for,
                     wait_until)
from rest_lsp.lsp.server import STATS_COMMAND

# The server with a model load that never ends and, like a load inside torch, holds the process: Python's own exit
# waits for the thread it runs (a non-daemon one). It says when it has begun by creating $LOAD_STARTED.
BLOCKED_LOAD_SERVER = textwrap.dedent("""
    import os, sys, threading
    import rest_lsp.service.completion as completion
    from rest_lsp.cli import main

    def blocked_load(settings):
        open(os.environ["LOAD_STARTED"], "w").close()
        stuck = threading.Thread(target=threading.Event().wait, name="load-inside-torch", daemon=False)
        stuck.start()
        stuck.join()

    completion.load_serving_model = blocked_load
    sys.exit(main(sys.argv[1:]))
""")


def environment(tmp_path, **extra) -> dict:
    return {**os.environ, "REST_LSP_CACHE_DIR": str(cache_with_kernels(tmp_path / "cache")), **extra}


async def test_shutdown_and_exit_while_the_model_loads_end_the_process_with_0(tmp_path):
    started = tmp_path / "load-started"
    root = tmp_path / "ws"
    root.mkdir()
    client, _ = await start([sys.executable, "-c", BLOCKED_LOAD_SERVER, "--stdio"], root, "neovim",
                            {"cacheDir": str(tmp_path / "cache")}, env=environment(tmp_path, LOAD_STARTED=str(started)))
    try:
        wait_for(started.exists, what="the model load to begin")
        assert not (await command(client, STATS_COMMAND))["ready"]
        await client.shutdown_async(None)
        client.exit(None)
        assert await asyncio.wait_for(client._server.wait(), 60) == 0
    finally:
        if client._server.returncode is None:
            client._server.kill()
        await client.stop()


async def test_exit_without_shutdown_while_decoding_ends_with_1_and_a_quiet_log(tiny_models, tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    log = tmp_path / "server.log"
    options = {"model": str(tiny_models["constant"]), "dtype": "float32", "maxNewTokens": 4000, "maxLines": 0,
               "timeBudgetMs": 600_000, "waitBudgetMs": 600_000, "debounceMs": 0, "indexWorkspace": False,
               "cacheDir": str(tmp_path / "cache")}
    client, _ = await start(server_command("--log-file", str(log)), root, "neovim", options,
                            env=environment(tmp_path))
    try:
        async def ready():
            return (await command(client, STATS_COMMAND))["ready"]

        assert await wait_until(ready, timeout=120)
        uri, text = (root / "a.py").as_uri(), "def f(x):\n    return "
        open_doc(client, uri, text)
        pending = asyncio.ensure_future(inline(client, uri, *cursor_at_end(text)))  # thousands of tokens to write
        assert (await command(client, STATS_COMMAND))["ready"]  # answered after the server took the request
        assert not pending.done()
        client.exit(None)
        assert await asyncio.wait_for(client._server.wait(), 60) == 1
        written = log.read_text()
        assert "Traceback" not in written and "Error sending data" not in written, written[-2000:]
    finally:
        if client._server.returncode is None:
            client._server.kill()
        await client.stop()


def test_closing_at_shutdown_does_not_wait_for_a_model_load(monkeypatch):
    from rest_lsp.lsp.server import close_service
    from rest_lsp.service import completion
    from rest_lsp.settings import Settings

    release, began = threading.Event(), threading.Event()

    def blocked_load(settings):
        began.set()
        release.wait()
        raise RuntimeError("released")

    monkeypatch.setattr(completion, "load_serving_model", blocked_load)
    service = completion.CompletionService(Settings(index_workspace=False))
    service.start([])
    assert began.wait(60)
    joined = []
    for thread in service._threads:
        real_join = thread.join
        thread.join = lambda timeout=None, t=thread, j=real_join: (joined.append(t.name), j(timeout))[1]
    try:
        close_service(service)
        assert completion.LOADER_THREAD not in joined
    finally:
        release.set()
