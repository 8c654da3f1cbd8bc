"""`rest-lsp generate`: continue a prompt with REST decoding and print the text or a JSON report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rest_lsp.errors import UserError

# Below this, logits / temperature overflow to inf and sampling has no distribution left (nan fails both checks).
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="hub id (already cached), local folder or .gguf file")
    parser.add_argument("--device", default=None, help="cpu, cuda or auto (default: cuda when present)")
    parser.add_argument("--dtype", default=None, help="float32 (exact), bfloat16, float16, float16-weights, q8_0, gguf "
                        "or auto (for a .gguf: the faster of this machine's default and gguf, measured once)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `rest-lsp generate`."""
    add_model_arguments(parser)
    parser.add_argument("prompt_file", nargs="?", default="-", help="file holding the prompt, or - for stdin")
    parser.add_argument("--workspace", type=Path, default=None, help="use the files of this folder as drafts")
    parser.add_argument("--no-rest", action="store_true", help="plain autoregressive decoding (empty trees)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--budget", type=int, default=None, help="draft tree nodes per step (default: by device)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _read_prompt(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    path = Path(name)
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise UserError(f"Prompt file '{name}' does not exist.") from None
    except IsADirectoryError:
        raise UserError(f"Prompt file '{name}' is a folder, not a file.") from None
    except OSError as err:
        raise UserError(f"Prompt file '{name}' cannot be read ({err.strerror}).") from None


def run(args: argparse.Namespace) -> int:
    """`rest-lsp generate`."""
    from rest_lsp.commands.generation import GenerateRequest, run_generate

    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1 (got {args.max_new_tokens}).")
    if not (args.temperature == 0 or MIN_TEMPERATURE <= args.temperature <= MAX_TEMPERATURE) or not 0 < args.top_p <= 1:
        raise UserError(f"--temperature must be 0 (greedy) or from {MIN_TEMPERATURE} to {MAX_TEMPERATURE}, "
                        "and --top-p in (0, 1].")
    if args.budget is not None and args.budget < 0:
        raise UserError(f"--budget must be >= 0 (got {args.budget}).")
    if args.workspace is not None and not args.workspace.is_dir():
        raise UserError(f"Workspace '{args.workspace}' is not a folder.")
    text = _read_prompt(args.prompt_file)
    if not text.strip():
        raise UserError("The prompt is empty: give a file with some text to continue.")
    request = GenerateRequest(
        prompt=text,
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        workspace=args.workspace,
        rest=not args.no_rest,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        budget=args.budget,
    )
    report = run_generate(request, warn=lambda msg: print(f"rest-lsp: {msg}", file=sys.stderr))
    if args.json:
        print(json.dumps(report))
    else:
        print(report["text"])
        print(
            f"[{report['mode']}: {report['new_tokens']} tokens in {report['steps']} steps, "
            f"{report['tokens_per_step']:.2f} tokens/step, {report['ms_per_token']:.1f} ms/token, "
            f"prefill {report['prefill_ms']:.0f} ms]",
            file=sys.stderr,
        )
    return 0
