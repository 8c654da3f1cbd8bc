"""Eager against torch.compile'd: one decoding step of the lean engine (rest_lsp/engine/lean_llama.py), 1, 4 and 8 tokens.

    .venv/bin/python benchmarks/bench_compile.py                 # default model, inductor, dynamic shapes
    .venv/bin/python benchmarks/bench_compile.py --freezing      # inductor's weight freezing / prepacking

Prints the compile time of each tree size's first call and the median step of each, eager and compiled, on a
cache of --context tokens. The decoder uses whichever this says pays (see README, "Decoding step").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rest_lsp.engine.lean_llama import LeanLlama
from rest_lsp.engine.model import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--freezing", action="store_true", help="torch._inductor.config.freezing = True")
    args = ap.parse_args()
    torch.set_grad_enabled(False)  # compiled code cannot write into inference-mode tensors (the KV cache)
    if args.freezing:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
    loaded = load_model(args.model, None, "float32")
    lean = LeanLlama(loaded.model, args.context + max(args.sizes) + 1)
    cache = lean.new_cache()
    cache.reserve(args.context + max(args.sizes))
    forward = LeanLlama.forward.__wrapped__  # without inference_mode, for the same reason
    ids = torch.randint(0, loaded.model.config.vocab_size, (args.context + max(args.sizes),))

    def eager(*a):
        return forward(lean, *a)

    eager(ids[: args.context], torch.arange(args.context), cache)
    compiled = torch.compile(eager, dynamic=True)

    def step(fn, n: int) -> float:
        cache.crop(args.context)
        mask = None if n == 1 else torch.zeros(n, n)
        t0 = time.perf_counter()
        fn(ids[args.context : args.context + n], torch.arange(args.context, args.context + n), cache, mask)
        return (time.perf_counter() - t0) * 1e3

    print(f"model {loaded.name}, fp32, torch threads {torch.get_num_threads()}, context {args.context}")
    print("| tokens | eager ms | compiled ms | first compiled call (compile) s |")
    print("|---|---|---|---|")
    for n in args.sizes:
        t0 = time.perf_counter()
        step(compiled, n)
        compile_s = time.perf_counter() - t0
        e = statistics.median(step(eager, n) for _ in range(args.repeats))
        c = statistics.median(step(compiled, n) for _ in range(args.repeats))
        print(f"| {n} | {e:.1f} | {c:.1f} | {compile_s:.0f} |", flush=True)


if __name__ == "__main__":
    main()
