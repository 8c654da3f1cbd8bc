"""How the engine runs here: device, dtype, weight packing and what a step costs, decided once as one frozen value.

`decide` turns what the user asked for (`--device`, `--dtype`, a .gguf or not) into a `RunMode`; `run_mode` gives
the value a Decoder runs once it knows which packing its model takes. Each packing's row in `PACKINGS` holds how many
rows the LM head takes in one call at most, how many rows a node outside it brings, and the
step-cost curve benchmarks/bench_kernels.py measured on a reference machine (benchmarks/RESULTS.md, "Kernels and
step cost"): a record, never what sizes a CPU's trees (another CPU's curve says nothing of this one); the decoder
learns its own from the steps it runs (`step_cost.py`), seeded from what this machine measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

import torch

from rest_lsp.errors import ModelLoadError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# fp32 activations and arithmetic over fp16 copies of the linear weights (CPU, fbgemm): a step streams half the bytes
# of fp32; the weights round to fp16 once, so it is not the exact mode (README, "Use": the modes).
FP16_WEIGHTS = "float16-weights"
# fp32 activations over Q8_0 weights (a GGUF's own blocks, other tensors requantized to them) on rest-lsp's integer
# kernel (CPU, quant_matmul.py): a step streams about a quarter of fp32's bytes; each matmul's input rows are quantized
# per block of 32, so it is not the exact mode, but a row's result does not depend on the rows beside it: REST output
# is plain decoding's in this mode.
Q8_WEIGHTS = "q8_0"
# fp32 activations over a .gguf's own weight blocks on the same kernel: its Q8_0, Q5_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K
# tensors as they are in the file (panels of 4 to 8 bits a quant: a step streams fewer bytes than q8_0), the others
# (F16, IQ*...) requantized to Q8_0. Outputs depend on the file's blocks and the per-block quantization of each
# matmul's input rows, as in q8_0; a row's matmuls do not depend on the rows beside it. A model that is not a .gguf
# is refused.
GGUF_WEIGHTS = "gguf"
# The dtype a load gets when none is asked for, in place of the machine's own default (as if --dtype named it):
# `./dev.sh test` sets it for a second pass over the tests of the default mode, so the other path runs too.
DTYPE_ENV = "REST_LSP_DTYPE"


def mode_name(dtype: torch.dtype, packing: str | None) -> str:
    """The numerics outputs depend on: "float32", "bfloat16", "float16", "float16-weights", "q8_0" or "gguf"."""
    if packing in ("fp16", "q8", "gguf"):
        return {"fp16": FP16_WEIGHTS, "q8": Q8_WEIGHTS, "gguf": GGUF_WEIGHTS}[packing]
    return str(dtype).removeprefix("torch.")


def cost_curve(measured: dict[int, float]) -> list[float]:
    """Relative step cost for every tree size up to the largest measured one, interpolated linearly:
    curve[k] = time of a step verifying k tokens / time of a one-token step (curve[0] unused)."""
    sizes = sorted(measured)
    curve = [0.0]
    for k in range(1, sizes[-1] + 1):
        hi = next(s for s in sizes if s >= k)
        lo = max((s for s in sizes if s <= k), default=hi)
        t = 0.0 if hi == lo else (k - lo) / (hi - lo)
        curve.append(measured[lo] + t * (measured[hi] - measured[lo]))
    return curve


@dataclass(frozen=True)
class Packing:
    """What a step costs on one weight packing (a CPU), and how the LM head batches its rows there."""

    step_cost: list[float]  # cost_curve of a step by tokens verified
    head_batch: int  # the likeliest nodes one batched head call takes at most
    miss_rows: int  # rows a node reached outside that call brings (itself and the likeliest below it)


# One row per kind of lean_llama.Matmul ("none": the model's own F.linear, also every model the lean engine does
# not run). The rules behind the head columns: the head reads its whole [V, H] weight per call, so a batch pays once
# its rows cost little more than one row; panel takes 12 (two tiles of 6), fbgemm's fp16 kernels take rows in blocks
# of 6, oneDNN packs for 8, MKL's rows cost more (misses come one by one). How many of them a step's first call takes
# is weighed on the head's cost by rows measured here (`RunMode.head_cost`, decoding.head_rows).
PACKINGS: dict[str, Packing] = {
    "panel": Packing(cost_curve({1: 1.0, 2: 1.08, 4: 1.08, 6: 1.09, 8: 1.22, 12: 1.25, 16: 1.45, 32: 2.57,
                                 64: 4.3}), head_batch=12, miss_rows=6),
    "onednn": Packing(cost_curve({1: 1.0, 2: 1.07, 4: 1.28, 6: 1.43, 8: 1.46, 12: 1.6, 16: 1.98, 32: 2.85,
                                  64: 4.9}), head_batch=8, miss_rows=4),
    "fp16": Packing(cost_curve({1: 1.0, 2: 1.28, 4: 1.41, 6: 1.64, 8: 2.02, 12: 2.52, 16: 3.06, 32: 5.3,
                                64: 9.4}), head_batch=6, miss_rows=3),
    "none": Packing(cost_curve({1: 1.0, 2: 1.41, 4: 1.82, 8: 2.26, 12: 2.51, 16: 2.63, 24: 3.01, 32: 3.40,
                                48: 4.17, 64: 4.93}), head_batch=8, miss_rows=1),
    # Q8_0 on our integer kernel (quant_matmul.py): a tile of 12 rows on AVX-512 VNNI (4 on AVX2) reads a panel once
    "q8": Packing(cost_curve({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 12: 1.39, 16: 1.93}), head_batch=12,
                  miss_rows=4),
    # a .gguf's own 8, 5 and 4-bit blocks on the same kernel and tiles: one row streams fewer bytes than q8's, many
    # rows cost what q8's do (the dot products bound them), so the curve rises sooner; the head and its batch as q8's
    "gguf": Packing(cost_curve({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.2, 12: 1.6, 16: 2.3}), head_batch=12,
                    miss_rows=4),
}
# A GPU verifies a few dozen tokens in about the time of one.
FLAT_STEP_COST = cost_curve({1: 1.0, 2: 1.0})


@dataclass(frozen=True)
class RunMode:
    """Everything that decides how a decoding step runs and what it costs; replaced whole, never mutated."""

    device: torch.device
    dtype: torch.dtype
    packing: str  # a key of PACKINGS
    step_cost: list[float]
    head_batch: int
    miss_rows: int
    notes: tuple[str, ...] = ()  # sentences for the user: what was asked for and could not run here
    level: str = ""  # the instruction-set level our kernels run at (kernels/levels.py); "" where none of ours runs
    # cost_curve of one LM head call by rows over one row: flat until the decoder measures its head here
    head_cost: tuple[float, ...] = tuple(FLAT_STEP_COST)

    @property
    def name(self) -> str:
        return mode_name(self.dtype, self.packing)

    def measured(self, step_cost: list[float]) -> "RunMode":
        """The same mode with this machine's measured step-cost curve."""
        return replace(self, step_cost=step_cost)


def run_mode(device: torch.device, dtype: torch.dtype, packing: str | None, notes: tuple[str, ...] = ()) -> RunMode:
    """The mode of a decoder whose weights run on `packing` (None or unknown: the model's own matmuls)."""
    row = PACKINGS.get(packing or "none", PACKINGS["none"])
    cost = FLAT_STEP_COST if device.type == "cuda" else row.step_cost
    return RunMode(device, dtype, packing or "none", cost, row.head_batch, row.miss_rows, notes,
                   kernel_level(device, packing))


def kernel_level(device: torch.device, packing: str | None) -> str:
    """The level our kernels run at for `packing` here (the dispatcher's: the CPU's best, or the one forced); ""
    where the step runs on none of them."""
    if device.type != "cpu" or packing not in ("panel", "q8", "gguf"):
        return ""
    from rest_lsp.kernels import levels

    return levels.chosen()


def pick_device(device: str | None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ModelLoadError(f"Unknown device '{device}': use 'cpu', 'cuda' or 'auto'.") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"Device '{device}' was asked for, but CUDA is not available here; use --device cpu.")
    return dev


def pick_dtype(dtype: str | None, device: torch.device) -> tuple[torch.dtype, str | None]:
    """(the dtype to run, a sentence for the user when it is not the one asked for).

    auto: bf16 on CPUs that compute it in hardware (AVX512-BF16, AMX), for speed; fp32 elsewhere, where emulated
    bf16 is slower than fp32, and on GPUs, where a step replayed from CUDA graphs is bound by its kernel count, not
    its bytes, and bf16 changes greedy completions (benchmarks/RESULTS.md, "GPU"). float32 is the exact mode
    everywhere.
    """
    if dtype in (None, "", "auto"):
        return (torch.bfloat16 if device.type == "cpu" and native_bf16() else torch.float32), None
    if dtype not in DTYPES:
        raise ModelLoadError(f"Unknown dtype '{dtype}': use one of {', '.join(DTYPES)}, {FP16_WEIGHTS}, {Q8_WEIGHTS}, "
                             f"{GGUF_WEIGHTS} or 'auto'.")
    return runnable_dtype(device, DTYPES[dtype])


def pick_weight_packing(dtype: str | None, device: torch.device, gguf: bool = False) -> tuple[str | None, str | None]:
    """(the lean engine's weight packing when it is not the engine's own choice, a sentence for the user when
    float16-weights cannot run here).

    float16-weights when asked for, and by default for a .gguf model on a CPU that has no bf16 in hardware: a
    GGUF's weights are quantized (4-8 bits in most files) or half already, so their fp16 copies round far below
    the quantization's own error, and a step streams half of fp32's bytes. How often its output leaves plain
    decoding's and fp32's is measured by benchmarks/bench_bf16.py (benchmarks/RESULTS.md). `--dtype float32` is
    the exact mode.
    """
    from rest_lsp.engine.matmuls import fp16_packs

    if dtype in (None, "", "auto"):
        if gguf and device.type == "cpu" and not native_bf16() and fp16_packs(torch.float32, device):
            return "fp16", None
        return None, None
    if dtype == GGUF_WEIGHTS and not gguf:
        raise ModelLoadError("--dtype gguf runs a .gguf file's own weight blocks, and this model is not a .gguf file: "
                             "use --dtype q8_0 to run it on Q8_0 weights.")
    if dtype in (Q8_WEIGHTS, GGUF_WEIGHTS):
        from rest_lsp.engine.matmuls import q8_packs

        if q8_packs(torch.float32, device):
            return ("q8" if dtype == Q8_WEIGHTS else "gguf"), None
        return None, (f"{dtype} runs on a CPU where a C compiler builds rest-lsp's integer kernel, not on {device} "
                      "here: rest-lsp runs the model in float32 instead.")
    if dtype != FP16_WEIGHTS:
        return None, None
    if fp16_packs(torch.float32, device):
        return "fp16", None
    return None, (f"float16-weights runs on a CPU with a torch built with fbgemm, not on {device}: rest-lsp runs "
                  "the model in float32 instead.")


def decide(device: str | None, dtype: str | None, gguf: bool = False) -> RunMode:
    """The mode a model loads and decodes in, from the user's `--device` and `--dtype` (None: the best here)."""
    from rest_lsp.engine.matmuls import pick_packing

    if dtype in (None, "", "auto") and os.environ.get(DTYPE_ENV):
        dtype = os.environ[DTYPE_ENV]  # the user's default, or the tests' second pass: as if asked for
    dev = pick_device(device)
    dt, dtype_note = pick_dtype("float32" if dtype in (FP16_WEIGHTS, Q8_WEIGHTS, GGUF_WEIGHTS) else dtype, dev)
    packing, note = None, None
    if dt == torch.float32:  # float16-weights computes in fp32; a bf16 or fp16 model keeps its own weights
        packing, note = pick_weight_packing(dtype, dev, gguf=gguf)
    notes = tuple(n for n in (note or dtype_note,) if n)
    return run_mode(dev, dt, packing or pick_packing(None, dt, dev), notes)


def cpuinfo_field(name: str, text: str | None = None) -> str:
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
    for line in text.splitlines():
        field, _, value = line.partition(":")
        if field.strip() == name:
            return value.strip()
    return ""


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (x86 `flags`, ARM `Features`), from /proc/cpuinfo unless given its text."""
    return set((cpuinfo_field("flags", cpuinfo) or cpuinfo_field("Features", cpuinfo)).split())


def native_bf16(flags: Iterable[str] | None = None, capability: str | None = None) -> bool:
    """Whether the CPU computes bfloat16 in hardware (AVX512-BF16, AMX-BF16, or ARM's BF16 extension).

    Without it torch converts every bf16 operand to fp32 and back: slower than fp32 (benchmarks/bench_bf16.py).
    `capability` is torch's CPU dispatch level; an x86 CPU
    that torch does not run at AVX512 (e.g. ATEN_CPU_CAPABILITY=avx2) does not use those instructions.
    """
    flags = cpu_flags() if flags is None else set(flags)
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    if flags & {"avx512_bf16", "amx_bf16"}:
        return capability.upper().startswith(("AVX512", "AMX"))
    return "bf16" in flags  # aarch64 (Graviton 3, Neoverse V1/V2, Apple M2+ report it here on Linux)


def native_fp16(flags: Iterable[str] | None = None) -> bool:
    """Whether the CPU computes float16 in hardware (AVX512-FP16, AMX-FP16, or ARM's FP16 arithmetic)."""
    flags = cpu_flags() if flags is None else set(flags)
    return bool(flags & {"avx512_fp16", "amx_fp16", "asimdhp"})


def runnable_dtype(
    device: torch.device,
    wanted: torch.dtype,
    flags: Iterable[str] | None = None,
    capability: str | None = None,
    cuda_bf16: bool | None = None,
) -> tuple[torch.dtype, str | None]:
    """(the dtype to run, a sentence for the user when it is not `wanted`).

    A half dtype the hardware only emulates is slower than float32 and less exact, so float32 replaces it on a CPU;
    a GPU without bfloat16 (before Ampere) runs float16 instead. `flags`, `capability` and `cuda_bf16` default to
    this machine's.
    """
    if device.type == "cuda":
        if wanted == torch.bfloat16:
            ok = torch.cuda.is_bf16_supported() if cuda_bf16 is None else cuda_bf16
            if not ok:
                return torch.float16, ("This GPU has no bfloat16 support, so rest-lsp runs the model in float16 "
                                       "instead.")
        return wanted, None
    if device.type != "cpu":
        return wanted, None
    flags = cpu_flags() if flags is None else set(flags)
    if wanted == torch.bfloat16 and not native_bf16(flags, capability):
        return torch.float32, ("This CPU has no native bfloat16 (AVX512-BF16 or AMX), so rest-lsp runs the model "
                               "in float32 instead: emulated bfloat16 would be slower.")
    if wanted == torch.float16 and not native_fp16(flags):
        hint = " (--dtype bfloat16 is native here)" if native_bf16(flags, capability) else ""
        return torch.float32, ("This CPU has no native float16, so rest-lsp runs the model in float32 instead"
                               f"{hint}: emulated float16 would be slower.")
    return wanted, None
