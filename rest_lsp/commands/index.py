"""`rest-lsp index DIR`: build or update the persistent index of a folder, or ask it what follows a text."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from rest_lsp.datastore import Datastore, WorkspaceIndex
from rest_lsp.errors import ModelLoadError

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, metavar="DIR", help="the workspace folder to index")
    parser.add_argument("--model", default=None, help="model whose tokenizer to use (hub id, folder or .gguf)")
    parser.add_argument("--query", metavar="TEXT", default=None,
                        help="show the continuations the index holds for the end of TEXT")
    parser.add_argument("--top", type=int, default=10, help="continuations to show with --query (default 10)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where indexes are kept (default: REST_LSP_CACHE_DIR or the user cache folder)")
    parser.add_argument("--max-file-bytes", type=int, default=1_000_000, help="skip larger files (default 1 MB)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    if not Path(args.dir).is_dir():
        print(f"rest-lsp index: '{args.dir}' is not a folder.", file=sys.stderr)
        return 2
    try:
        tokenizer = _tokenizer(args.model)
    except ModelLoadError as err:
        print(f"rest-lsp index: {err}", file=sys.stderr)
        return 1
    datastore = Datastore()
    bar = None if args.json or not sys.stderr.isatty() else _ProgressBar()
    index = WorkspaceIndex(Path(args.dir), datastore, tokenizer.encode_batch, tokenizer.key,
                           cache_dir=args.cache_dir, max_file_bytes=args.max_file_bytes, on_progress=bar)
    started = time.perf_counter()
    try:
        stats = index.build()
        # the merges the build (or the loaded segments) started, kept: else every run would merge them again
        datastore.wait_for_merges()
        index.save()
    except OSError as err:
        print(f"rest-lsp index: could not index or save '{args.dir}': {err}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.done()
    seconds = time.perf_counter() - started
    if not index.saved:
        datastore.close()
        print(f"rest-lsp index: could not save the index of '{args.dir}': {index.save_error}", file=sys.stderr)
        return 1
    if args.query is not None:
        result = _query(datastore, tokenizer, args.query, args.top)
        datastore.close()
        _print_query(result, args.json)
        return 0
    datastore.close()
    out = {"files": stats["files"], "tokens": stats["tokens"], "seconds": round(seconds, 3),
           "bytes_per_token": round(stats["bytes_per_token"], 2)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['files']} files, {out['tokens']} tokens in {out['seconds']:.2f} s, "
              f"{out['bytes_per_token']:.2f} bytes/token ({'loaded and updated' if stats['loaded'] else 'built'})")
    return 0


def _tokenizer(spec: str | None):
    """The tokenizer saved the last time transformers loaded it (a fraction of a second), else transformers'
    own (seconds: torch and transformers are imported), which saves it for the next run."""
    from rest_lsp.engine import saved_tokenizer

    if (saved := saved_tokenizer.load(spec)) is not None:
        return saved
    log.info("No saved tokenizer for this model yet; loading it with transformers (slow, this once).")
    from rest_lsp.engine import model

    return model.load_tokenizer(spec)


def _query(datastore: Datastore, tokenizer, text: str, top: int) -> dict:
    found = datastore.lookup(tokenizer.encode(text), limit=max(top, 0))
    return {"match_length": found.match_length,
            "continuations": [{"text": tokenizer.decode(list(toks)), "count": count}
                              for toks, count in found.continuations]}


def _print_query(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    print(f"matched the last {result['match_length']} tokens")
    for c in result["continuations"]:
        print(f"{c['count']:>7}  {c['text']!r}")


class _ProgressBar:
    def __init__(self, width: int = 30):
        self.width = width
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // total if total else self.width
        sys.stderr.write(f"\rindexing [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} files")
        sys.stderr.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
