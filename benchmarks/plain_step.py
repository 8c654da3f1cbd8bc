"""The lean engine's plain decoding step (one token, the LM head included) on a model, per mode: median wall and CPU
ms of a step over rounds that take turns between the modes (the machine is shared and its speed drifts).

    .venv/bin/python benchmarks/plain_step.py [--model SPEC] [--modes gguf,q8_0,float32] [--context 128]
                                              [--steps 64] [--rounds 7] [--threads 2] [--profile MODE]

A round runs `--steps` one-token steps after a cache of `--context` tokens (the cache cropped back after each, so
every step attends over the same keys), timed one by one; a cell is the median of the rounds' medians. `--profile`
prints torch.profiler's table of one round's ops in that mode instead.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rest_lsp.engine.lean_llama import LeanLlama
from rest_lsp.engine.model import load_model


def engine(spec: str | None, mode: str) -> LeanLlama:
    loaded = load_model(spec, "cpu", mode)
    return LeanLlama(loaded.model, 2048, pack=loaded.packing)


class Stepper:
    """One mode's engine over a cache of `context` random tokens, and its timed one-token steps."""

    def __init__(self, lean: LeanLlama, context: int):
        self.lean = lean
        vocab = getattr(lean.embed, "num_embeddings", None) or lean.embed.shape[0]  # a table, or rows read on demand
        self.ids = torch.randint(0, vocab, (context + 1,), generator=torch.Generator().manual_seed(0))
        self.positions = torch.arange(context + 1)
        self.context = context
        self.cache = lean.new_cache()
        lean.forward(self.ids[:context], self.positions[:context], self.cache)

    def step(self) -> None:
        c = self.context
        self.lean.head(self.lean.forward(self.ids[c:c + 1], self.positions[c:c + 1], self.cache))
        self.cache.crop(c)

    def round(self, steps: int) -> tuple[float, float]:
        """(median wall ms, median CPU ms of the process) of `steps` steps."""
        walls, cpus = [], []
        for _ in range(steps):
            w, c = time.perf_counter(), time.process_time()
            self.step()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--modes", default="gguf,q8_0,float32")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", default=None, help="a mode whose ops torch.profiler tabulates")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    modes = [args.profile] if args.profile else args.modes.split(",")
    steppers = {m: Stepper(engine(args.model, m), args.context) for m in modes}
    for s in steppers.values():
        s.round(8)  # warm: TorchScript's first runs, the pages touched
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            steppers[args.profile].round(args.steps)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
        return
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for i in range(args.rounds):
        for m in (modes if i % 2 == 0 else reversed(modes)):
            results[m].append(steppers[m].round(args.steps))
    print(f"{args.threads} thread(s), context {args.context}, median of {args.rounds} rounds of {args.steps} steps")
    for m, rs in results.items():
        wall = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        print(f"{m:10s} wall {wall:6.2f} ms/step  cpu {cpu:6.2f} ms/step  "
              f"(rounds' wall {min(r[0] for r in rs):.2f}-{max(r[0] for r in rs):.2f})")


if __name__ == "__main__":
    main()
