"""Where a tree step's matmul time goes: the weight stream, or its rows' multiplies (the code model's step shapes).

    .venv/bin/python benchmarks/step_budget.py [--levels avx2,avx512-vnni] [--bits 5,8] [--rows 1,8,16]
                                               [--threads 2] [--rounds 5] [--tile-rounds 20]

Per level and format, two measurements taken here:
- the streamed pass (step_curve.py's: every layer's weights distinct, so each comes from memory once a pass) at
  each row count, wall ms on --threads threads;
- the compute of the same pass's rows where the weights would cost nothing to bring in: the level's tiles with their
  panels in cache (tile_rates.py's harness: ns a row and block of 16 columns, one thread) times the pass's blocks,
  a call of r rows run as the kernel runs it (tiles of at most MT rows), over the threads.
A core that streams its weights while it multiplies would take about max(1-row pass, compute of r rows) for r
rows; one that does not, the 1-row pass plus the compute the extra rows add. The table puts both beside the measured
pass and says how much of the time the extra rows could hide under the stream they did hide (0: none, the times add
up; 1: all, the pass took the longer of the two), and what the extra compute must stay under for a bar on the ratio
to the 1-row pass (issue 35: 8 rows at most 1.5x, 16 at most 2x) if they add up. Writes
benchmarks/results/step_budget.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import step_curve  # noqa: E402
import tile_rates  # noqa: E402
from benchmarks.harness import RESULTS, write_json  # noqa: E402
from rest_lsp.kernels import levels, quant_matmul  # noqa: E402

BARS = {8: 1.5, 16: 2.0}  # issue 35's step-cost bars: rows -> at most this times the 1-row pass


def pass_blocks(bits: int, layers: int = step_curve.LAYERS, head: bool = True) -> int:
    """Blocks of 16 columns x 32 k in one pass of the code model's shapes (step_curve's Pass)."""
    shapes = [shape for _ in range(layers) for shape in step_curve.LAYER.values()] + ([step_curve.HEAD] if head else [])
    if bits in quant_matmul.SUPER:
        shapes = [(n, -(-k // quant_matmul.SUPERBLOCK) * quant_matmul.SUPERBLOCK) for n, k in shapes]
    return sum(-(-n // quant_matmul.PANEL) * -(-k // quant_matmul.BLOCK) for n, k in shapes)


def compute_ms(ns: dict[int, float], rows: int, blocks: int, threads: int) -> float:
    """ms of `rows` rows' multiplies over `blocks` blocks in cache, run as the kernel runs a call: tiles of at most
    max(ns) rows (the level's largest), `ns` a row and block by tile size; the blocks shared by `threads` threads."""
    tile, total, left = max(ns), 0.0, rows
    while left > 0:
        r = min(left, tile)
        total += r * ns[r]
        left -= r
    return total * blocks / threads / 1e6


def cells_of(streamed: dict[int, float], ns: dict[int, float], blocks: int, threads: int) -> dict[int, dict]:
    """Per row count: the measured pass (`streamed`, ms, 1 row among them), the compute in cache, both predictions,
    the share of the extra rows' compute hidden under the stream, and a bar's room where the two add up."""
    one, c1 = streamed[1], compute_ms(ns, 1, blocks, threads)
    cells = {}
    for r, measured in sorted(streamed.items()):
        c = compute_ms(ns, r, blocks, threads)
        added, overlapped = one + (c - c1), max(one, c)
        hidden = (added - measured) / (added - overlapped) if r > 1 and added > overlapped else None
        cells[r] = {"measured_ms": measured, "ratio": measured / one, "compute_ms": c, "additive_ms": added,
                    "overlapped_ms": overlapped, "hidden": hidden, "extra_compute_ms": c - c1, "bar": BARS.get(r),
                    "bar_room_ms": (BARS[r] - 1) * one if r in BARS else None}
    return cells


def budget(level: str, bits: int, rows: list[int], threads: int, rounds: int, ns: dict[int, float],
           layers: int = step_curve.LAYERS, head: bool = True) -> dict:
    """One level's and format's table: `cells_of` the streamed passes measured now."""
    streamed = step_curve.curves([level], bits, rows, layers=layers, rounds=rounds, threads=threads, head=head)[level]
    blocks = pass_blocks(bits, layers, head)
    return {"blocks": blocks, "cells": cells_of(streamed, ns, blocks, threads)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = [lv for lv in ("avx2", "avx-vnni", "avx512-vnni", "amx") if lv in levels.runnable()]
    parser.add_argument("--levels", default=",".join(lv for lv in here if lv != "amx"),
                        help=f"comma-separated, of {', '.join(here) or 'none here'}")
    parser.add_argument("--bits", default="5,8", help="formats by code (quant_matmul.FORMATS): 8 Q8_0, 5 Q5_0, ...")
    parser.add_argument("--rows", default="1,8,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tile-rounds", type=int, default=20)
    args = parser.parse_args()
    asked = [lv for lv in args.levels.split(",") if lv]
    for level in asked:
        levels.check_runnable(level)  # one sentence for a level this CPU lacks, before any build
    rows = sorted({1, *(int(r) for r in args.rows.split(","))})
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        rates = {level: tile_rates.measure(tile_rates.build(level, Path(tmp)), args.tile_rounds) for level in asked}
    results: dict[str, dict] = {}
    print(f"The code model's step shapes (24 layers + head), {args.threads} thread(s); measured: a streamed pass, "
          f"median of {args.rounds}; compute: the tiles in cache (best of {args.tile_rounds}) x the pass's blocks. ms.")
    for bits in (int(b) for b in args.bits.split(",")):
        name = next(kind for kind, code in quant_matmul.FORMATS.items() if code == bits)
        for level in asked:
            row = budget(level, bits, rows, args.threads, args.rounds, rates[level][bits])
            results.setdefault(name, {})[level] = row
            print(f"\n{name}, {level} ({row['blocks']} blocks a pass)")
            print("| rows | measured (ratio) | compute in cache | 1 row + extra compute | max(1 row, compute) "
                  "| extra compute hidden | bar: extra compute allowed if additive |")
            print("|---|---|---|---|---|---|---|")
            for r, c in row["cells"].items():
                hidden = "-" if c["hidden"] is None else f"{c['hidden']:.2f}"
                bar = ("-" if c["bar"] is None
                       else f"{c['bar']}x: {c['bar_room_ms']:.1f} (has {c['extra_compute_ms']:.1f})")
                print(f"| {r} | {c['measured_ms']:.1f} ({c['ratio']:.2f}x) | {c['compute_ms']:.1f} | "
                      f"{c['additive_ms']:.1f} | {c['overlapped_ms']:.1f} | {hidden} | {bar} |")
    write_json(RESULTS / "step_budget.json", {"threads": args.threads, "rows": rows, "results": results})


if __name__ == "__main__":
    main()
