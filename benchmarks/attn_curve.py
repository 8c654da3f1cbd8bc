"""The row-exact attention kernel alone over one step of the code model (Qwen2.5-Coder-0.5B's attention shapes), by
rows a call and instruction-set level: what a tree step's attention costs per layer for its rows.

    .venv/bin/python benchmarks/attn_curve.py [--levels portable,avx2,avx-vnni,avx512-vnni] [--rows 1,2,4,8,16]
                                              [--past 512] [--layers 24] [--rounds 7] [--threads 1]

A pass is what a step's attention does: per layer one call with 14 query heads over 2 key/value heads of 64, the
`past` committed cache rows every row shares, then the new rows under a random tree mask (a row sees its ancestors
and itself); each layer's caches are distinct (so they come from memory once a pass, as in a real step). The rows a
call and the levels take turns within each round (the machine is shared and its speed drifts); a cell is the median
of the rounds divided by the layers, and the ratio is to the same level's 1-row call. `attn_curve(level)` returns
one level's curve, for other benchmarks to import.
"""

from __future__ import annotations

import argparse
import time

import torch

from turns import medians  # benchmarks/ is on the path when this file runs
from rest_lsp.kernels import levels, row_attention

HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64  # Qwen2.5-Coder-0.5B
LAYERS = 24
PAST = 512
ROWS = (1, 2, 4, 8, 16)


def tree_mask(rows: int, gen: torch.Generator) -> torch.Tensor:
    """Additive [rows, rows]: a random tree (parents precede children), a node sees its ancestors and itself."""
    mask = torch.full((rows, rows), torch.finfo(torch.float32).min)
    for i in range(rows):
        mask[i, i] = 0
        if i:
            mask[i] = torch.maximum(mask[i], mask[int(torch.randint(0, i, (1,), generator=gen))])
    return mask


class Pass:
    """A step's caches (`past` committed rows and room for the new ones, per layer) and queries, and the calls that
    attend `rows` new rows in every layer."""

    def __init__(self, past: int = PAST, layers: int = LAYERS, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        capacity = past + max(ROWS) * 2
        self.past = past
        self.caches = [(torch.randn(KV_HEADS, capacity, HEAD_DIM, generator=gen),
                        torch.randn(KV_HEADS, capacity, HEAD_DIM, generator=gen)) for _ in range(layers)]
        self.q = torch.randn(HEADS, max(ROWS) * 2, HEAD_DIM, generator=gen)
        self.masks = {r: tree_mask(r, gen) for r in range(1, max(ROWS) * 2 + 1)}
        self.out = torch.empty(max(ROWS) * 2, HEADS * HEAD_DIM)

    def run(self, lib, rows: int, threads: int) -> float:
        """One pass of `rows` rows on `lib`, in ms (CPU time of this thread on one thread, else wall clock)."""
        q = self.q[:, :rows].contiguous()
        mask = self.masks[rows]
        clock = time.thread_time if threads == 1 else time.perf_counter
        start = clock()
        for k, v in self.caches:
            if lib.row_attn(q.data_ptr(), q.numel(), rows, HEADS, KV_HEADS, HEAD_DIM, k.data_ptr(), v.data_ptr(),
                            k.numel(), k.stride(0), self.past, mask.data_ptr(), mask.numel(), rows, rows,
                            HEAD_DIM**-0.5, self.out.data_ptr(), self.out.numel(), threads) != 0:
                raise MemoryError("row_attn: no scratch memory")
        return (clock() - start) * 1e3


def curves(levels_: list[str], rows=ROWS, past: int = PAST, layers: int = LAYERS, rounds: int = 7,
           threads: int = 1) -> dict[str, dict[int, float]]:
    """{level: {rows: median ms of one layer's call}}, the levels and row counts taking turns."""
    libs = {level: row_attention.library(level) for level in levels_}
    missing = [level for level, lib in libs.items() if lib is None]
    if missing:
        raise RuntimeError(f"no row-exact attention kernel at level(s) {', '.join(missing)} here")
    step = Pass(past, layers)
    for lib in libs.values():  # warm: the pages touched, each library's first call made
        step.run(lib, 1, threads)
    runs = {level: lambda r, lib=lib: step.run(lib, r, threads) / layers for level, lib in libs.items()}
    return medians(runs, rows, rounds)


def attn_curve(level: str, rows=ROWS, **kwargs) -> dict[int, float]:
    """One level's curve: {rows: median ms of one layer's attention} (see `curves` for the keyword arguments)."""
    return curves([level], rows, **kwargs)[level]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = [lv for lv in ("avx2", "avx-vnni", "avx512-vnni") if lv in levels.runnable()]
    parser.add_argument("--levels", default=",".join(default))
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--past", type=int, default=PAST)
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    result = curves(args.levels.split(","), rows, args.past, args.layers, args.rounds, args.threads)
    clock = "CPU" if args.threads == 1 else "wall"
    print(f"{HEADS} query heads, {KV_HEADS} key/value heads of {HEAD_DIM}, {args.past} cached keys + a tree of the "
          f"new rows; {args.threads} thread(s), medians of {args.rounds} rounds; {clock} ms a layer (ratio to 1 row)")
    print("level        | " + " | ".join(f"{r} rows" for r in rows))
    for level, curve in result.items():
        one = curve.get(1, curve[rows[0]])
        print(f"{level:12s} | " + " | ".join(f"{curve[r]:6.3f} ({curve[r] / one:5.2f}x)" for r in rows))


if __name__ == "__main__":
    main()
