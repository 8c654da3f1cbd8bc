"""How often torch's first cos of a process comes back wrong: N fresh processes each build a rotary table's angles
([1024, 64], Qwen2.5's theta) and take their cos the way the lean engine once did (one call over the whole table,
split between torch's threads), and the way it does now (`rotary.cos_sin`: a one-element cos first, then pieces
one thread computes); each is compared, bit for bit, with the same cos taken one row at a time afterwards.

    .venv/bin/python benchmarks/first_cos.py [--processes 100] [--threads 2]

On the 2-core AMX Xeon of docs/LOG.md (2026-12-06, night) the whole-table way was wrong in the worker thread's half in
5 of 300 processes beside other work; `cos_sin` in none of 150. A process that got it wrong kept the table for its life.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import sys, torch
torch.set_num_threads({threads})
way = sys.argv[1]
inv = 1.0 / (1000000.0 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64))
f = torch.arange(1024).float()[:, None] * inv[None, :]
angles = torch.cat([f, f], -1)  # [1024, 64]
if way == "whole":
    cos = angles.cos()
else:
    from rest_lsp.engine.rotary import cos_sin
    cos = cos_sin(angles)[0]
rows = torch.cat([angles[i : i + 1].cos() for i in range(1024)])
wrong = (cos != rows).nonzero()
print(len(wrong), int(wrong[0, 0]) if len(wrong) else -1, int(wrong[-1, 0]) if len(wrong) else -1)
"""


def wrong_processes(way: str, processes: int, threads: int) -> list[tuple[int, int, int]]:
    """(wrong elements, first row, last row) of each process whose first cos was wrong."""
    found = []
    for _ in range(processes):
        out = subprocess.run([sys.executable, "-c", CHILD.format(threads=threads), way], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.split()
        count, first, last = (int(v) for v in out)
        if count:
            found.append((count, first, last))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"{args.processes} fresh processes a way, {args.threads} torch threads")
    print("| way | processes with a wrong first cos | wrong elements (rows) |")
    print("|---|---|---|")
    for way, name in (("whole", "one call over the table"), ("pieces", "rotary.cos_sin")):
        found = wrong_processes(way, args.processes, args.threads)
        detail = "; ".join(f"{c} ({a}-{b})" for c, a, b in found[:5]) or "-"
        print(f"| {name} | {len(found)} of {args.processes} | {detail} |", flush=True)


if __name__ == "__main__":
    main()
