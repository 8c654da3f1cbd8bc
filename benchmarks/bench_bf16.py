"""How often bf16 (or float16-weights) changes what the model writes: REST against plain decoding in that mode and
in fp32.

A tree step in bf16 rounds differently from a one-token step (other matmul shapes), so greedy REST in bf16 is not
token-identical to plain bf16 decoding the way it is in fp32. This measures how often a completion differs, over
function starts of real code (the same completion points as bench_rest.py), and where the first difference falls.

    .venv/bin/python benchmarks/bench_bf16.py --prompts 10      # 3 stdlib folders x 10 = 30 completions
    .venv/bin/python benchmarks/bench_bf16.py --prompts 12 --modes float16-weights   # the CPU's fast mode only

float16-weights (fp32 arithmetic over fp16 copies of the linear weights, CPU only) has no transformers equivalent:
its plain decoding is the lean engine's, with no drafts.

Runs the bf16 numerics on any CPU (emulated where the CPU lacks bf16: slow, but the same roundings up to the
accumulation order); the timings are not the point. Prints a table; writes benchmarks/results/bf16.json.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_rest import index_corpus  # noqa: E402
from benchmarks.harness import RESULTS, completion_points, stdlib_corpora, text_after_function, write_json  # noqa: E402

from rest_lsp.engine.decoding import DecodeConfig, Decoder  # noqa: E402
from rest_lsp.drafting.drafts import NoDrafts, OutputStore, SuccessorTable, rest_drafts  # noqa: E402
from rest_lsp.engine.model import load_model  # noqa: E402



def generate(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False)
    return out[0, len(prompt):].tolist()


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=10, help="completion points per corpus")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (on a GPU the steps replay CUDA graphs)")
    ap.add_argument("--modes", default="bfloat16,float16-weights",
                    help="comma-separated: bfloat16 and/or float16-weights (the latter on a CPU only)")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    corpora = stdlib_corpora("asyncio", "json", "email")

    fp32 = load_model(args.model, args.device, "float32")
    tok, n = fp32.tokenizer, args.max_new_tokens
    rest = {"fp32": Decoder(fp32)}
    plain = {"fp32": lambda prompt: generate(fp32.model, prompt, n)}
    if "bfloat16" in modes:
        # by hand: load_model falls back to fp32 on a CPU without native bf16, and here the numerics are the point
        bf16 = replace(fp32, model=load_model(args.model, args.device, "float32").model.to(torch.bfloat16),
                       dtype=torch.bfloat16)
        rest["bf16"] = Decoder(bf16)
        plain["bf16"] = lambda prompt: generate(bf16.model, prompt, n)
    if "float16-weights" in modes:
        rest["fp16w"] = Decoder(fp32, pack="fp16")
        own = Decoder(fp32, pack="fp16")

        def plain_fp16w(prompt: list[int]) -> list[int]:
            own.reset()
            return own.generate(prompt, NoDrafts(), DecodeConfig(max_new_tokens=n, budget=0)).tokens

        plain["fp16w"] = plain_fp16w
    outputs = {k: OutputStore() for k in rest}
    recycle = {k: SuccessorTable() for k in rest}
    rows = []
    for corpus in corpora:
        store, files, token_lists = index_corpus(tok, corpus)
        for path, offset in completion_points(files, args.prompts, args.seed):
            full = path.read_text(encoding="utf-8", errors="replace")
            prompt = tok.encode(full[:offset])[-args.context:]
            suffix = tok.encode(text_after_function(full, offset)[:4000])
            store.remove(str(path))
            row = {"point": f"{corpus.name}/{path.relative_to(corpus)}:{full[:offset].count(chr(10))}",
                   **{f"plain_{k}": run(prompt) for k, run in plain.items()}}
            for k, decoder in rest.items():
                decoder.reset()
                drafts = rest_drafts(store, suffix=suffix, outputs=outputs[k], recycle=recycle[k])
                result = decoder.generate(prompt, drafts, DecodeConfig(max_new_tokens=n))
                outputs[k].add(prompt[-32:], result.tokens)
                row[f"rest_{k}"] = result.tokens
                row[f"rest_{k}_tokens_per_step"] = result.tokens_per_step
            store.put(str(path), token_lists[files.index(path)])
            rows.append(row)
            print(f"  {row['point']}: " + ", ".join(
                f"REST {k} == plain {k}: {row[f'rest_{k}'] == row[f'plain_{k}']}, plain {k} == plain fp32: "
                f"{row[f'plain_{k}'] == row['plain_fp32']}" for k in rest if k != "fp32"), flush=True)
        store.close()

    pairs = [("REST fp32", "rest_fp32", "plain fp32", "plain_fp32")]
    for k in rest:
        if k != "fp32":
            pairs += [(f"REST {k}", f"rest_{k}", f"plain {k}", f"plain_{k}"),
                      (f"REST {k}", f"rest_{k}", "plain fp32", "plain_fp32"),
                      (f"plain {k}", f"plain_{k}", "plain fp32", "plain_fp32")]
    summary = {"completions": len(rows), "max_new_tokens": n, "model": fp32.name}
    print(f"\n{len(rows)} completions of {n} tokens, greedy")
    print("| output | compared with | identical completions | first difference at (median token, of those that differ) |")
    print("|---|---|---|---|")
    for a_name, a, b_name, b in pairs:
        same = sum(r[a] == r[b] for r in rows)
        where = sorted(first_difference(r[a], r[b]) for r in rows if r[a] != r[b])
        at = f"{where[len(where) // 2]}" if where else "-"
        summary[f"{a} vs {b}"] = {"identical": same, "first_difference_median": where[len(where) // 2] if where else None}
        print(f"| {a_name} | {b_name} | {same}/{len(rows)} ({100 * same / len(rows):.0f}%) | {at} |")
    summary["device"] = str(fp32.device)
    write_json(RESULTS / f"bf16-{'-'.join(modes) or 'fp32'}.json", {"summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
