"""REST vs plain decoding vs transformers' prompt lookup, on the same prompts, in one run.

Completion points are function starts (the line after `def ...:`) in folders of real code, chosen with a fixed
seed. The prompt is the file up to that point (its last --context tokens). REST drafts come from the prompt and
generated text (ContextLookup), the file after the function (the text below the cursor), the OTHER files of the folder, indexed in the workspace Datastore (the file being
completed is removed from it, as its function body would not exist yet in an editor), the model's own earlier
outputs in this run, and its habits (the successor table, learned from the logits of earlier steps). Every REST
decoder starts with an empty acceptance table and learns as the run goes.

    .venv/bin/python benchmarks/bench_rest.py                       # stdlib asyncio, json and email
    .venv/bin/python benchmarks/bench_rest.py --corpus DIR --prompts 12 --max-new-tokens 64 --budget 16
    .venv/bin/python benchmarks/bench_rest.py --ablate --useless    # each source left out; an always-wrong source

Prints a markdown table; writes benchmarks/results/rest.json and rest.png.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import (  # noqa: E402
    RESULTS, completion_points, python_files, stdlib_corpora, text_after_function, write_json)
from rest_lsp.datastore import Datastore
from rest_lsp.engine.decoding import DecodeConfig, Decoder, sync_device
from rest_lsp.drafting.drafts import SOURCE_NAMES, ContextLookup, OutputStore, Proposal, SuccessorTable, rest_drafts
from rest_lsp.engine.matmuls import pick_packing
from rest_lsp.engine.model import load_model

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
    ids = torch.tensor([prompt], device=model.device)
    clock = FirstTokenClock()
    t0 = time.perf_counter()
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
        streamer=clock, **kw,
    )
    sync_device(model.device)
    t1 = time.perf_counter()
    new = out[0, len(prompt):].tolist()
    first = clock.first or t1
    return new, (first - t0) * 1e3, (t1 - first) * 1e3 / max(1, len(new) - 1)


def references(loaded, budget: int):
    """(plain, prompt lookup, their name): runners (prompt, n) -> (new tokens, prefill ms, ms per token) of the
    references every row is compared with. transformers' `generate` and its prompt lookup where the model has a
    transformers forward; for a .gguf loaded from its blocks (no transformers model: `lean_only`) our own engine's
    plain steps and its trees of context drafts alone (prompt lookup's drafts, verified as REST verifies)."""
    model = loaded.model
    if not getattr(model, "lean_only", False):
        return (lambda p, n: hf_generate(model, p, n),
                lambda p, n: hf_generate(model, p, n, prompt_lookup_num_tokens=10), "transformers generate")
    decoder = Decoder(loaded)

    def ours(prompt: list[int], n: int, lookup: bool):
        decoder.reset()
        r = decoder.generate(prompt, ContextLookup(), DecodeConfig(max_new_tokens=n, budget=budget if lookup else 0))
        return r.tokens, r.prefill_ms, r.ms_per_token

    return (lambda p, n: ours(p, n, False), lambda p, n: ours(p, n, True),
            "rest-lsp's engine: a .gguf loaded from its blocks has no transformers forward")


def index_corpus(tok, corpus: Path) -> tuple[Datastore, list[Path], list[list[int]]]:
    files = python_files(corpus)
    store = Datastore()
    token_lists = tok.encode_batch([p.read_text(encoding="utf-8", errors="replace") for p in files])
    for path, ids in zip(files, token_lists):
        store.put(str(path), ids)
    return store, files, token_lists


class Useless:
    """A source that is always wrong and sure of it: REST must cost no more than plain decoding with it."""

    def __init__(self, vocab: int, seed: int = 0):
        self.rng = random.Random(seed)
        self.vocab = vocab

    def propose(self, context):
        chain = tuple(self.rng.randrange(self.vocab) for _ in range(8))
        return [Proposal("useless", 16, chain, tuple(range(-1, 7)), (1.0,) * 8)]


def credit(learn, counts: dict):
    """Decoder._learn that also counts, per source, the accepted drafts it had proposed (a node several sources
    proposed counts for each)."""

    def wrapped(recycle, tree, path, accepted, logits_at):
        for node in path[1 : len(accepted)]:
            for source in {key[0] for key, _ in tree.votes[node]}:
                counts[source] = counts.get(source, 0) + 1
        counts[""] = counts.get("", 0) + 1  # steps
        return learn(recycle, tree, path, accepted, logits_at)

    return wrapped


def print_learned(decoders: dict, found: dict, credited: dict, configs: list) -> None:
    """The step-cost curve each REST decoder learned from its steps beside the one calibration measured, and the
    accepted drafts per step each source had proposed."""
    for c in configs:
        d = decoders[c]
        if c.startswith("own-plain") or not d.costs.seen():
            continue
        measured = found[d.engine].curve
        print(f"\n{c}: step cost learned from its steps (seeded {d.costs.source}; {d.costs.probes} growth probes, "
              f"{d.costs.references} plain reference steps) vs calibration ({found[d.engine].source})")
        print("| rows | steps seen | learned | measured |\n|---|---|---|---|")
        for k, (n, learned) in sorted(d.costs.seen().items()):
            at = measured[k] if k < len(measured) else float("nan")
            print(f"| {k} | {n} | {learned:.2f}x | {at:.2f}x |")
        steps = credited[c].get("", 0)
        if steps:
            print("| source | accepted drafts per step |\n|---|---|")
            for source, count in sorted(credited[c].items(), key=lambda kv: -kv[1]):
                if source:
                    print(f"| {source} | {count / steps:.2f} |")


def llama_speculation(gguf: str, prompts: list[list[int]], n: int, rows: list[dict], plain_runs: list,
                      summary: dict) -> None:
    """llama-server with each of its model-free speculations (llama_vim.SPEC_FLAGS), greedy, on the same prompts:
    a row each beside llama.cpp plain; its output compared with llama.cpp plain decoding's."""
    from llama_cpp_peer import llama_server_runs
    from llama_vim import SPEC_FLAGS

    threads = torch.get_num_threads()
    for spec in SPEC_FLAGS:
        runs = llama_server_runs(gguf, prompts, n, threads, spec)
        if runs is None:
            print(f"| llama-server {spec} | no llama-server (bash benchmarks/build_llama_server.sh) | | | | | | |")
            return
        key = f"llama_server_{spec.replace('-', '_')}"
        for r, run in zip(rows, runs):
            r[f"{key}_ms_per_token"] = run.ms_per_token
            r[f"{key}_tokens_per_step"] = run.tokens_per_step
        m = statistics.median(r[f"{key}_ms_per_token"] for r in rows)
        tps = statistics.median(r[f"{key}_tokens_per_step"] for r in rows)
        same = sum(run.tokens[:n] == plain.tokens[:n] for run, plain in zip(runs, plain_runs))
        summary[key] = {"median_ms_per_token": m, "median_tokens_per_step": tps, "identical_to_llama_cpp": same,
                        "vs_llama_cpp": statistics.median(r[f"{key}_ms_per_token"] / r["llama_cpp_ms_per_token"]
                                                          for r in rows)}
        print(f"| llama-server {spec} (greedy, {threads} threads; identical to llama.cpp plain: {same}/{len(rows)}) "
              f"| {m:.1f} | {tps:.2f} | {summary['median_plain_ms_per_token'] / m:.2f}x | | | - | - |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, action="append",
                    help="a folder of Python code (repeatable; default: stdlib asyncio, json and email)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--prompts", type=int, default=12, help="completion points per corpus")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--context", type=int, default=512, help="prompt tokens kept (the tail)")
    ap.add_argument("--budget", type=int, default=None, help="draft nodes (default: the decoder's default for the device)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="rest")
    ap.add_argument("--compare-fixed", action="store_true",
                    help="also run REST with the full budget every step (no cut by the step-cost curve)")
    ap.add_argument("--ablate", action="store_true", help="also run REST with each draft source left out in turn")
    ap.add_argument("--useless", action="store_true", help="also run REST with a source that is always wrong")
    ap.add_argument("--transformers-engine", action="store_true",
                    help="also run REST on transformers' forward and DynamicCache instead of our lean engine")
    ap.add_argument("--eager-engine", action="store_true",
                    help="also run plain and REST on the lean engine's eager step (the default on a GPU replays "
                         "static steps from CUDA graphs)")
    ap.add_argument("--other-mode", action="store_true",
                    help="also run plain and REST in the CPU's other mode: float32 (exact) when the default is "
                         "float16-weights (fp32 arithmetic over fp16 copies of the linear weights), else that")
    ap.add_argument("--llama-cpp", action="store_true",
                    help="also time llama.cpp's plain decoding of the same GGUF and prompts (pip install -e .[bench]), "
                         "and llama-server's with ngram-mod and ngram-cache speculation where it is built "
                         "(build_llama_server.sh, or $LLAMA_SERVER)")
    args = ap.parse_args()
    corpora = args.corpus or stdlib_corpora("asyncio", "json", "email")
    for corpus in corpora:
        if not any(corpus.rglob("*.py")):
            ap.error(f"--corpus {corpus}: no Python files there (is it a folder of code?)")

    loaded = load_model(args.model, args.device, args.dtype)
    tok, model = loaded.tokenizer, loaded.model
    from rest_lsp.commands.generation import default_budget

    budget = default_budget(loaded) if args.budget is None else args.budget
    where = torch.cuda.get_device_name(loaded.device) if loaded.device.type == "cuda" else "CPU"
    print(f"model {loaded.name} on {loaded.device} ({where}, {loaded.mode}), torch threads {torch.get_num_threads()}; "
          f"{args.max_new_tokens} new tokens; REST budget {budget}")

    # One decoder per REST configuration, each with its own cache, learned acceptance and model habits, all
    # starting empty (nothing loaded from disk) and living across corpora, as in a server.
    configs = ["own-plain", "rest"] + (["fixed"] if args.compare_fixed else []) + (["useless"] if args.useless else [])
    configs += ["rest-transformers"] if args.transformers_engine else []
    configs += ["own-plain-eager", "rest-eager"] if args.eager_engine else []
    # the default mode's configurations, and "-fp32" / "-fp16w" ones in the other mode; each mode's REST output is
    # compared with plain decoding in the same mode (transformers' generate for fp32, our plain step for fp16w)
    # ("own": a mode compared with our plain step in it alone: q8_0, gguf, bfloat16)
    default_mode = "fp16w" if loaded.packing == "fp16" else "fp32" if loaded.mode == "float32" else "own"
    other = "fp32" if default_mode != "fp32" else "fp16w"
    configs += [f"own-plain-{other}", f"rest-{other}"] if args.other_mode else []
    if args.ablate:
        # "held" is the start the server's prompts hold back at a line start; these prompts are raw text that
        # holds nothing back, so it never applies here (bench_replay's rest-no-held ablates it)
        configs += [f"-{name}" for name in SOURCE_NAMES if name != "held"]
    mode = {c: c.rsplit("-", 1)[1] if c.endswith(("-fp32", "-fp16w")) else default_mode for c in configs}

    def own_plain(c: str) -> str:
        """Our plain decoding in c's mode."""
        return "own-plain" if mode[c] == default_mode else f"own-plain-{mode[c]}"

    # fp32 configurations of a model loaded in float16-weights: the packing fp32 gets by default (our panel kernel,
    # else oneDNN), not the loaded model's
    fp32_packing = pick_packing(None, torch.float32, loaded.device)
    decoders = {c: Decoder(loaded, lean=c != "rest-transformers", static=False if c.endswith("-eager") else None,
                           pack="fp16" if mode[c] == "fp16w" else fp32_packing if c.endswith("-fp32") else None)
                for c in configs}
    found = {}
    for d in decoders.values():  # this machine's step-cost curve, per engine
        if d.engine not in found:
            found[d.engine] = d.calibrate()
            ms = found[d.engine].ms
            print(f"step cost, {d.engine} engine ({found[d.engine].source}): {ms[1]:.1f} ms for 1 token; "
                  + ", ".join(f"{k}: {v / ms[1]:.2f}x" for k, v in sorted(ms.items())))
        d.run = d.run.measured(found[d.engine].curve)
        d.costs.seed(found[d.engine].curve, "measured")  # the seed; each decoder learns its own from its steps
    credited = {c: {} for c in configs}  # per configuration, source -> accepted drafts it had proposed
    for c in configs:
        decoders[c]._learn = credit(decoders[c]._learn, credited[c])
    recycles = {c: SuccessorTable() for c in configs}
    outputs = {c: OutputStore() for c in configs}
    n = args.max_new_tokens
    # warm up every path once (first calls allocate and pick kernels)
    warm = tok.encode("def warm_up(x):\n    return x\n")
    plain_ref, lookup_ref, reference = references(loaded, budget)
    plain_ref(warm, 4)
    lookup_ref(warm, 4)
    Decoder(loaded).generate(warm, ContextLookup(), DecodeConfig(max_new_tokens=4, budget=budget))

    rows = []
    prompts_used: list[list[int]] = []
    for corpus in corpora:
        t0 = time.perf_counter()
        store, files, token_lists = index_corpus(tok, corpus)
        points = completion_points(files, args.prompts, args.seed)
        print(f"corpus {corpus}: {len(files)} files, {sum(map(len, token_lists))} tokens, indexed in "
              f"{time.perf_counter() - t0:.1f} s; {len(points)} completion points", flush=True)
        for path, offset in points:
            full = path.read_text(encoding="utf-8", errors="replace")
            text = full[:offset]
            prompt = tok.encode(text)[-args.context:]
            prompts_used.append(prompt)
            suffix = tok.encode(text_after_function(full, offset)[:4000])
            store.remove(str(path))  # the function being written is not in the workspace yet

            plain, _, plain_ms = plain_ref(prompt, n)
            pld, _, pld_ms = lookup_ref(prompt, n)
            row = {
                "corpus": corpus.name, "file": str(path.relative_to(corpus)), "line": text.count("\n"),
                "prompt_tokens": len(prompt), "plain_ms_per_token": plain_ms, "pld_ms_per_token": pld_ms,
                "speedup_pld": plain_ms / pld_ms, "pld_equals_plain": pld == plain,
            }
            written = {}  # config -> its tokens: float16-weights is compared with its own plain decoding
            for c in configs:
                if c == "useless":
                    drafts = Useless(loaded.model.config.vocab_size, args.seed)
                else:
                    drafts = rest_drafts(store, suffix=suffix, outputs=outputs[c], recycle=recycles[c],
                                         exclude=[c[1:]] if c.startswith("-") else ())
                decoders[c].reset()  # a cold cache per prompt, as for the others
                result = decoders[c].generate(prompt, drafts, DecodeConfig(
                    max_new_tokens=n, budget=0 if c.startswith("own-plain") else budget, fit_to_cost=c != "fixed"))
                outputs[c].add(prompt[-32:], result.tokens)
                written[c] = result.tokens
                row.update({
                    f"{c}_ms_per_token": result.ms_per_token,
                    f"{c}_tokens_per_step": result.tokens_per_step,
                    f"{c}_draft_share": result.draft_ms / result.decode_ms,  # of decode time: retrieval + trees
                    f"speedup_{c}": plain_ms / result.ms_per_token,
                    f"{c}_equals_plain": result.tokens == (plain if mode[c] == "fp32" else written[own_plain(c)]),
                })
            store.put(str(path), token_lists[files.index(path)])
            rows.append(row)
            print(f"  {corpus.name}/{row['file']}:{row['line']}: plain {plain_ms:.1f} ms/tok, PLD {pld_ms:.1f}, "
                  f"REST {row['rest_ms_per_token']:.1f} ({row['rest_tokens_per_step']:.2f} tok/step), "
                  f"equal={row['rest_equals_plain']}", flush=True)
        store.close()

    print()
    print("| completion point | prompt tok | plain ms/tok | PLD ms/tok | REST ms/tok | REST tok/step | PLD speedup | REST speedup | REST == plain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['corpus']}/{r['file']}:{r['line']} | {r['prompt_tokens']} | {r['plain_ms_per_token']:.1f} | "
              f"{r['pld_ms_per_token']:.1f} | {r['rest_ms_per_token']:.1f} | {r['rest_tokens_per_step']:.2f} | "
              f"{r['speedup_pld']:.2f}x | {r['speedup_rest']:.2f}x | {'yes' if r['rest_equals_plain'] else 'NO'} |")
    med = lambda k, rs=rows: statistics.median(r[k] for r in rs)  # noqa: E731
    summary = {
        "prompts": len(rows),
        "corpora": [str(c) for c in corpora],
        "median_plain_ms_per_token": med("plain_ms_per_token"),
        "median_pld_ms_per_token": med("pld_ms_per_token"),
        "median_speedup_pld": med("speedup_pld"),
        "pld_identical": sum(r["pld_equals_plain"] for r in rows),
        "budget": budget, "device": str(loaded.device), "dtype": loaded.mode, "max_new_tokens": n,
    }
    names = {"fp32": "float32", "fp16w": "float16-weights", "own": loaded.mode}
    labels = {"own-plain": f"plain, rest-lsp's engine (no drafts), {names[default_mode]}",
              "rest": f"REST (default: {names[default_mode]})",
              f"own-plain-{other}": f"plain, rest-lsp's engine, {names[other]}",
              f"rest-{other}": f"REST, {names[other]}",
              "own-plain-eager": "plain, rest-lsp's engine, eager step", "rest-eager": "REST, eager step",
              "rest-transformers": "REST on transformers' forward",
              "fixed": "REST, full budget every step", "useless": "REST, always-wrong source",
              **{f"-{s}": f"REST without {s}" for s in SOURCE_NAMES}}
    print("\n| configuration | median ms/token | median tokens/step | median speedup vs plain | vs prompt lookup | "
          "slowest prompt vs plain | identical to plain decoding in its mode | drafting share of decode time |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| plain ({reference}) | {summary['median_plain_ms_per_token']:.1f} | 1 | 1x | | | - | - |")
    print(f"| prompt lookup ({reference.split(':')[0]}) | {summary['median_pld_ms_per_token']:.1f} | - | {summary['median_speedup_pld']:.2f}x | "
          f"1x | {min(r['speedup_pld'] for r in rows):.2f}x | {summary['pld_identical']}/{len(rows)} | - |")
    if args.llama_cpp:
        # after all of ours, in this process: timed between our runs, llama.cpp ran 2-3x slower here (27-34 ms per
        # token instead of 10-15), so it gets the cores to itself, as a user running it would
        sys.path.insert(0, str(Path(__file__).parent))
        from llama_cpp_peer import llama_cpp_runs

        plain_runs = llama_cpp_runs(loaded.name, prompts_used, n, torch.get_num_threads())
        for r, run in zip(rows, plain_runs):
            r["llama_cpp_ms_per_token"] = run.ms_per_token
        summary["median_llama_cpp_ms_per_token"] = m = med("llama_cpp_ms_per_token")
        print(f"| llama.cpp plain (same GGUF, {torch.get_num_threads()} threads) | {m:.1f} | 1 | "
              f"{summary['median_plain_ms_per_token'] / m:.2f}x | | | - | - |")
        llama_speculation(loaded.name, prompts_used, n, rows, plain_runs, summary)
    for c in configs:
        vs_pld = statistics.median(r["pld_ms_per_token"] / r[f"{c}_ms_per_token"] for r in rows)
        summary[c] = x = {
            "median_ms_per_token": med(f"{c}_ms_per_token"),
            "median_tokens_per_step": med(f"{c}_tokens_per_step"),
            "median_speedup": med(f"speedup_{c}"),
            "median_speedup_vs_pld": vs_pld,
            "slowest_speedup": min(r[f"speedup_{c}"] for r in rows),
            "identical": sum(r[f"{c}_equals_plain"] for r in rows),
            "median_draft_share": med(f"{c}_draft_share"),
        }
        if args.llama_cpp:  # this configuration's ms/token over llama.cpp's, prompt by prompt
            x["vs_llama_cpp"] = statistics.median(r[f"{c}_ms_per_token"] / r["llama_cpp_ms_per_token"] for r in rows)
        print(f"| {labels[c]} | {x['median_ms_per_token']:.1f} | {x['median_tokens_per_step']:.2f} | "
              f"{x['median_speedup']:.2f}x | {vs_pld:.2f}x | {x['slowest_speedup']:.2f}x | {x['identical']}/{len(rows)} | "
              f"{100 * x['median_draft_share']:.1f}% |")
    if args.llama_cpp:
        spec_keys = [k for k in summary if k.startswith("llama_server_")]
        print("\n| configuration | ms/token over llama.cpp's (median of prompts) | slowest prompt vs our plain step in "
              "the same mode |" + "".join(f" over {k.replace('_', '-')}'s |" for k in spec_keys))
        print("|---|---|---|" + "---|" * len(spec_keys))
        for c in configs:
            slowest = min(r[f"{own_plain(c)}_ms_per_token"] / r[f"{c}_ms_per_token"] for r in rows)
            summary[c]["slowest_vs_own_plain"] = slowest
            over = [statistics.median(r[f"{c}_ms_per_token"] / r[f"{k}_ms_per_token"] for r in rows)
                    for k in spec_keys]
            print(f"| {labels[c]} | {summary[c]['vs_llama_cpp']:.2f}x | {slowest:.2f}x |"
                  + "".join(f" {x:.2f}x |" for x in over))
    print_learned(decoders, found, credited, configs)
    if len(corpora) > 1:
        print("\n| corpus | prompts | REST median speedup | REST tokens/step | PLD median speedup |")
        print("|---|---|---|---|---|")
        for corpus in corpora:
            rs = [r for r in rows if r["corpus"] == corpus.name]
            if rs:
                print(f"| {corpus.name} | {len(rs)} | {med('speedup_rest', rs):.2f}x | {med('rest_tokens_per_step', rs):.2f} | "
                      f"{med('speedup_pld', rs):.2f}x |")

    write_json(RESULTS / f"{args.out}.json", {"summary": summary, "rows": rows})
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
