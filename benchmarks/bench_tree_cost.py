"""Cost of one verification step by tree size, on top of a real context: what the draft budget must follow.

    .venv/bin/python benchmarks/bench_tree_cost.py [--model M] [--device D] [--dtypes T[,T...]] [--context 512]
                                                   [--plot FILE.png]

Prints, per mode, the median ms of a step with 1 (plain decoding), 2, 4, ... 64 tree tokens and its ratio to a plain
step, and with --plot draws the ratios of every mode in one picture (benchmarks/RESULTS.md, "Step cost"). With
tokens/step t at budget n, REST's best speedup is t / ratio(n).
"""

from __future__ import annotations

import argparse
import statistics
import sysconfig
import time
from pathlib import Path

import torch

from rest_lsp.engine.decoding import Decoder, sync_device
from rest_lsp.drafting.draft_tree import build_tree
from rest_lsp.engine.model import load_model

SIZES = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtypes", default="auto", help="comma-separated modes, e.g. float32,float16-weights,q8_0")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--plot", default=None, help="draw every mode's step-cost ratios into this PNG")
    args = ap.parse_args()
    curves = {}
    for dtype in args.dtypes.split(","):
        loaded, rows = measure(args.model, args.device, None if dtype == "auto" else dtype, args.context, args.repeats)
        curves[Decoder(loaded).mode] = rows
    if args.plot:
        plot(curves, args.plot)


def measure(model: str | None, device: str | None, dtype: str | None, context: int, repeats: int):
    """(the loaded model, [(tree tokens, median ms)]) for one mode, after printing its table."""
    loaded = load_model(model, device, dtype)
    text = (Path(sysconfig.get_paths()["stdlib"]) / "asyncio" / "base_events.py").read_text()
    prompt = loaded.tokenizer.encode(text)[: context]
    decoder = Decoder(loaded)
    # a branchy tree: two children per node, breadth first, `size - 1` draft nodes under the root
    conts = [(tuple(100 + ((i >> k) & 1) for k in range(6)), 1.0) for i in range(64)]
    trees = {size: build_tree(prompt[-1], conts, size - 1) for size in SIZES}
    times: dict[int, list[float]] = {size: [] for size in SIZES}
    for rep in range(repeats + 1):
        for size in SIZES:  # interleaved, so a slow moment of the machine hits every size alike
            decoder.prefill(prompt[:-1])  # crops the previous step's rows: same cache every time
            t0 = time.perf_counter()
            logits_at = decoder.verify(trees[size])
            logits_at(0)
            sync_device(decoder.device)
            if rep:  # the first round warms up
                times[size].append((time.perf_counter() - t0) * 1e3)
    rows = [(size, statistics.median(times[size])) for size in SIZES]
    base = rows[0][1]
    print(f"model {loaded.name} on {loaded.device} ({loaded.dtype}), context {len(prompt)} tokens, "
          f"torch threads {torch.get_num_threads()}")
    print("| tree tokens (root + drafts) | " + " | ".join(str(s) for s, _ in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    print("| ms per step | " + " | ".join(f"{ms:.1f}" for _, ms in rows) + " |")
    print("| x plain step | " + " | ".join(f"{ms / base:.2f}" for _, ms in rows) + " |")
    return loaded, rows


def plot(curves: dict[str, list[tuple[int, float]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, rows in curves.items():
        base = rows[0][1]
        ax.plot([s for s, _ in rows], [ms / base for _, ms in rows], marker="o", label=f"{mode} ({base:.1f} ms at 1)")
    ax.set_xlabel("tokens verified in one step (root + drafts)")
    ax.set_ylabel("step time / one-token step")
    ax.set_title("What a tree step costs, per mode (bench_tree_cost.py)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
