"""Fixtures of the team tests: one replica's shared model (the tiny random model) and its app without Ray."""

from __future__ import annotations

import pytest

TOKEN = "s3cret-token-for-tests-0123456789"


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
