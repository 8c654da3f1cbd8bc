"""`rest-lsp lsp` (the default command: `rest-lsp --stdio` is `rest-lsp lsp --stdio`): the language server process.

It reads the flags, picks the service (this process's CompletionService, or a team's with `--remote`), serves one
client on stdio or `--tcp`, and ends the process with LSP's exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import NoReturn

from rest_lsp import settings as settings_module
from rest_lsp.lsp import tcp
from rest_lsp.lsp.server import RestLanguageServer, close_service, create_server
from rest_lsp.service.completion import CompletionService
from rest_lsp.service.interface import ServiceFactory
from rest_lsp.settings import Settings

CLOSE_AT_EXIT_S = 5.0  # `exit` without `shutdown`: how long the service may take to stop before the process ends


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    parser.add_argument("--tcp", metavar="[HOST:]PORT",
                        help="listen for one LSP client on a TCP socket (host 127.0.0.1 unless given; [::1]:PORT "
                             "for IPv6; any other than loopback needs --token-file)")
    parser.add_argument("--token-file", metavar="FILE",
                        help="with --tcp: a client must send this file's token in initializationOptions.token "
                             "(the file: one line, mode 600)")
    parser.add_argument("--remote", metavar="URL",
                        help="a team's server (`rest-lsp serve`) decodes; this process indexes and sends the "
                             "workspace (needs --token-file: the server's token)")
    parser.add_argument("--remote-ca-file", metavar="FILE",
                        help="with an https:// --remote: trust the server's certificate by this CA file (PEM; a "
                             "team's self-signed certificate) instead of the system's")
    parser.add_argument("--log-file", help="write the server log here (default: stderr)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    settings_module.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    _log_to(args.log_file, args.log_level)
    remote = _remote_target(args) if args.remote else None
    if isinstance(remote, str):  # what is wrong with --remote
        print(remote, file=sys.stderr)
        return 2
    server = create_server(Settings.from_args(args), _service_factory(remote), on_exit=_finish)
    code = tcp.run(server, args.tcp, args.token_file) if args.tcp else (server.start_io() or 0)
    return code if server.service is None else _finish(server, code)  # the client left without `exit`


def _log_to(log_file: str | None, level: str) -> None:
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    # force: this process's log is the server's, whatever `rest-lsp -v` set up before
    logging.basicConfig(level=level, handlers=[handler], format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)
    if level != "DEBUG":  # pygls logs every message at INFO
        logging.getLogger("pygls").setLevel(logging.WARNING)


def _remote_target(args: argparse.Namespace) -> tuple[str, str, str | None] | str:
    """(URL, token, CA file) of `--remote`, or the sentence that says why it cannot be used."""
    from rest_lsp.team.remote import remote_target

    return remote_target(args.remote, args.token_file, args.remote_ca_file)


def _service_factory(remote: tuple[str, str, str | None] | None) -> ServiceFactory:
    """What builds the server's service: this process's CompletionService, or a team's server at `remote`."""
    if remote is None:
        return CompletionService
    from rest_lsp.team.remote import RemoteService

    return lambda settings, events: RemoteService(settings, events, *remote)


def _finish(server: RestLanguageServer, code: int) -> NoReturn:
    """End the process: stop the service if `shutdown` did not (for at most CLOSE_AT_EXIT_S), then exit with `code`
    without Python's own exit, which would join threads that never stop (the stdin reader, a model load) or abort
    while they run inside torch ("terminate called without an active exception")."""
    if server.service is not None and not server.shut_down:
        closer = threading.Thread(target=close_service, args=(server.service,), name="rest-lsp-exit", daemon=True)
        closer.start()
        closer.join(CLOSE_AT_EXIT_S)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
