"""REST vs plain decoding vs transformers' prompt lookup, on the same prompts, in one run.

Completion points are function starts (the line after `def ...:`) in a folder of real code, chosen with a fixed
seed. The prompt is the file up to that point (its last --context tokens). REST drafts come from the prompt and
generated text (ContextLookup) mixed with the OTHER files of the folder, indexed in the workspace Datastore: the
file being completed is removed from it, as its function body would not exist yet in an editor.

    .venv/bin/python benchmarks/bench_rest.py                       # stdlib asyncio as the corpus
    .venv/bin/python benchmarks/bench_rest.py --corpus DIR --prompts 12 --max-new-tokens 64 --budget 16

Prints a markdown table; writes benchmarks/results/rest.json and rest.png.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sysconfig
import time
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer

from rest_lsp.datastore import Datastore
from rest_lsp.decoding import DecodeConfig, Decoder
from rest_lsp.drafts import ContextLookup, context_and_workspace
from rest_lsp.model import load_model

RESULTS = Path(__file__).parent / "results"


class FirstTokenClock(BaseStreamer):
    """generate() calls put() with the prompt, then once per new token: the first new token ends the prefill."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter()

    def end(self):
        pass


def hf_generate(model, prompt: list[int], n: int, **kw) -> tuple[list[int], float, float]:
    """(new tokens, prefill+first token ms, ms per later token)."""
    ids = torch.tensor([prompt])
    clock = FirstTokenClock()
    t0 = time.perf_counter()
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
        streamer=clock, **kw,
    )
    t1 = time.perf_counter()
    new = out[0, len(prompt):].tolist()
    first = clock.first or t1
    return new, (first - t0) * 1e3, (t1 - first) * 1e3 / max(1, len(new) - 1)


def completion_points(files: list[Path], count: int, seed: int) -> list[tuple[Path, int]]:
    points = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in re.finditer(r"^[ \t]*(?:async )?def \w+\(.*?\).*?:[ \t]*\n", text, flags=re.M | re.S):
            if m.end() > 400 and m.end() < len(text) - 200:
                points.append((path, m.end()))
    random.Random(seed).shuffle(points)
    # at most two points per file, so one file cannot dominate
    chosen, per_file = [], {}
    for path, offset in points:
        if per_file.get(path, 0) < 2:
            chosen.append((path, offset))
            per_file[path] = per_file.get(path, 0) + 1
        if len(chosen) == count:
            break
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path(sysconfig.get_paths()["stdlib"]) / "asyncio")
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--context", type=int, default=512, help="prompt tokens kept (the tail)")
    ap.add_argument("--budget", type=int, default=None, help="draft nodes (default: the decoder's default for the device)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="rest")
    ap.add_argument("--compare-fixed", action="store_true",
                    help="also run REST with the full budget every step (no cut by the step-cost curve)")
    args = ap.parse_args()

    loaded = load_model(args.model, args.device, args.dtype)
    tok, model = loaded.tokenizer, loaded.model
    from rest_lsp.generation import default_budget

    budget = default_budget(loaded) if args.budget is None else args.budget
    files = sorted(p for p in args.corpus.rglob("*.py") if p.is_file())
    t0 = time.perf_counter()
    store = Datastore()
    token_lists = tok.encode_batch([p.read_text(encoding="utf-8", errors="replace") for p in files])
    for path, ids in zip(files, token_lists):
        store.put(str(path), ids)
    corpus_tokens = sum(map(len, token_lists))
    index_s = time.perf_counter() - t0
    points = completion_points(files, args.prompts, args.seed)
    print(f"model {loaded.name} on {loaded.device} ({loaded.dtype}), torch threads {torch.get_num_threads()}")
    print(f"corpus {args.corpus}: {len(files)} files, {corpus_tokens} tokens, indexed in {index_s:.1f} s; "
          f"{len(points)} completion points; {args.max_new_tokens} new tokens; REST budget {budget}")

    decoder = Decoder(loaded)
    fixed_decoder = Decoder(loaded)  # its own cache and its own trust in drafts
    n = args.max_new_tokens
    # warm up every path once (first calls allocate and pick kernels)
    warm = tok.encode("def warm_up(x):\n    return x\n")
    hf_generate(model, warm, 4)
    hf_generate(model, warm, 4, prompt_lookup_num_tokens=10)
    decoder.generate(warm, ContextLookup(), DecodeConfig(max_new_tokens=4, budget=budget))

    rows = []
    for path, offset in points:
        text = path.read_text(encoding="utf-8", errors="replace")[:offset]
        prompt = tok.encode(text)[-args.context:]
        store.remove(str(path))  # the function being written is not in the workspace yet
        drafts = context_and_workspace(store)

        plain, plain_first_ms, plain_ms = hf_generate(model, prompt, n)
        pld, pld_first_ms, pld_ms = hf_generate(model, prompt, n, prompt_lookup_num_tokens=10)
        decoder.reset()  # a cold cache per prompt, as for the others
        rest = decoder.generate(prompt, drafts, DecodeConfig(max_new_tokens=n, budget=budget))
        fixed = None
        if args.compare_fixed:
            fixed_decoder.reset()
            fixed = fixed_decoder.generate(prompt, drafts, DecodeConfig(max_new_tokens=n, budget=budget, fit_to_cost=False))
        store.put(str(path), token_lists[files.index(path)])

        rows.append({
            "file": str(path.relative_to(args.corpus)),
            "line": text.count("\n"),
            "prompt_tokens": len(prompt),
            "plain_ms_per_token": plain_ms,
            "pld_ms_per_token": pld_ms,
            "rest_ms_per_token": rest.ms_per_token,
            "rest_tokens_per_step": rest.tokens_per_step,
            "rest_steps": rest.steps,
            "speedup_rest": plain_ms / rest.ms_per_token,
            "speedup_pld": plain_ms / pld_ms,
            "rest_equals_plain": rest.tokens == plain,
            "pld_equals_plain": pld == plain,
            "rest_finish": rest.finish,
        })
        if fixed is not None:
            rows[-1].update({
                "fixed_ms_per_token": fixed.ms_per_token,
                "fixed_tokens_per_step": fixed.tokens_per_step,
                "speedup_fixed": plain_ms / fixed.ms_per_token,
                "fixed_equals_plain": fixed.tokens == plain,
            })
        r = rows[-1]
        print(f"  {r['file']}:{r['line']}: plain {plain_ms:.1f} ms/tok, PLD {pld_ms:.1f}, REST {rest.ms_per_token:.1f} "
              f"({rest.tokens_per_step:.2f} tok/step), equal={r['rest_equals_plain']}", flush=True)

    print()
    print("| completion point | prompt tok | plain ms/tok | PLD ms/tok | REST ms/tok | REST tok/step | PLD speedup | REST speedup | REST == plain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['file']}:{r['line']} | {r['prompt_tokens']} | {r['plain_ms_per_token']:.1f} | {r['pld_ms_per_token']:.1f} | "
              f"{r['rest_ms_per_token']:.1f} | {r['rest_tokens_per_step']:.2f} | {r['speedup_pld']:.2f}x | "
              f"{r['speedup_rest']:.2f}x | {'yes' if r['rest_equals_plain'] else 'NO'} |")
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    summary = {
        "prompts": len(rows),
        "median_plain_ms_per_token": med("plain_ms_per_token"),
        "median_pld_ms_per_token": med("pld_ms_per_token"),
        "median_rest_ms_per_token": med("rest_ms_per_token"),
        "median_rest_tokens_per_step": med("rest_tokens_per_step"),
        "mean_rest_tokens_per_step": statistics.mean(r["rest_tokens_per_step"] for r in rows),
        "median_speedup_rest": med("speedup_rest"),
        "median_speedup_pld": med("speedup_pld"),
        "rest_identical": sum(r["rest_equals_plain"] for r in rows),
        "pld_identical": sum(r["pld_equals_plain"] for r in rows),
        "budget": budget,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype),
        "max_new_tokens": n,
    }
    print(f"| **median** | | {summary['median_plain_ms_per_token']:.1f} | {summary['median_pld_ms_per_token']:.1f} | "
          f"{summary['median_rest_ms_per_token']:.1f} | {summary['median_rest_tokens_per_step']:.2f} | "
          f"{summary['median_speedup_pld']:.2f}x | {summary['median_speedup_rest']:.2f}x | "
          f"{summary['rest_identical']}/{len(rows)} |")
    if args.compare_fixed:
        print(f"\nREST with the full budget every step: median {med('fixed_ms_per_token'):.1f} ms/token, "
              f"{med('fixed_tokens_per_step'):.2f} tokens/step, speedup {med('speedup_fixed'):.2f}x, "
              f"identical {sum(r['fixed_equals_plain'] for r in rows)}/{len(rows)}")
        summary.update({k: med(k) for k in ("fixed_ms_per_token", "fixed_tokens_per_step", "speedup_fixed")})
    print(f"\nREST decode time / plain decode time (median of per-prompt ratios): "
          f"{1 / summary['median_speedup_rest']:.3f}; PLD outputs identical to plain: {summary['pld_identical']}/{len(rows)}")

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
    plot(rows, RESULTS / f"{args.out}.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    x = range(len(rows))
    w = 0.27
    ax.bar([i - w for i in x], [r["plain_ms_per_token"] for r in rows], w, label="plain (generate)")
    ax.bar(list(x), [r["pld_ms_per_token"] for r in rows], w, label="prompt lookup (generate)")
    ax.bar([i + w for i in x], [r["rest_ms_per_token"] for r in rows], w, label="REST (rest-lsp)")
    ax.set_xticks(list(x), [f"{i + 1}" for i in x])
    ax.set_xlabel("completion point")
    ax.set_ylabel("decode ms / token")
    ax.legend()
    ax.set_title("Decode time per token, same prompts, one run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
