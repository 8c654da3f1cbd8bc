"""The Ray Serve application of a team's server: one deployment whose replicas each load the model once.

Nothing of a loaded model pickles (TorchScript layers, the datastore's lock): the replicas get specs (settings as
a dict, the token file's path, the memory budget) and build everything themselves. Serve routes a workspace's
requests by its session header (`protocol.WORKSPACE_HEADER`) with routing.WorkspaceRouter: a workspace stays on
its replica while that lives, a new one goes to the replica holding the fewest, and only a dead replica's move. The replica side only: the editor's modules never import this one.
"""

from __future__ import annotations

import dataclasses
import logging

from ray import serve
from ray.serve.config import RequestRouterConfig

log = logging.getLogger(__name__)

ROUTER = "rest_lsp.team.routing.WorkspaceRouter"  # on the alpha custom-router API: Ray is pinned
DEPLOYMENT = "rest-lsp"
# Requests a replica takes at once: completions wait on its decoding thread, hints and deltas pass meanwhile.
MAX_ONGOING_REQUESTS = 32


@serve.ingress()
class TeamReplica:
    def __init__(self, settings: dict, token_file: str, budget_mb: int, threads: int, limits: dict | None = None):
        import torch

        from rest_lsp.auth import read_token
        from rest_lsp.settings import Settings
        from rest_lsp.team.app import Replica
        from rest_lsp.team.limits import Limits
        from rest_lsp.team.shared_model import SharedModel
        from rest_lsp.team.workspaces import Workspaces

        torch.set_num_threads(threads)
        serve_grpc_on_loopback()
        log_to_serve()
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
        settings = Settings(**values)
        limits = Limits(**(limits or {}))
        shared = SharedModel(settings, limits)
        name = serve.get_replica_context().replica_id.unique_id
        self.replica = Replica(Workspaces(shared, settings, budget_mb << 20, limits), read_token(token_file), name)
        log.info("replica %s: model %s ready (%s)", name, shared.base.loaded.name, shared.base.decoder.mode)

    def __serve_build_asgi_app__(self):
        from rest_lsp.team.app import create_app

        return create_app(lambda: self.replica)

    def __del__(self):
        replica = getattr(self, "replica", None)
        if replica is not None:
            replica.workspaces.close()


def serve_grpc_on_loopback() -> None:
    """Serve's replica opens an inter-deployment gRPC server on every interface (`[::]:0`, whatever the node's
    address); a team's server is one machine whose callers are its own proxy, so this replica's goes on loopback,
    as every other Ray port does (ray_local.py). Applies to the pinned Ray's replica module."""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server
    if getattr(bind, "loopback", False):
        return

    def on_loopback(server, address: str):
        return bind(server, "127.0.0.1:0" if address == "[::]:0" else address)

    on_loopback.loopback = True
    replica.add_port_to_grpc_server = on_loopback


class _ToServe(logging.Handler):
    """Hands rest_lsp's log records to Serve's logger: the replica's log file, in Serve's format."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("ray.serve").handle(record)


def log_to_serve(level: int = logging.INFO) -> None:
    """rest_lsp's log lines (INFO and up) into this replica's Serve log, each naming its workspace (a Ray worker's
    root logger would keep WARNING and up only, outside Serve's files)."""
    from rest_lsp.team.workspaces import WorkspaceTag

    ours = logging.getLogger("rest_lsp")
    if any(isinstance(h, _ToServe) for h in ours.handlers):
        return
    handler = _ToServe(level)
    handler.addFilter(WorkspaceTag())
    ours.addHandler(handler)
    ours.setLevel(level)
    ours.propagate = False


def application(settings, token_file: str, replicas: int, num_cpus: float, num_gpus: float, budget_mb: int,
                limits=None):
    """The bound application: `replicas` copies, each with `num_cpus` torch threads (Ray sets OpenMP's from it)."""
    deployment = serve.deployment(
        TeamReplica, name=DEPLOYMENT, num_replicas=replicas, max_ongoing_requests=MAX_ONGOING_REQUESTS,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
        request_router_config=RequestRouterConfig(request_router_class=ROUTER),
        health_check_period_s=2, health_check_timeout_s=30)
    threads = max(1, int(num_cpus))
    limits = dataclasses.asdict(limits) if limits is not None else None
    return deployment.bind(dataclasses.asdict(settings), str(token_file), budget_mb, threads, limits)
