"""A CPU whose tree rows are dear, on this one: the language server with real compute added per row of a pass.

Whether REST stays no slower than plain decoding where a verification step's extra rows cost a lot (the AVX2-only
EPYC's 2-row steps took 1.28-1.53x a plain one, RESULTS.md) can be checked on any machine: this wrapper runs
`rest_lsp.cli` with every pass that computes more than one row (a draft tree, or a prompt tail under it) doing
about `--row-ms` milliseconds more of float matmuls on the decoder's threads for each row past the first. The count of
matmuls a row is fixed when the process starts (timed then), so other load slows it as it slows a real row's compute;
a sleep would not (it hands the GIL to other threads, and the step's tail grows). Plain steps are untouched; the
calibration and the mode choice time the same passes, so what the server learns is this dearer curve.

    .venv/bin/python benchmarks/bench_replay.py --dear-rows 4 ...   (every rest-lsp server of the run)
    .venv/bin/python benchmarks/dear_rows.py --row-ms 4 -- --stdio [rest-lsp flags]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rest_lsp first

SHAPE = (128, 1024, 1024)  # one matmul of busy work: [m, k] @ [k, n]


def busy_unit() -> tuple[Callable[[], None], float]:
    """(one unit of busy work, its median seconds on this machine now)."""
    m, k, n = SHAPE
    a, b = torch.randn(m, k), torch.randn(k, n)

    def unit() -> None:
        torch.mm(a, b)

    for _ in range(3):
        unit()
    times = []
    for _ in range(9):
        t = time.perf_counter()
        unit()
        times.append(time.perf_counter() - t)
    return unit, statistics.median(times)


def install(row_ms: float, unit: Callable[[], None] | None = None, unit_s: float | None = None) -> int:
    """Make every decoder pass of k > 1 rows (tree and chain) run `units` busy units k - 1 times first; returns
    `units`, the count a row that comes to about `row_ms` milliseconds (at least 1 when row_ms > 0)."""
    from rest_lsp.engine import decoding

    if row_ms <= 0:
        return 0
    if unit is None or unit_s is None:
        unit, unit_s = busy_unit()
    units = max(1, round(row_ms / 1e3 / unit_s))
    plain_pass = decoding.Decoder._pass

    def dear_pass(self, cache, tree, chain=()):
        for _ in range(units * (len(tree) + len(chain) - 1)):
            unit()
        return plain_pass(self, cache, tree, chain)

    decoding.Decoder._pass = dear_pass
    return units


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row-ms", type=float, required=True, help="milliseconds of compute added a row past one")
    args = parser.parse_args(argv[:split])
    install(args.row_ms)
    from rest_lsp.cli import main as cli_main

    return cli_main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
