"""`rest-lsp serve`: a team's decoding server on Ray Serve (the `serve` extra); editors connect with `--remote`."""

from __future__ import annotations

import argparse
import datetime
import signal
import sys
import threading
from pathlib import Path

from rest_lsp.auth import is_loopback
from rest_lsp.errors import UserError
from rest_lsp.team.limits import COMPLETION_MS, KV_CACHE_MB, MAX_NEW_TOKENS, Limits

OBJECT_STORE_MB = 200  # the replicas pass token ids and text, never tensors: Ray's default would map gigabytes
WARN_EXPIRY_DAYS = 14


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
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS,
                        help=f"tokens one completion may make at most; an editor may ask for fewer (default "
                             f"{MAX_NEW_TOKENS})")
    parser.add_argument("--completion-ms", type=int, default=COMPLETION_MS,
                        help=f"time one completion may hold a replica's decoder at most (default {COMPLETION_MS})")
    parser.add_argument("--kv-cache-mb", type=int, default=KV_CACHE_MB,
                        help=f"memory per replica for the KV caches of recently used documents; an editor may ask "
                             f"for less (default {KV_CACHE_MB})")
    parser.add_argument("--cache-dir", default=None, help="where each replica keeps what it learns of the model")


def limits_of(args: argparse.Namespace) -> Limits:
    """The server's limits from its flags, or a UserError naming the flag out of range."""
    for flag, value, low, high in (("--max-new-tokens", args.max_new_tokens, 1, 4096),
                                   ("--completion-ms", args.completion_ms, 100, 600_000),
                                   ("--kv-cache-mb", args.kv_cache_mb, 0, 1 << 20),
                                   ("--workspace-mb", args.workspace_mb, 16, 1 << 24)):
        if not low <= value <= high:
            raise UserError(f"{flag} must be from {low} to {high}.")
    return Limits(args.max_new_tokens, args.completion_ms, args.kv_cache_mb)


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
    limits = limits_of(args)
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
                          args.num_gpus, args.workspace_mb, limits), name="rest-lsp", route_prefix="/")
    scheme = "https" if args.tls_cert else "http"
    host = f"[{args.host}]" if ":" in args.host else args.host
    return f"{scheme}://{host}:{args.port}"


def check_tls(cert: str, key: str, now: datetime.datetime | None = None) -> None:
    """A UserError when the pair does not load or the certificate is not valid now (here, rather than in Ray's
    proxy, where every handshake would fail unseen); a warning when it expires within WARN_EXPIRY_DAYS."""
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
        raise UserError(f"--tls-cert {cert} with --tls-key {key} does not load as a certificate and its key ({err})."
                        ) from None
    warning = certificate_dates(cert, now or datetime.datetime.now(datetime.timezone.utc))
    if warning:
        print(f"rest-lsp serve: {warning}", file=sys.stderr, flush=True)


def certificate_dates(cert: str, now: datetime.datetime) -> str | None:
    """A UserError when the certificate is expired or not valid yet; a warning sentence when it expires within
    WARN_EXPIRY_DAYS days, else None."""
    from cryptography import x509

    made = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    begins, ends = made.not_valid_before_utc, made.not_valid_after_utc
    if now < begins:
        raise UserError(f"--tls-cert {cert} is not valid until {begins:%Y-%m-%d %H:%M} UTC: every editor would refuse "
                        "it; check the machine's clock or use a certificate valid now.")
    if now >= ends:
        raise UserError(f"--tls-cert {cert} expired on {ends:%Y-%m-%d %H:%M} UTC: every editor would refuse it; "
                        "renew it.")
    left = ends - now
    if left < datetime.timedelta(days=WARN_EXPIRY_DAYS):
        return (f"--tls-cert {cert} expires on {ends:%Y-%m-%d %H:%M} UTC, in {left.days} day(s): renew it before "
                "editors refuse it.")
    return None


def stop() -> None:
    import ray
    from ray import serve

    if not ray.is_initialized():  # start failed before Ray ran: serve.shutdown() would start a cluster to stop it
        return
    try:
        serve.shutdown()
    finally:
        ray.shutdown()  # this cluster only (never `ray stop`: it kills every Ray process of the machine)


def run(args: argparse.Namespace) -> int:
    from rest_lsp.team import ray_local

    token_folder = ray_local.keep_private()  # before ray is imported: it reads its switches then
    try:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("rest-lsp serve needs the serve extra: pip install 'rest-lsp[serve]'", file=sys.stderr)
            return 2
        return _serve(args, ray_local.seal_sessions)
    finally:
        ray_local.forget(token_folder)


def _serve(args: argparse.Namespace, started=lambda: None) -> int:
    if not is_loopback(args.host) and not args.tls_cert:
        print(f"rest-lsp serve: listening on {args.host} without --tls-cert: tokens and code would cross the network "
              "in clear text, so editors on other machines refuse its http:// URL.", file=sys.stderr)
    done = threading.Event()
    stopping = _on_stop_signals(done)
    try:
        url = start(args)
        started()
        stopping = _on_stop_signals(done)  # again: starting Ray put its own crash handler on SIGTERM
        print(f"rest-lsp serve: {args.replicas} replica(s) on {url}; editors: rest-lsp --stdio --remote {url} "
              f"--token-file FILE", flush=True)
        done.wait()
        print(f"rest-lsp serve: {stopping[0]}: finishing the requests in flight, then stopping.", flush=True)
    finally:
        stop()  # Serve drains: each replica ends its requests in flight before it goes
    return 0


def _on_stop_signals(done: threading.Event) -> list[str]:
    """SIGINT and SIGTERM both set `done` (a clean stop, status 0); the list gets the signal's name."""
    got = ["stopped"]

    def stop(signum, _frame):
        got[0] = signal.Signals(signum).name
        done.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    return got
