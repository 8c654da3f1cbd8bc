"""The linear layers of a step of the code model (Qwen2.5-Coder-0.5B's shapes), timed for a few input rows on each
weight format: Q8_0 on our integer kernel (rest_lsp/engine/quant_matmul.py; its AVX2 build too with --avx2), fbgemm's
fp16 weights (float16-weights), bf16 weights (F.linear, the bfloat16 mode) and our fp32 panel kernel (float32).

    .venv/bin/python benchmarks/bench_quant.py [--threads 2] [--rows 1,2,4,8,12,16] [--layers 24] [--rounds 7]
                                               [--kinds q8,fp16,bf16,panel] [--avx2]

A pass over `--layers` layers of distinct weights (fused q/k/v, o, fused gate/up, down), then the LM head, as a step
makes them: every weight comes from memory once. The kinds take turns within each round (the machine is shared and
its speed drifts), and each cell is the median of the rounds. Also the bytes a pass streams per kind.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from rest_lsp.engine import quant_matmul
from rest_lsp.engine.lean_llama import Matmul, fp16_packs, panel_packs

# Qwen2.5-Coder-0.5B: hidden 896, 14 query heads and 2 key/value heads of 64, intermediate 4864, vocabulary 151936
SHAPES = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}
HEAD = (151936, 896)


def timed_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def layer(weight: torch.Tensor, kind: str):
    if kind == "q8":
        return Matmul.of(weight, None, "q8")
    if kind == "q8-avx2":
        panels, lib, n = quant_matmul.pack(weight), quant_matmul.library("-march=haswell"), weight.shape[0]
        return lambda x: quant_matmul.quant_mm(x, panels, n, None, lib=lib)
    if kind == "bf16":
        w = weight.to(torch.bfloat16)
        return lambda x: F.linear(x.to(torch.bfloat16), w)
    return Matmul.of(weight, None, kind)  # "fp16", "panel"


def stored_bytes(kind: str, out: int, inp: int) -> int:
    return {"q8": quant_matmul.panel_bytes(inp) * -(-out // 16), "q8-avx2": quant_matmul.panel_bytes(inp) * -(-out // 16),
            "fp16": out * inp * 2, "bf16": out * inp * 2, "panel": -(-out // 16) * 16 * inp * 4}[kind]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,12,16")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--kinds", default="q8,fp16,bf16,panel")
    parser.add_argument("--avx2", action="store_true", help="also the Q8_0 kernel's AVX2 build (-march=haswell)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    kinds = [k for k in args.kinds.split(",") if k]
    if args.avx2:
        kinds.append("q8-avx2")
    runs = {"q8": quantum_ok, "q8-avx2": lambda: quant_matmul.library("-march=haswell") is not None,
            "fp16": lambda: fp16_packs(torch.float32, cpu), "panel": lambda: panel_packs(torch.float32, cpu),
            "bf16": lambda: True}
    kinds = [k for k in kinds if runs[k]()]
    rows = [int(r) for r in args.rows.split(",")]
    print(f"Q8_0 kernel: {quant_matmul.path_name()}; {args.threads} threads; kinds: {', '.join(kinds)}")

    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        fns: dict[str, list] = {k: [] for k in kinds}
        heads: dict[str, object] = {}
        for _ in range(args.layers):
            for name in SHAPES:
                w = torch.randn(*SHAPES[name], generator=gen) * 0.02
                for k in kinds:
                    fns[k].append((layer(w, k), SHAPES[name][1]))
        w = torch.randn(*HEAD, generator=gen) * 0.02
        for k in kinds:
            heads[k] = layer(w, k)
        del w
        for k in kinds:
            mb = args.layers * sum(stored_bytes(k, *s) for s in SHAPES.values()) / 2**20
            print(f"  {k}: layers {mb:.0f} MB, head {stored_bytes(k, *HEAD) / 2**20:.0f} MB")

        layers_ms = {(k, m): [] for k in kinds for m in rows}
        head_ms = {(k, m): [] for k in kinds for m in rows}
        xs = {m: {inp: torch.randn(m, inp, generator=gen) for inp in (896, 4864)} for m in rows}
        for k in kinds:  # warm: first calls build and page in
            for fn, inp in fns[k]:
                fn(xs[1][inp])
            heads[k](xs[1][896])
        for _ in range(args.rounds):
            for m in rows:
                for k in kinds:
                    layers_ms[k, m].append(timed_ms(lambda: [fn(xs[m][inp]) for fn, inp in fns[k]]))
                    head_ms[k, m].append(timed_ms(lambda: heads[k](xs[m][896])))
        for title, table in ((f"{args.layers} layers, ms per pass (median of {args.rounds})", layers_ms),
                             ("LM head, ms per call", head_ms)):
            print(f"\n{title}")
            print(f"{'kind':8} " + " ".join(f"{f'{m} rows':>9}" for m in rows) + "   x one row at the widest")
            for k in kinds:
                cells = [statistics.median(table[k, m]) for m in rows]
                print(f"{k:8} " + " ".join(f"{c:9.1f}" for c in cells) + f"   {cells[-1] / cells[0]:.2f}x", flush=True)


def quantum_ok() -> bool:
    return quant_matmul.available()


if __name__ == "__main__":
    main()
