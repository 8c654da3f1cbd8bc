"""One linear layer of the model, timed for a few input rows: MKL (F.linear) against oneDNN over weights packed
once (what rest_lsp.lean_llama.Matmul runs on a CPU in fp32). The shapes are the default model's (SmolLM2-135M):
fused q/k/v, o, fused gate/up, down, and the LM head.

    .venv/bin/python benchmarks/bench_linear.py [--threads 2] [--rows 1,2,4,8,16,64,256]

Each weight is small enough to stay in the CPU's caches between calls, so these are the kernels' own costs; a
whole step also streams every weight from memory (see `rest-lsp generate`'s step-cost line for that).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from rest_lsp.lean_llama import Matmul, onednn_packs

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}


def per_call_us(fn, budget_s: float = 0.3) -> float:
    for _ in range(3):
        fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget_s:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,16,64,256")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not onednn_packs(torch.float32, torch.device("cpu")):
        raise SystemExit("This torch has no oneDNN: nothing to compare.")
    rows = [int(r) for r in args.rows.split(",")]
    print(f"us per call, fp32, {args.threads} threads")
    print(f"{'layer':8} {'shape':>12} " + " ".join(f"{f'{m} rows':>22}" for m in rows))
    with torch.inference_mode():
        for name, (out, inp) in SHAPES.items():
            weight = torch.randn(out, inp)
            packed = Matmul.of(weight, None, pack="onednn")
            cells = []
            for m in rows:
                x = torch.randn(m, inp)
                mkl = per_call_us(lambda: F.linear(x, weight))
                dnn = per_call_us(lambda: packed(x))
                cells.append(f"{mkl:8.0f} {dnn:7.0f} ({dnn / mkl:.2f})")
            print(f"{name:8} {f'{out}x{inp}':>12} " + " ".join(f"{c:>22}" for c in cells), flush=True)
    print("columns: MKL us, oneDNN us (oneDNN / MKL)")


if __name__ == "__main__":
    main()
