"""The integer kernel's tiles alone, their panels in cache: what a tree's rows cost where memory is not the limit.

    .venv/bin/python benchmarks/tile_rates.py [--levels avx2,avx512-vnni] [--formats Q8_0,Q5_0,Q4_K,Q6_K]
                                              [--rows 1,2,4,8,16] [--rounds 30]

For each level this CPU executes (default: every one from AVX2 up), `benchmarks/c/tile_rates.c` is built around the
kernel's own source with the level's flags and calls each format's tiles over 4 panels of 48 blocks (k = 1536: they
stay in L2), one thread, the best of --rounds timings. A cell is ns a row and block of 16 columns (512
multiply-adds); compare it with the issue rate of the level's multiplies, not with a step (a step streams its panels
from memory). The 1-row column is the compute under a plain step's stream. Prints a markdown table; writes
benchmarks/results/tile_rates.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import RESULTS, write_json  # noqa: E402
from rest_lsp.kernels import levels, loader, quant_matmul  # noqa: E402

HARNESS = Path(__file__).resolve().parent / "c" / "tile_rates.c"
SOURCE = Path(quant_matmul.__file__).with_suffix(".c")


def build(level: str, into: Path) -> Path:
    """The harness built for `level` with the kernel's flags (no -shared: an executable)."""
    cc = loader._compiler()  # the one the kernels are built with
    if cc is None:
        sys.exit("tile_rates needs a C compiler (cc or gcc, or $CC).")
    flags = [f for f in quant_matmul.FLAGS if f not in ("-shared", "-fPIC")] + list(levels.compiler_flags(level))
    exe = into / f"tile_rates-{level}"
    subprocess.run([cc, *flags, f'-DKERNEL_SOURCE="{SOURCE}"', str(HARNESS), "-o", str(exe),
                    *quant_matmul.LIBS], check=True)
    return exe


def measure(exe: Path, rounds: int) -> dict[int, dict[int, float]]:
    """{format code: {rows: ns a row and block}} from one run of a built harness."""
    out = subprocess.run([str(exe), str(rounds)], check=True, capture_output=True, text=True).stdout
    cells: dict[int, dict[int, float]] = {}
    for line in out.split("\n"):
        if line.strip():
            fmt, rows, ns = line.split()
            cells.setdefault(int(fmt), {})[int(rows)] = float(ns)
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = [level for level in levels.runnable() if level != "portable"]
    ap.add_argument("--levels", default=",".join(here), help=f"comma-separated, of {', '.join(here) or 'none here'}")
    ap.add_argument("--formats", default="Q8_0,Q5_0,Q4_K,Q6_K", help=", ".join(quant_matmul.FORMATS))
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    asked = [level for level in args.levels.split(",") if level]
    if not asked:
        sys.exit("Nothing to time: no level from AVX2 up was asked for or runs here (the portable tiles are the "
                 "reference).")
    for level in asked:
        levels.check_runnable(level)  # one sentence for a level this CPU lacks, before any build
    formats = {name: quant_matmul.FORMATS[name] for name in args.formats.split(",")}
    rows = [int(r) for r in args.rows.split(",")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for level in asked:
            results[level] = measure(build(level, Path(tmp)), args.rounds)
    print(f"ns a row and block of 16 columns (512 multiply-adds), panels in cache, one thread, best of {args.rounds}")
    print()
    print("| format | level | " + " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in rows) + " |")
    print("|---|---|" + "---|" * len(rows))
    for name, code in formats.items():
        for level in asked:
            cells = results[level][code]
            print(f"| {name} | {level} | " + " | ".join(f"{cells[r]:.2f}" if r in cells else "-" for r in rows) + " |")
    write_json(RESULTS / "tile_rates.json", {"rows": rows, "formats": formats,
                                             "ns": {lv: {str(c): v for c, v in cells.items()}
                                                    for lv, cells in results.items()}})


if __name__ == "__main__":
    main()
