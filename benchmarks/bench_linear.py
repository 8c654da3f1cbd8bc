"""The linear layers of a step, timed for a few input rows: MKL (F.linear), oneDNN over weights packed once, and
rest-lsp's panel kernel (rest_lsp/kernels/panel_matmul.py; the fp32 default on a CPU where a C compiler built it). The
shapes are the default model's (SmolLM2-135M): fused q/k/v, o, fused gate/up, down, and the LM head.

    .venv/bin/python benchmarks/bench_linear.py [--threads 2] [--rows 1,2,4,8,12,16,64,256] [--layers 30]

Two tables:
  - one layer called again and again: small weights stay in the CPU's caches, so these are the kernels' own costs;
  - a pass over `--layers` layers of distinct weights (q/k/v, o, gate/up, down each), as a step makes: every weight
    comes from memory once, which is what a decoding step pays. First line: the time to only read those weights
    (a sum over each), the floor any kernel streams at.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from rest_lsp.engine.matmuls import Matmul, onednn_packs, panel_packs

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}
LAYER = ("qkv", "o", "gate_up", "down")


def per_call_us(fn, budget_s: float = 0.3) -> float:
    for _ in range(3):
        fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget_s:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def best_ms(fn, rounds: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,12,16,64,256")
    parser.add_argument("--layers", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    kinds = ["mkl"] + [k for k, runs in (("onednn", onednn_packs), ("panel", panel_packs)) if runs(torch.float32, cpu)]
    rows = [int(r) for r in args.rows.split(",")]

    def layer(weight: torch.Tensor, kind: str):
        if kind == "mkl":
            return lambda x: F.linear(x, weight)
        return Matmul.of(weight, None, pack=kind)

    print(f"One layer, us per call, fp32, {args.threads} threads; columns: {', '.join(kinds)}")
    print(f"{'layer':8} {'shape':>12} " + " ".join(f"{f'{m} rows':>22}" for m in rows))
    with torch.inference_mode():
        for name, (out, inp) in SHAPES.items():
            weight = torch.randn(out, inp)
            fns = [layer(weight, k) for k in kinds]
            cells = []
            for m in rows:
                x = torch.randn(m, inp)
                cells.append(" ".join(f"{per_call_us(lambda: fn(x)):6.0f}" for fn in fns))
            print(f"{name:8} {f'{out}x{inp}':>12} " + " ".join(f"{c:>22}" for c in cells), flush=True)

        weights = [[torch.randn(*SHAPES[name]) for name in LAYER] for _ in range(args.layers)]
        read = best_ms(lambda: [w.sum() for ws in weights for w in ws])
        mb = sum(w.numel() for ws in weights for w in ws) * 4 / 2**20
        print(f"\n{args.layers} layers of distinct weights ({mb:.0f} MB), ms per pass; "
              f"reading them only: {read:.1f} ms")
        print(f"{'kind':8} " + " ".join(f"{f'{m} rows':>9}" for m in rows))
        for kind in kinds:
            fns = [[layer(w, kind) for w in ws] for ws in weights]
            cells = []
            for m in rows:
                xs = {k: torch.randn(m, k) for k in {SHAPES[name][1] for name in LAYER}}
                cells.append(best_ms(lambda: [fn(xs[w.shape[1]]) for f, ws in zip(fns, weights)
                                              for fn, w in zip(f, ws)]))
            print(f"{kind:8} " + " ".join(f"{c:9.1f}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
