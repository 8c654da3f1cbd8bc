"""The quantized kernel alone over the linear layers of one step of the code model (Qwen2.5-Coder-0.5B's shapes), by
rows a call and instruction-set level: the step-cost curve a tree step pays for its rows.

    .venv/bin/python benchmarks/step_curve.py [--levels avx2,avx-vnni,avx512-vnni] [--bits 8,5,4,41,42,52,62]
                                              [--rows 1,2,4,8,16]
                                              [--layers 24] [--rounds 7] [--threads 1] [--no-head]

A pass is what a step's linear layers do: per layer the fused q/k/v, o, fused gate/up and down products, each layer's
weights distinct (so every weight comes from memory once a pass, as in a real step), then the LM head. The weights
are random panels of one format (`--bits`: quant_matmul.FORMATS' codes, 8/5/4 Q8_0/Q5_0/Q4_0, 41 Q4_1, 42 Q4_K,
52 Q5_K, 62 Q6_K; the kernel's time does not depend on their values; a K-quant's K is rounded up to whole
superblocks of 256, 896 to 1024). The rows a call and the levels take turns within each round (the machine is
shared and its speed drifts); a cell is the median of the rounds, and the ratio is to the same level's 1-row pass.
`step_curve(level, bits)` returns one level's curve, for other benchmarks to import.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from turns import medians  # benchmarks/ is on the path when this file runs
from rest_lsp.engine import huge_pages
from rest_lsp.kernels import levels, quant_matmul

# Qwen2.5-Coder-0.5B: hidden 896, 14 query heads and 2 key/value heads of 64, intermediate 4864, vocabulary 151936;
# the engine fuses q/k/v and gate/up into one product each
LAYER = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}
HEAD = (151936, 896)
LAYERS = 24
ROWS = (1, 2, 4, 8, 16)


def random_panels(n: int, k: int, bits: int, gen: torch.Generator, arena: huge_pages.Arena | None = None
                  ) -> torch.Tensor:
    """Panels of random blocks of format `bits` (a code of quant_matmul.FORMATS) for an [n, k] weight (any byte is
    a valid quant or 6-bit scale), every fp16 scale and min 1/64; in the engine's memory (huge_pages: `arena`'s
    next place where given)."""
    nb = -(-k // quant_matmul.BLOCK)
    shape = quant_matmul.panels_shape(n, k, bits)
    panels = arena.take(shape) if arena is not None else huge_pages.empty(shape)  # in 2 MB pages, as the engine's
    panels.copy_(torch.randint(0, 256, panels.shape, generator=gen, dtype=torch.uint8))
    body = nb * quant_matmul.BLOCK_BYTES[bits]
    halves = nb if bits in quant_matmul.BITS else 2 * nb if bits == 41 else nb // 8 * (1 if bits == 62 else 2)
    scales = panels[:, body : body + halves * quant_matmul.PANEL * 2]
    scales.view(torch.float16).fill_(1 / 64)
    if bits in (42, 52):  # the 6-bit scales and mins in [0, 63]
        panels[:, body + halves * quant_matmul.PANEL * 2 : body + quant_matmul.tail_bytes(nb, bits)] &= 63
    return panels


class Pass:
    """A step's weights of `bits`-bit panels, and the calls that multiply `rows` rows with all of them in order."""

    def __init__(self, bits: int, layers: int = LAYERS, head: bool = True, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        shapes = [shape for _ in range(layers) for shape in LAYER.values()] + ([HEAD] if head else [])
        if bits in quant_matmul.SUPER:  # whole superblocks
            shapes = [(n, -(-k // quant_matmul.SUPERBLOCK) * quant_matmul.SUPERBLOCK) for n, k in shapes]
        self.bits = bits
        # side by side in a step's order, as the engine's panels lie (a warm load's, and a cold one's: gguf_direct)
        arena = huge_pages.Arena(sum(math.prod(quant_matmul.panels_shape(n, k, bits)) for n, k in shapes))
        self.weights = [(n, k, random_panels(n, k, bits, gen, arena)) for n, k in shapes]
        self.bytes = sum(p.numel() for _, _, p in self.weights)
        widest = max(n for n, _, _ in self.weights)
        self.x = torch.randn(max(ROWS) * 2, max(k for _, k, _ in self.weights), generator=gen)
        self.y = torch.empty(max(ROWS) * 2 * widest)

    def run(self, lib, rows: int, threads: int) -> float:
        """One pass of `rows` rows on `lib`, in ms (CPU time of this thread on one thread, else wall clock)."""
        xp, yp = self.x.data_ptr(), self.y.data_ptr()
        clock = time.thread_time if threads == 1 else time.perf_counter
        start = clock()
        for n, k, panels in self.weights:
            if lib.quant_mm(xp, self.x.numel(), rows, k, panels.data_ptr(), panels.numel(), n, self.bits, None, 0,
                            yp, self.y.numel(), threads) < 0:
                raise MemoryError("quant_mm: no scratch memory")
        return (clock() - start) * 1e3


def curves(levels_: list[str], bits: int, rows=ROWS, layers: int = LAYERS, rounds: int = 7, threads: int = 1,
           head: bool = True) -> dict[str, dict[int, float]]:
    """{level: {rows: median ms of a pass}} for `bits`-bit panels, the levels and row counts taking turns."""
    libs = {level: quant_matmul.library(level) for level in levels_}
    missing = [level for level, lib in libs.items() if lib is None]
    if missing:
        raise RuntimeError(f"no quantized kernel at level(s) {', '.join(missing)} here")
    step = Pass(bits, layers, head)
    for lib in libs.values():  # warm: the pages touched, each library's first call made
        step.run(lib, 1, threads)
    runs = {level: lambda r, lib=lib: step.run(lib, r, threads) for level, lib in libs.items()}
    return medians(runs, rows, rounds)


def step_curve(level: str, bits: int = 8, rows=ROWS, **kwargs) -> dict[int, float]:
    """One level's curve: {rows: median ms of the step's linear layers} (see `curves` for the keyword arguments)."""
    return curves([level], bits, rows, **kwargs)[level]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = [lv for lv in ("avx2", "avx-vnni", "avx512-vnni", "amx") if lv in levels.runnable()]
    parser.add_argument("--levels", default=",".join(default))
    parser.add_argument("--bits", default="8,5,4")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-head", action="store_true", help="leave the LM head out")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    clock = "CPU" if args.threads == 1 else "wall"
    print(f"{args.layers} layers{'' if args.no_head else ' + head'}, {args.threads} thread(s), medians of "
          f"{args.rounds} rounds; {clock} ms of a pass (ratio to 1 row)")
    for bits in (int(b) for b in args.bits.split(",")):
        result = curves(args.levels.split(","), bits, rows, args.layers, args.rounds, args.threads,
                        not args.no_head)
        name = next(kind for kind, code in quant_matmul.FORMATS.items() if code == bits)
        print(f"\n{name} panels | " + " | ".join(f"{r} rows" for r in rows))
        for level, curve in result.items():
            one = curve.get(1, curve[rows[0]])
            print(f"{level:12s} | " + " | ".join(f"{curve[r]:6.1f} ({curve[r] / one:4.2f}x)" for r in rows))


if __name__ == "__main__":
    main()
