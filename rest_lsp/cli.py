"""`rest-lsp`: the commands, the language server (`lsp`) the default one.

Each command lives in its own module of rest_lsp/commands/ with `add_arguments(parser)` and `run(args) -> int`;
this module only finds the command and runs it."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

DEFAULT_COMMAND = "lsp"  # `rest-lsp`, `rest-lsp --stdio`, `rest-lsp --tcp PORT`
GLOBAL_FLAGS = ("-v", "--verbose")
SUBCOMMANDS = {
    # name: (module, help)
    "lsp": ("rest_lsp.commands.lsp", "the language server, on stdio or --tcp (the default command)"),
    "generate": ("rest_lsp.commands.generate", "continue a prompt with REST decoding and print the result"),
    "index": ("rest_lsp.commands.index", "build, update or query the persistent token index of a folder"),
    "complete": ("rest_lsp.commands.complete", "one completion at FILE:LINE:COL, as the server would give it"),
    "serve": ("rest_lsp.commands.serve", "a team's decoding server on Ray Serve; editors use --remote URL"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """All commands, with the arguments of `command` only when one is named: its module alone is imported, so
    `rest-lsp index` does not pay for what `complete` imports."""
    parser = argparse.ArgumentParser(
        prog="rest-lsp",
        description="Code-completion language server with REST speculative decoding. "
        f"With no command it runs `{DEFAULT_COMMAND}`: LSP on stdio.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    sub = parser.add_subparsers(dest="command")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(module=module)
        if command in (None, name):
            importlib.import_module(module).add_arguments(p)
    return parser


def with_command(argv: list[str]) -> list[str]:
    """`argv` with its command named: DEFAULT_COMMAND's when the first word after the global flags is an option of
    its own (or there is none); `-h` still asks for the list of commands."""
    i = 0
    while i < len(argv) and argv[i] in GLOBAL_FLAGS:
        i += 1
    if i == len(argv) or argv[i].startswith("-") and argv[i] not in ("-h", "--help"):
        return [*argv[:i], DEFAULT_COMMAND, *argv[i:]]
    return argv


def main(argv: list[str] | None = None) -> int:
    from rest_lsp.errors import ModelLoadError, UserError

    argv = with_command(list(sys.argv[1:] if argv is None else argv))
    command = next((a for a in argv if not a.startswith("-")), None)  # options before it take no value
    args = build_parser(command).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)
    try:
        return importlib.import_module(args.module).run(args)
    except (UserError, ModelLoadError) as err:
        print(f"rest-lsp: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
