"""`rest-lsp serve`: a team's decoding server on Ray Serve (the `serve` extra); editors connect with `--remote`."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from rest_lsp.auth import is_loopback
from rest_lsp.errors import UserError

OBJECT_STORE_MB = 200  # the replicas pass token ids and text, never tensors: Ray's default would map gigabytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="hub id, local model folder or .gguf (default: the bundled one)")
    parser.add_argument("--dtype", default=None, help="float32 (exact), bfloat16, float16, float16-weights, q8_0 or "
                        "gguf (default: as the language server)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the best there is)")
    parser.add_argument("--replicas", type=int, default=1, help="copies of the model (default 1)")
    parser.add_argument("--num-cpus", type=float, default=1, help="CPU cores per replica = its torch threads")
    parser.add_argument("--num-gpus", type=float, default=0, help="GPUs per replica (default 0)")
    parser.add_argument("--host", default="127.0.0.1", help="where to listen (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token-file", required=True, help="the bearer token every editor must send (one line)")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (with --tls-key)")
    parser.add_argument("--tls-key", help="the certificate's private key")
    parser.add_argument("--workspace-mb", type=int, default=2048,
                        help="memory per replica for workspaces; the least recently used go first (default 2048)")
    parser.add_argument("--cache-dir", default=None, help="where each replica keeps what it learns of the model")


def start(args: argparse.Namespace, ray_init: dict | None = None) -> str:
    """Start a local Ray cluster and the application; returns the URL editors use. `ray_init`: extra ray.init
    arguments (tests give a temp folder)."""
    import ray
    from ray import serve

    from rest_lsp.settings import Settings
    from rest_lsp.team.deployment import application
    from rest_lsp.auth import read_token

    read_token(args.token_file)  # a bad file stops here, not in every replica
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UserError("--tls-cert and --tls-key go together.")
    if args.tls_cert:
        check_tls(args.tls_cert, args.tls_key)
    if args.replicas < 1:
        raise UserError("--replicas must be at least 1.")
    settings, errors = Settings().update({"model": args.model, "dtype": args.dtype, "device": args.device,
                                          "cacheDir": args.cache_dir})
    if errors:
        raise UserError(" ".join(errors))
    # address="local": a cluster of our own, never a stranger's
    ray.init(address="local", num_cpus=args.replicas * args.num_cpus + 1, num_gpus=args.replicas * args.num_gpus,
             object_store_memory=OBJECT_STORE_MB << 20, include_dashboard=False, **(ray_init or {}))
    http = {"host": args.host, "port": args.port}
    if args.tls_cert:
        http |= {"ssl_certfile": str(Path(args.tls_cert)), "ssl_keyfile": str(Path(args.tls_key))}
    serve.start(http_options=http, proxy_location="HeadOnly")  # one proxy: one router, one workspace table
    serve.run(application(settings, str(Path(args.token_file).resolve()), args.replicas, args.num_cpus,
                          args.num_gpus, args.workspace_mb), name="rest-lsp", route_prefix="/")
    scheme = "https" if args.tls_cert else "http"
    host = f"[{args.host}]" if ":" in args.host else args.host
    return f"{scheme}://{host}:{args.port}"


def check_tls(cert: str, key: str) -> None:
    """A UserError when the pair does not load (here, rather than in Ray's proxy, where it would fail unseen)."""
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
        raise UserError(f"--tls-cert {cert} with --tls-key {key} does not load as a certificate and its key ({err})."
                        ) from None


def stop() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()  # this cluster only (never `ray stop`: it kills every Ray process of the machine)


def run(args: argparse.Namespace) -> int:
    try:
        import ray  # noqa: F401
    except ImportError:
        print("rest-lsp serve needs the serve extra: pip install 'rest-lsp[serve]'", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and not args.tls_cert:
        print(f"rest-lsp serve: listening on {args.host} without --tls-cert: tokens and code would cross the network "
              "in clear text, so editors on other machines refuse its http:// URL.", file=sys.stderr)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    url = start(args)
    try:
        print(f"rest-lsp serve: {args.replicas} replica(s) on {url}; editors: rest-lsp --stdio --remote {url} "
              f"--token-file FILE", flush=True)
        done.wait()
    finally:
        stop()
    return 0
