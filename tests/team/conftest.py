"""Fixtures of the team tests: one replica's shared model (the tiny random model) and its app without Ray."""

from __future__ import annotations

import pytest

from support import TEAM_TOKEN as TOKEN  # noqa: E402


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
        yield c


class Faults:
    """Makes the next `dies` completions fail as a replica that died does: its state gone, a 500 (Serve's)."""

    def __init__(self):
        self.dies = 0
        self.completes = 0


@pytest.fixture()
def live(shared):
    """The replica app on a local uvicorn (a thread): (url, holder of the current Replica, Faults)."""
    import socket
    import threading
    import time
    from types import SimpleNamespace

    import uvicorn
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

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", holder, faults
    server.should_exit = True
    thread.join(10)
    holder.replica.workspaces.close()
