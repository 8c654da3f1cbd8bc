"""What a decoding step costs by the rows it computes (1 for plain decoding, more for a draft tree), per matmul kind
and per whole-step mode, at each kernel level this CPU runs: the curve the draft budget follows.

    .venv/bin/python benchmarks/bench_kernels.py [--shapes smollm2|qwen2.5]
        [--kinds mkl,onednn,panel,fp16,bf16,q8,q5,q4] [--rows 1,2,4,8,16] [--layers N] [--rounds 7] [--threads 2]
        [--model M] [--modes float32,float16-weights,q8_0]
        [--level LEVEL ... | --level all] [--plot benchmarks/results/kernels.png]

Two tables, each cell the median of the rounds in ms, with its ratio to one row:
  - kinds: a pass over --layers layers of distinct weights of a model's shapes (fused q/k/v, o, fused gate/up, down),
    then its LM head, as a step streams them: every weight comes from memory once. First line: the time to only
    read the fp32 weights, the floor any kernel streams at. mkl: F.linear in fp32; onednn: fp32 weights packed once;
    panel: our fp32 kernel (rest_lsp/kernels/panel_matmul.py); fp16: fbgemm's float16 weights; bf16: F.linear in
    bfloat16; q8, q5, q4: our integer kernel on 8-, 5- and 4-bit panels (rest_lsp/engine/quant_matmul.py; q5 and q4
    hold Q8_0's values clamped to fit). The kinds take turns within each round: a shared machine's drift hits all.
  - modes: the decoder's whole step (forward pass and head, `Decoder.step_timer`) on a 512-token cache of --model
    (default: the default model), timed as calibration times it (`calibration.measure_step_times`). `--modes ''`
    leaves it out; a mode this machine does not run is said in one line and skipped.

`--level LEVEL` (repeatable; `all`: every level this CPU's flags allow) runs the benchmark once per level in a
subprocess with REST_LSP_KERNEL_LEVEL set to it (portable, avx2, avx-vnni, avx512-vnni, amx): the kernels are
forced down to that instruction set, and each table names the path the integer kernel reports. Without --level
the machine's own level runs, in this process. `--plot` draws ms by rows, one line per kind or mode and level.
The results (with date, commit, machine and command) go to benchmarks/results/bench_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` from this checkout, run from anywhere

from benchmarks import harness  # noqa: E402

LEVEL_ENV = "REST_LSP_KERNEL_LEVEL"
LEVELS = ("portable", "avx2", "avx-vnni", "avx512-vnni", "amx")
# the CPU flags (/proc/cpuinfo) each level's instructions need
LEVEL_FLAGS = {"portable": set(), "avx2": {"avx2", "fma", "f16c"}, "avx-vnni": {"avx2", "fma", "avx_vnni"},
               "avx512-vnni": {"avx512f", "avx512bw", "avx512_vnni"}, "amx": {"avx512_vnni", "amx_tile", "amx_int8"}}
# hidden size, (out, in) of each fused matmul of a layer, the LM head, and the layer count of two models
SHAPES = {
    "smollm2": {"layers": 30, "head": (49152, 576),
                "matmuls": {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}},
    "qwen2.5": {"layers": 24, "head": (151936, 896),
                "matmuls": {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}},
}
KINDS = ("mkl", "onednn", "panel", "fp16", "bf16", "q8", "q5", "q4")


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def runnable_levels(flags: set[str]) -> list[str]:
    """The levels whose instructions this CPU has, portable first."""
    return [level for level in LEVELS if LEVEL_FLAGS[level] <= flags]


def chosen_levels(asked: list[str], flags: set[str]) -> list[str]:
    """The levels to run, in LEVELS' order; `all` is every runnable one. A level the CPU lacks is left out, said."""
    runnable = runnable_levels(flags)
    wanted = runnable if "all" in asked else [level for level in LEVELS if level in asked]
    for level in wanted:
        if level not in runnable:
            print(f"level {level}: this CPU lacks its instructions; left out", flush=True)
    return [level for level in wanted if level in runnable]


# -- the kinds: one pass over a model's linear layers ------------------------------------------------------------

def matmul(weight, kind: str):
    """fn(x) -> x @ weight.T on `kind`'s kernel, weights packed once."""
    import torch
    import torch.nn.functional as F

    from rest_lsp.kernels import quant_matmul
    from rest_lsp.engine.matmuls import Matmul, QuantMatmul

    if kind == "mkl":
        return lambda x: F.linear(x, weight)
    if kind == "bf16":
        w = weight.to(torch.bfloat16)
        return lambda x: F.linear(x.to(torch.bfloat16), w)
    if kind in ("q5", "q4"):
        bits = int(kind[1])
        q, d = quant_matmul.quantize_q8_0(weight)
        off = quant_matmul.OFFSETS[bits]
        return QuantMatmul(quant_matmul.pack_blocks(q.clamp(-off, off - 1), d, bits), weight.shape[0], None, bits)
    return Matmul.of(weight, None, kind)  # panel, onednn, fp16, q8


def stored_mb(kind: str, shapes: dict, layers: int) -> float:
    """The MB of weights a pass over `layers` layers streams on `kind`'s kernel (the LM head left out)."""
    from rest_lsp.kernels import quant_matmul

    def nbytes(out: int, inp: int) -> int:
        if kind in ("q8", "q5", "q4"):
            return quant_matmul.panel_bytes(inp, int(kind[1])) * -(-out // 16)
        return out * inp * (2 if kind in ("fp16", "bf16") else 4)

    return layers * sum(nbytes(*shape) for shape in shapes["matmuls"].values()) / 2**20


def kinds_here(asked: list[str]) -> list[str]:
    """The asked kinds this machine runs (the others said in one line)."""
    import torch

    from rest_lsp.kernels import quant_matmul
    from rest_lsp.engine.matmuls import fp16_packs, onednn_packs, panel_packs

    cpu = torch.device("cpu")
    runs = {"mkl": lambda: True, "bf16": lambda: True, "onednn": lambda: onednn_packs(torch.float32, cpu),
            "panel": lambda: panel_packs(torch.float32, cpu), "fp16": lambda: fp16_packs(torch.float32, cpu),
            "q8": quant_matmul.available, "q5": quant_matmul.available, "q4": quant_matmul.available}
    kept = []
    for kind in asked:
        if kind not in runs:
            raise SystemExit(f"Unknown kind '{kind}': use some of {', '.join(KINDS)}.")
        if runs[kind]():
            kept.append(kind)
        else:
            print(f"kind {kind}: not available on this machine; left out", flush=True)
    return kept


def time_kinds(shapes: dict, kinds: list[str], rows: list[int], layers: int, rounds: int) -> dict:
    """{"floor_ms", "layers": {kind: {rows: ms}}, "head": {kind: {rows: ms}}}: medians over the rounds."""
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        fns: dict[str, list] = {k: [] for k in kinds}
        weights = []
        for _ in range(layers):
            for out, inp in shapes["matmuls"].values():
                w = torch.randn(out, inp, generator=gen) * 0.02
                weights.append(w)
                for k in kinds:
                    fns[k].append((matmul(w, k), inp))
        head_w = torch.randn(*shapes["head"], generator=gen) * 0.02
        heads = {k: matmul(head_w, k) for k in kinds}
        floor = statistics.median(timed(lambda: [w.sum() for w in weights]) for _ in range(max(rounds, 3)))
        if "mkl" not in kinds:
            del weights, head_w  # the packed copies hold what the kernels read
        widths = {inp for _, inp in shapes["matmuls"].values()} | {shapes["head"][1]}
        xs = {m: {i: torch.randn(m, i, generator=gen) for i in widths} for m in rows}
        for k in kinds:  # the first calls build and page in
            for fn, inp in fns[k]:
                fn(xs[rows[0]][inp])
            heads[k](xs[rows[0]][shapes["head"][1]])
        layer_ms = {k: {m: [] for m in rows} for k in kinds}
        head_ms = {k: {m: [] for m in rows} for k in kinds}
        for _ in range(rounds):
            for m in rows:
                for k in kinds:
                    layer_ms[k][m].append(timed(lambda: [fn(xs[m][inp]) for fn, inp in fns[k]]))
                    head_ms[k][m].append(timed(lambda: heads[k](xs[m][shapes["head"][1]])))
    med = lambda table: {k: {m: statistics.median(v) for m, v in per.items()} for k, per in table.items()}  # noqa: E731
    return {"floor_ms": floor, "layers": med(layer_ms), "head": med(head_ms),
            "mb": {k: stored_mb(k, shapes, layers) for k in kinds}}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


# -- the modes: the decoder's whole step --------------------------------------------------------------------------

def time_modes(model: str | None, modes: list[str], rows: list[int], rounds: int) -> dict:
    """{mode the decoder runs: {rows: ms}}, each the median of `rounds` rounds of the decoder's own step."""
    from rest_lsp.engine.calibration import measure_step_times
    from rest_lsp.engine.decoding import Decoder
    from rest_lsp.engine.model import load_model

    curves = {}
    for mode in modes:
        try:
            decoder = Decoder(load_model(model, "cpu", mode))
        except Exception as err:  # noqa: BLE001 - one mode this machine cannot run does not end the others
            print(f"mode {mode}: cannot run here ({err}); left out", flush=True)
            continue
        if decoder.mode in curves:
            print(f"mode {mode}: runs as {decoder.mode} here, already timed; left out", flush=True)
            continue
        times = measure_step_times(decoder.step_timer, decoder.vocab_size, decoder.max_context, sizes=rows,
                                   context=512, repeats=rounds, max_seconds=float("inf"))
        curves[decoder.mode] = {m: statistics.median(v) for m, v in times.items()}
        del decoder
    return curves


# -- one level ----------------------------------------------------------------------------------------------------

def measure(args) -> dict:
    """Everything this process measures at the level it was started with."""
    import torch

    from rest_lsp.kernels import quant_matmul

    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    shapes = SHAPES[args.shapes]
    result = {"level": os.environ.get(LEVEL_ENV) or "native", "threads": args.threads, "rows": rows,
              "integer_kernel": quant_matmul.path_name() if quant_matmul.available() else "none"}
    print(f"level {result['level']}: integer kernel {result['integer_kernel']}, {args.threads} threads", flush=True)
    kinds = kinds_here([k for k in args.kinds.split(",") if k])
    if kinds:
        result["kinds"] = time_kinds(shapes, kinds, rows, args.layers or shapes["layers"], args.rounds)
        result["kinds"]["shapes"] = args.shapes
        result["kinds"]["layer_count"] = args.layers or shapes["layers"]
    modes = [m for m in args.modes.split(",") if m]
    if modes:
        result["modes"] = time_modes(args.model, modes, rows, args.rounds)
    return result


def in_subprocess(level: str, argv: list[str]) -> dict | None:
    """measure() in a child with the kernel level forced; None (said) when the child fails."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "level.json"
        env = {**os.environ, LEVEL_ENV: level}
        done = subprocess.run([sys.executable, __file__, *argv, "--child-json", str(out)], env=env)
        if done.returncode != 0 or not out.exists():
            print(f"level {level}: the run failed (exit status {done.returncode}); left out", flush=True)
            return None
        return with_int_rows(json.loads(out.read_text()))


def with_int_rows(result: dict) -> dict:
    """A result read back from JSON, its row counts ints again."""
    ints = lambda table: {name: {int(m): ms for m, ms in per.items()} for name, per in table.items()}  # noqa: E731
    if "kinds" in result:
        result["kinds"].update(layers=ints(result["kinds"]["layers"]), head=ints(result["kinds"]["head"]))
    if "modes" in result:
        result["modes"] = ints(result["modes"])
    return result


def strip_level_args(argv: list[str]) -> list[str]:
    """argv without --level and --plot (the parent's own), for a child."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--level", "--plot"):
            skip = True
        elif not arg.startswith(("--level=", "--plot=")):
            kept.append(arg)
    return kept


# -- output -------------------------------------------------------------------------------------------------------

def table_lines(title: str, curves: dict[str, dict], rows: list[int]) -> list[str]:
    """A markdown table: one line per curve, ms and x one row for each row count."""
    lines = [f"\n{title}", "| | " + " | ".join(f"{m} rows" for m in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    for name, per in curves.items():
        base = per[rows[0]]
        lines.append(f"| {name} | " + " | ".join(f"{per[m]:.1f} ({per[m] / base:.2f}x)" for m in rows) + " |")
    return lines


def report(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        rows = [int(m) for m in r["rows"]]
        head = f"level {r['level']} (integer kernel: {r['integer_kernel']}), {r['threads']} threads"
        if "kinds" in r:
            k = r["kinds"]
            lines += table_lines(f"{head}: {k['layer_count']} layers of {k['shapes']}, ms per pass "
                                 f"(reading the fp32 weights only: {k['floor_ms']:.1f} ms); MB a pass streams: "
                                 + ", ".join(f"{kind} {mb:.0f}" for kind, mb in k.get("mb", {}).items()),
                                 k["layers"], rows)
            lines += table_lines(f"{head}: the LM head of {k['shapes']}, ms per call", k["head"], rows)
        if r.get("modes"):
            lines += table_lines(f"{head}: the whole step on a 512-token cache, head included, ms", r["modes"], rows)
    return lines


def curves_for_plot(results: list[dict]) -> dict[str, dict[str, dict[int, float]]]:
    """{panel title: {line label: {rows: ms}}}; the level joins the label when more than one ran."""
    panels: dict[str, dict] = {}
    several = len(results) > 1
    for r in results:
        tag = f" [{r['level']}]" if several else ""
        if "kinds" in r:
            for kind, per in r["kinds"]["layers"].items():
                panels.setdefault("matmul kinds: a pass over the layers", {})[kind + tag] = per
        for mode, per in (r.get("modes") or {}).items():
            panels.setdefault("whole step, per mode", {})[mode + tag] = per
    return panels


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = curves_for_plot(results)
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    levels = [r["level"] for r in results]
    styles = ["-", "--", ":", "-."]
    for ax, (title, lines) in zip(axes[0], panels.items()):
        names = list(dict.fromkeys(label.split(" [")[0] for label in lines))
        for label, per in lines.items():  # a colour per kind or mode, a line style per level
            name, _, level = label.partition(" [")
            rows = sorted(per)
            ax.plot(rows, [per[m] for m in rows], marker="o", label=label, color=f"C{names.index(name) % 10}",
                    linestyle=styles[levels.index(level.rstrip("]")) % len(styles)] if level else "-")
        ax.set_xscale("log", base=2)
        ax.set_xticks(rows, [str(m) for m in rows])
        ax.set_xlabel("rows computed in one step (root + drafts)")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("What a step costs by rows (bench_kernels.py)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="smollm2", help="whose linear layers the kinds run")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated; '' leaves the kinds out")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--layers", type=int, default=None, help="layers per pass (default: the model's own count)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="the model whose whole step the modes time (default model)")
    ap.add_argument("--modes", default="float32,float16-weights,q8_0", help="comma-separated; '' leaves them out")
    ap.add_argument("--level", action="append", default=[], choices=(*LEVELS, "all"),
                    help="force a kernel level in a subprocess (repeatable; all: every level this CPU runs)")
    ap.add_argument("--plot", default=None, help="draw ms by rows into this PNG")
    ap.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.child_json:
        Path(args.child_json).write_text(json.dumps(measure(args)))
        return
    if args.level:
        child = strip_level_args(argv)
        results = [r for level in chosen_levels(args.level, cpu_flags()) if (r := in_subprocess(level, child))]
    else:
        results = [measure(args)]
    print("\n".join(report(results)))
    path = harness.write_json(harness.RESULTS / "bench_kernels.json", {"levels": results})
    print(f"wrote {path}")
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
