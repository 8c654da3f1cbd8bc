"""The linear layers of a step of the code model (Qwen2.5-Coder-0.5B's shapes), timed for a few input rows on each
weight format: Q8_0 on our integer kernel (rest_lsp/kernels/quant_matmul.py; its AVX2 build too with --avx2), the same
kernel on 5- and 4-bit panels (q5, q4: a GGUF's Q5_0 and Q4_0 blocks), fbgemm's fp16 weights (float16-weights), bf16
weights (F.linear, the bfloat16 mode) and our fp32 panel kernel (float32).

    .venv/bin/python benchmarks/bench_quant.py [--threads 2] [--rows 1,2,4,8,12,16] [--layers 24] [--rounds 7]
                                               [--kinds q8,q5,q4,fp16,bf16,panel] [--avx2]

    .venv/bin/python benchmarks/bench_quant.py --model GGUF [--modes gguf,q8,fp16,panel,bf16] [--prompts 4]

Without --model: a pass over `--layers` layers of distinct weights (fused q/k/v, o, fused gate/up, down), then the LM head, as a step
makes them: every weight comes from memory once. The kinds take turns within each round (the machine is shared and
its speed drifts), and each cell is the median of the rounds. Also the bytes a pass streams per kind.

With --model: the whole step of that model in each mode (gguf: the file's own Q8_0/Q5_0/Q4_0 blocks), the MB of
weights a step streams in each, the step-cost curve on a 512-token cache (the decoder's
own step timer: the forward pass and the head over the rows it batches; sizes interleaved, medians), then plain
and REST (prompt lookup plus the other prompts' files as a workspace) ms/token on `--prompts` function starts of
this repository's own code (500-token prompts, 48 new tokens), REST's output compared with plain decoding's in the
same mode.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rest_lsp.kernels import quant_matmul
from rest_lsp.engine.matmuls import GgufMatmul, Matmul, QuantMatmul, fp16_packs, panel_packs

# Qwen2.5-Coder-0.5B: hidden 896, 14 query heads and 2 key/value heads of 64, intermediate 4864, vocabulary 151936
SHAPES = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}
HEAD = (151936, 896)


CLOCK = [time.perf_counter]  # time.thread_time on one thread: CPU time, less inflated on a shared machine


def timed_ms(fn) -> float:
    start = CLOCK[0]()
    fn()
    return (CLOCK[0]() - start) * 1e3


def layer(weight: torch.Tensor, kind: str):
    if kind == "q8":
        return Matmul.of(weight, None, "q8")
    if kind in ("q5", "q4"):  # the kernel's speed on narrower blocks (the values: Q8_0's, clamped to fit)
        bits = int(kind[1])
        q, d = quant_matmul.quantize_q8_0(weight)
        off = quant_matmul.OFFSETS[bits]
        return QuantMatmul(quant_matmul.pack_blocks(q.clamp(-off, off - 1), d, bits), weight.shape[0], None, bits)
    if kind == "q8-avx2":
        panels, lib, n = quant_matmul.pack(weight), quant_matmul.library("avx2"), weight.shape[0]
        return lambda x: quant_matmul.quant_mm(x, panels, n, None, lib=lib)
    if kind == "bf16":
        w = weight.to(torch.bfloat16)
        return lambda x: F.linear(x.to(torch.bfloat16), w)
    return Matmul.of(weight, None, kind)  # "fp16", "panel"


def stored_bytes(kind: str, out: int, inp: int) -> int:
    panels = -(-out // 16)
    return {"q8": quant_matmul.panel_bytes(inp) * panels, "q8-avx2": quant_matmul.panel_bytes(inp) * panels,
            "q5": quant_matmul.panel_bytes(inp, 5) * panels, "q4": quant_matmul.panel_bytes(inp, 4) * panels,
            "fp16": out * inp * 2, "bf16": out * inp * 2, "panel": panels * 16 * inp * 4}[kind]


def step_bytes(decoder) -> tuple[int, int]:
    """(bytes of linear weights a step of this decoder streams in its layers, in its LM head): the packed panels of
    q8 and gguf; 2 or 4 bytes a weight for the others."""
    lean = decoder.lean

    def size(mm) -> int:
        if isinstance(mm, GgufMatmul):
            return sum(size(p) for p in mm.parts)
        if isinstance(mm, QuantMatmul):
            return mm.panels.numel()
        return -1  # the model's own weights, or packed where their size is not ours to read

    per = decoder.dtype.itemsize if lean.packing not in ("fp16",) else 2
    layers = heads = 0
    for layer, module in zip(lean.layers, decoder.model.model.layers):
        at, mlp = module.self_attn, module.mlp
        for mm, linears in ((layer.qkv, (at.q_proj, at.k_proj, at.v_proj)), (layer.o, (at.o_proj,)),
                            (layer.gate_up, (mlp.gate_proj, mlp.up_proj)), (layer.down, (mlp.down_proj,))):
            b = size(mm)
            layers += b if b >= 0 else sum(m.weight.numel() for m in linears) * per
    b = size(lean.head)
    heads = b if b >= 0 else decoder.model.get_output_embeddings().weight.numel() * per
    return layers, heads


def function_starts(count: int) -> list[tuple[Path, int]]:
    """(file, offset just after a `def` line) in this repository's engine and service code, spread over files."""
    root = Path(__file__).resolve().parent.parent / "rest_lsp"
    files = sorted(p for p in root.rglob("*.py") if p.stat().st_size > 6000)
    points = []
    for path in files[:: max(1, len(files) // max(count, 1))][:count]:
        text = path.read_text()
        starts = [m.end() for m in re.finditer(r"\n    def [^\n]*:\n", text)]
        if starts:
            points.append((path, starts[len(starts) // 2]))
    return points


def model_steps(args) -> None:
    from rest_lsp.drafting.drafts import ContextLookup, DraftMix, NgramDrafts, NoDrafts
    from rest_lsp.engine.decoding import DecodeConfig, Decoder
    from rest_lsp.engine.model import load_model

    torch.set_num_threads(args.threads)
    # on one thread, the thread's CPU time: what the step costs on a core that is shared with other work
    clock, what = (time.thread_time, "CPU") if args.threads == 1 else (time.perf_counter, "wall")
    modes = [m for m in args.modes.split(",") if m]
    fp32 = load_model(args.model, "cpu", "float32")
    tok = fp32.tokenizer
    decoders = {}
    for m in modes:
        if m == "bf16":
            decoders[m] = Decoder(load_model(args.model, "cpu", "bfloat16"))
        else:
            decoders[m] = Decoder(fp32, pack=m)
    print(f"model {args.model}; {args.threads} threads; Q8_0 kernel: {quant_matmul.path_name()}; "
          + ", ".join(f"{m}: {d.engine}" for m, d in decoders.items()), flush=True)
    for m, d in decoders.items():
        layers, head = step_bytes(d)
        print(f"  {m}: a step streams {layers / 2**20:.0f} MB of layer weights + {head / 2**20:.0f} MB of LM head "
              f"(head rows batched: {d.run.head_batch})", flush=True)
    sizes = [int(r) for r in args.rows.split(",")]
    timers = {m: d.step_timer(512) for m, d in decoders.items()}
    from rest_lsp.engine.calibration import _test_tree

    trees = {k: _test_tree(1, fp32.model.config.vocab_size, k) for k in sizes}
    times = {(m, k): [] for m in modes for k in sizes}
    for rnd in range(args.rounds + 1):
        for k in sizes:
            for m in modes:
                timers[m](trees[k])
                t0 = clock()
                timers[m](trees[k])
                if rnd:
                    times[m, k].append((clock() - t0) * 1e3)
    print(f"\nstep on a 512-token cache, {what} ms (median of {args.rounds}), and x one token")
    print(f"{'mode':8} " + " ".join(f"{f'{k} tok':>14}" for k in sizes))
    for m in modes:
        ms = [statistics.median(times[m, k]) for k in sizes]
        print(f"{m:8} " + " ".join(f"{v:7.1f} {v / ms[0]:5.2f}x" for v in ms), flush=True)

    points = function_starts(args.prompts)
    texts = [p.read_text() for p, _ in points]
    rows = {m: [] for m in modes}
    for i, (path, offset) in enumerate(points):
        prompt = tok.encode(texts[i][:offset])[-500:]
        others = [tok.encode(t) for j, t in enumerate(texts) if j != i]
        for m, d in decoders.items():
            d.reset()
            t0 = clock()
            plain = d.generate(prompt, NoDrafts(), DecodeConfig(max_new_tokens=args.new_tokens, budget=0))
            plain_ms = ((clock() - t0) * 1e3 - plain.prefill_ms * (clock is time.perf_counter)) / len(plain.tokens)
            d.reset()
            t0 = clock()
            rest = d.generate(prompt, DraftMix([("context", ContextLookup()), ("workspace", NgramDrafts(others))]),
                              DecodeConfig(max_new_tokens=args.new_tokens, budget=16))
            rest_ms = ((clock() - t0) * 1e3 - rest.prefill_ms * (clock is time.perf_counter)) / len(rest.tokens)
            if clock is time.thread_time:  # CPU time of the whole call: the prefill's share taken out by wall ratio
                plain_ms = plain_ms - plain.prefill_ms / (plain.prefill_ms + plain.decode_ms) * plain_ms
                rest_ms = rest_ms - rest.prefill_ms / (rest.prefill_ms + rest.decode_ms) * rest_ms
            rows[m].append((plain_ms, rest_ms, rest.tokens_per_step, rest.tokens == plain.tokens, plain.prefill_ms))
            print(f"  {path.name}:{texts[i][:offset].count(chr(10))} {m}: plain {plain_ms:.1f} {what} ms/token, "
                  f"REST {rest_ms:.1f} ({rest.tokens_per_step:.2f} tokens/step), "
                  f"identical {rest.tokens == plain.tokens}, prefill {plain.prefill_ms:.0f} ms", flush=True)
    print(f"\n{len(points)} function starts, {args.new_tokens} new tokens; medians")
    print(f"{'mode':8} {'plain ms/tok':>12} {'REST ms/tok':>12} {'tok/step':>9} {'identical':>10} {'prefill ms':>11}")
    for m in modes:
        r = rows[m]
        med = [statistics.median(x[j] for x in r) for j in (0, 1, 2, 4)]
        print(f"{m:8} {med[0]:12.1f} {med[1]:12.1f} {med[2]:9.2f} {sum(x[3] for x in r):>5}/{len(r):<4} {med[3]:11.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,12,16")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--kinds", default="q8,q5,q4,fp16,bf16,panel")
    parser.add_argument("--avx2", action="store_true", help="also the Q8_0 kernel's AVX2 build (-march=haswell)")
    parser.add_argument("--model", help="a model (.gguf): time its whole step per mode instead")
    parser.add_argument("--modes", default="gguf,q8,fp16,panel,bf16", help="with --model: packings, and bf16")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    if args.model:
        return model_steps(args)
    torch.set_num_threads(args.threads)
    if args.threads == 1:
        CLOCK[0] = time.thread_time
    cpu = torch.device("cpu")
    kinds = [k for k in args.kinds.split(",") if k]
    if args.avx2:
        kinds.append("q8-avx2")
    runs = {"q8": quantum_ok, "q5": quantum_ok, "q4": quantum_ok, "q8-avx2": lambda: quant_matmul.library("avx2") is not None,
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
        for title, table in ((f"{args.layers} layers, {'CPU' if args.threads == 1 else 'wall'} ms per pass (median of {args.rounds})", layers_ms),
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
