"""`rest-lsp complete FILE:LINE:COL`: one completion, exactly as the server would give it.

The same CompletionService runs (same prompt, drafts, stop rules and post-processing);
only the editor is missing. The file is read as an editor sends it (line breaks kept as they are); LINE and COL are
1-based, lines end where LSP ends them (\r\n, \r, \n), and COL counts characters.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rest_lsp import settings as settings_module
from rest_lsp.lsp.positions import last_line, line_bounds
from rest_lsp.service.completion import BadText, CompletionService, NoEvents
from rest_lsp.settings import Settings

LOAD_TIMEOUT_S = 600


class _CommandEvents(NoEvents):
    """Warnings go to stderr as one line each; a failed load is reported once, by `run`."""

    def message(self, level: str, text: str) -> None:
        if level == "warning":
            print(f"rest-lsp complete: {text.removeprefix('rest-lsp: ')}", file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", metavar="FILE:LINE:COL", help="where the cursor is (1-based line and column)")
    parser.add_argument("--workspace", metavar="DIR", help="index this folder for drafts, as the server would")
    parser.add_argument("--json", action="store_true", help="print a JSON object with the text and timings")
    settings_module.add_arguments(parser)


def parse_location(location: str) -> tuple[Path, int, int]:
    """FILE:LINE:COL -> (path, line, column); ValueError with one sentence when malformed."""
    parts = location.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"Expected FILE:LINE:COL with 1-based numbers, got {location!r}.")
    line, col = int(parts[1]), int(parts[2])
    if line < 1 or col < 1:
        raise ValueError(f"LINE and COL are 1-based, got {line}:{col}.")
    return Path(parts[0]), line, col


def offset_of(text: str, line: int, col: int) -> int:
    """Character offset of 1-based (line, col), lines as LSP counts them; ValueError when it lies outside the text."""
    bounds = line_bounds(text, line - 1)
    if bounds is None:
        raise ValueError(f"Line {line} is past the end of the file ({last_line(text) + 1} lines).")
    start, end = bounds
    if col > end - start + 1:
        raise ValueError(f"Column {col} is past the end of line {line} ({end - start} characters).")
    return start + col - 1


def _reason(err: Exception) -> str:
    """One sentence for a bad FILE:LINE:COL."""
    if isinstance(err, UnicodeDecodeError):
        return "the file is not UTF-8 text."
    if isinstance(err, FileNotFoundError):
        return "no such file."
    if isinstance(err, IsADirectoryError):
        return "it is a folder, not a file."
    if isinstance(err, OSError):
        return f"the file cannot be read ({err.strerror or type(err).__name__})."
    return str(err)


def run(args: argparse.Namespace) -> int:
    try:
        path, line, col = parse_location(args.location)
        text = path.read_bytes().decode("utf-8")  # as the editor sends it: no newline translation
        offset = offset_of(text, line, col)
    except (ValueError, OSError) as err:
        print(f"rest-lsp complete: cannot use {args.location}: {_reason(err)}", file=sys.stderr)
        return 2
    settings = Settings.from_args(args)
    if not args.workspace:
        settings, _ = settings.update({"index_workspace": False})
    settings, _ = settings.update({"prefetch": False})  # one request: no next one to compute ahead for
    service = CompletionService(settings, _CommandEvents())
    try:
        service.start([Path(args.workspace)] if args.workspace else [])
        if not service.wait_ready(LOAD_TIMEOUT_S):
            print(f"rest-lsp complete: {service.load_error or 'the model did not load in time.'}", file=sys.stderr)
            return 2
        service.wait_indexed(LOAD_TIMEOUT_S)
        doc_id = str(path.resolve())
        service.open_buffer(doc_id, text)
        t0 = time.perf_counter()
        try:
            completion = service.submit(doc_id, text, offset).future.result()
        except BadText as err:
            print(f"rest-lsp complete: {str(err).removeprefix('rest-lsp: ')}", file=sys.stderr)
            return 2
        wall_ms = (time.perf_counter() - t0) * 1e3
        if args.json:
            out = {
                "file": str(path), "line": line, "column": col,
                "text": completion.text if completion else None,
                "tokens": completion.tokens if completion else 0,
                "steps": completion.steps if completion else 0,
                "latency_ms": round(wall_ms, 1),
                "stats": service.stats(),
            }
            print(json.dumps(out, indent=2))
        elif completion:
            sys.stdout.write(completion.text + "\n")
        else:
            print("rest-lsp complete: the model proposed nothing here.", file=sys.stderr)
        return 0 if completion else 1
    finally:
        service.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rest-lsp complete", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
