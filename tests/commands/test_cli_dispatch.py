"""`rest-lsp` finds every command one way: the language server (`lsp`) is a command like the others, and the one
run when none is named, whatever global flag comes first."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rest_lsp.cli import DEFAULT_COMMAND, SUBCOMMANDS, build_parser, with_command


@pytest.mark.parametrize("argv,want", [
    ([], ["lsp"]),
    (["--stdio"], ["lsp", "--stdio"]),
    (["--tcp", "8123"], ["lsp", "--tcp", "8123"]),
    (["-v"], ["-v", "lsp"]),
    (["-v", "--tcp", "8123"], ["-v", "lsp", "--tcp", "8123"]),
    (["lsp", "--stdio"], ["lsp", "--stdio"]),
    (["-v", "index", "DIR"], ["-v", "index", "DIR"]),
    (["--help"], ["--help"]),
])
def test_a_command_is_always_named(argv, want):
    assert with_command(argv) == want


def test_the_language_server_is_a_command_like_the_others():
    assert SUBCOMMANDS[DEFAULT_COMMAND][0] == "rest_lsp.commands.lsp"
    args = build_parser("lsp").parse_args(with_command(["--tcp", "127.0.0.1:8123", "--max-new-tokens", "7"]))
    assert (args.module, args.tcp, args.max_new_tokens) == ("rest_lsp.commands.lsp", "127.0.0.1:8123", 7)


def test_a_global_flag_before_the_servers_flags_reaches_the_server():
    """`rest-lsp -v --tcp HOST:PORT` is the server's refusal in one sentence, not argparse's usage."""
    out = subprocess.run([sys.executable, "-m", "rest_lsp.cli", "-v", "--tcp", "0.0.0.0:1"], capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "needs --token-file" in out.stderr, out.stderr
