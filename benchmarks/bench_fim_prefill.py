"""Prefill tokens per keystroke of a FIM prompt, by layout: typing a line inside a function of a stdlib file.

The person puts the cursor at the end of a line inside a function, presses Enter (the editor indents) and types
`--typed` characters, `--lines` times, asking for a completion after every keystroke and waiting for it. Layouts:
  - `cursor`: the hole starts at the cursor: prefix, suffix, middle marker (the layout before this change); each
    keystroke changes the prefix's end, which sits before the suffix, so the suffix is prefilled again;
  - `grid`: the hole starts at a line start on a grid of prompt.MIDDLE_GRID lines and the text from there to the
    cursor follows the middle marker (prompt.build_prompt's default now);
  - `spm`: suffix first, then the prefix (only for models trained on it; counted from tokens only).

Part 1 counts tokens only (any tokenizer): a request prefills its prompt minus the last token, less the common
prefix with the previous prompt. Part 2 runs the real completion service on a FIM model folder (`--model`; by
default a 2-layer Qwen2 with random weights and the default model's tokenizer with Qwen's FIM tokens added, as
no FIM model is on this machine) and reads the prefill tokens of each request from the service's stats.

    .venv/bin/python benchmarks/bench_fim_prefill.py [--file textwrap.py] [--function dedent] [--typed 30]
        [--lines 1] [--model FOLDER] [--context-tokens 1024]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

import rest_lsp.service.completion as completion
from rest_lsp.service.completion import CompletionService
from rest_lsp.service.prompt import build_prompt, detect_fim
from rest_lsp.settings import Settings

QWEN_FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"]
LINE = "margin_width = len(margin) + 1 if margin else 0  # of the common indent"


def keystrokes(path: Path, function: str, typed: int, lines: int) -> list[tuple[str, int]]:
    """(text, cursor) at the end of a line in the middle of the function's body, then, `lines` times, after Enter
    + indent and after each typed character."""
    text = path.read_text()
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == function)
    source_lines = text.splitlines(keepends=True)
    mid = node.body[len(node.body) // 2]  # a line in the middle of the body
    at = sum(len(line) for line in source_lines[: mid.lineno - 1])
    at += len(source_lines[mid.lineno - 1].rstrip("\n"))
    indent = " " * mid.col_offset
    out = [(text, at)]
    for _ in range(lines):
        for ch in ["\n" + indent, *LINE[:typed]]:
            text = text[:at] + ch + text[at:]
            at += len(ch)
            out.append((text, at))
    return out


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def spm_ids(hf, fim, before: str, after: str, budget: int) -> list[int]:
    psm = build_prompt(hf, before, after, budget=budget, fim=fim, split_line=False)
    ids = psm.ids[1:-1]  # prefix ids, suffix marker, suffix ids
    cut = ids.index(fim.suffix_id)
    return [fim.suffix_id] + ids[cut + 1:] + [fim.prefix_id] + ids[:cut] + [fim.middle_id]


def count_tokens(hf, fim, steps, budget: int) -> dict[str, list[int]]:
    layouts = {
        "cursor": lambda b, a: build_prompt(hf, b, a, budget=budget, fim=fim, split_line=False).ids,
        "grid": lambda b, a: build_prompt(hf, b, a, budget=budget, fim=fim).ids,
        "spm": lambda b, a: spm_ids(hf, fim, b, a, budget),
    }
    out = {}
    for name, make in layouts.items():
        cached: list[int] = []
        out[name] = []
        for text, at in steps:
            ids = make(text[:at], text[at:])[:-1]
            out[name].append(len(ids) - common(cached, ids))
            cached = ids
    return out


def tiny_fim_model(folder: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rest_lsp.engine.model import load_model

    hf = load_model(None, "cpu", "float32").tokenizer.hf
    hf.add_special_tokens({"additional_special_tokens": QWEN_FIM})
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(hf), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False))
    model.save_pretrained(folder)
    hf.save_pretrained(folder)
    return folder


def service_prefills(model: Path, steps, context: int, split_line: bool) -> list[int]:
    """Prefill tokens of each request, through the real service (type-through answers count 0)."""
    original = completion.build_prompt
    completion.build_prompt = lambda *a, **kw: original(*a, **kw, split_line=split_line)
    svc = CompletionService(Settings(model=str(model), max_new_tokens=8, debounce_ms=0, index_workspace=False,
                                     context_tokens=context))
    try:
        svc.start([])
        if not svc.wait_ready(300):
            sys.exit(f"the model did not load: {svc.load_error}")
        out = []
        for text, at in steps:
            before = svc.stats()["prefill_tokens"]
            svc.submit("bench.py", text, at).future.result(300)
            out.append(svc.stats()["prefill_tokens"] - before)
        return out
    finally:
        svc.close()
        completion.build_prompt = original


def row(name: str, values: list[int], typed: int) -> str:
    """values[0]: the first request, a full prefill; then per line: Enter, `typed` characters."""
    per_line = [values[i:i + typed + 1] for i in range(1, len(values), typed + 1)]
    enters = [line[0] for line in per_line]
    chars = [v for line in per_line for v in line[1:]]
    return (f"| {name} | {statistics.mean(enters):.0f} | {statistics.mean(chars):.1f} | "
            f"{statistics.median(chars):.0f} | {max(chars)} | {sum(values[1:]) / (len(values) - 1):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="textwrap.py", help="a file of the Python standard library")
    ap.add_argument("--function", default="dedent")
    ap.add_argument("--typed", type=int, default=30, help="characters typed per line")
    ap.add_argument("--lines", type=int, default=1, help="lines typed, each after an Enter")
    ap.add_argument("--model", help="a FIM model folder (default: a tiny random Qwen2 with FIM tokens)")
    ap.add_argument("--context-tokens", type=int, default=1024)
    args = ap.parse_args()
    path = Path(ast.__file__).parent / args.file
    steps = keystrokes(path, args.function, args.typed, args.lines)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else tiny_fim_model(Path(tmp) / "qwen2-fim")
        hf = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
        fim = detect_fim(hf)
        if fim is None:
            sys.exit(f"{model} has no FIM tokens.")
        budget = args.context_tokens  # the service's own while the model's context holds it and the new tokens
        print(f"{path.name}:{args.function}, a request at a line end, then {args.lines} x (Enter, {args.typed} "
              f"characters typed), a request after each; "
              f"tokenizer of {model.name}, FIM template {fim.template.name}; prompt budget {budget}\n")
        header = ("| layout | Enter (mean) | per typed character: mean | median | max | mean per request |\n"
                  "|---|---|---|---|---|---|")
        print("Prefill tokens per request, counted from the prompts:\n" + header)
        for name, values in count_tokens(hf, fim, steps, budget).items():
            print(row(name, values, args.typed))
        print("\nPrefill tokens per request, the completion service's stats:\n" + header)
        for name, split in (("cursor", False), ("grid", True)):
            print(row(name, service_prefills(model, steps, args.context_tokens, split), args.typed))


if __name__ == "__main__":
    main()
