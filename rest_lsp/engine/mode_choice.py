"""Which mode a .gguf decodes fastest in on this machine, when no dtype is asked for: measured on the model itself
once per machine and file, kept as JSON under the cache folder beside the step-cost curves.

The candidates are the machine's rule (`runmode.decide`: bfloat16 where the CPU computes it, else float16-weights)
and the gguf mode (the file's own blocks on rest-lsp's integer kernel), where that kernel builds and the lean engine
runs the model. Each is timed on the loaded weights: a prefill of PREFILL tokens, then, ROUNDS times after one
warm-up, a step of 1 token and one of a TREE-token draft tree over it, as `Decoder.step_timer` runs them (forward
pass and head). The winner has the cheapest steps (1 token + TREE tokens: plain decoding's step and a typical REST
step): a keystroke's request is its steps, its prefill a few tokens on a KV cache it keeps.

The prefill runs in the winner's mode too, though another mode may prefill faster (bf16 on AMX): the gguf mode's
promise, REST = plain decoding, holds because every token's keys and values are computed alike, alone or beside
others; keys from another mode's prefill would make a suggestion depend on which tokens came from a prefill. Within
the gguf mode the integer kernel takes the fastest instructions for a call's row count (quant_matmul.py), bit for bit
the same. Timings from busy cores (rounds that disagree, or threads the OS preempted often:
calibration.shared_cores) decide this load but are not kept.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rest_lsp.engine import calibration
from rest_lsp.cache_dir import content_digest, read_bytes
from rest_lsp.engine.calibration import NOISE_LIMIT, machine_name
from rest_lsp.engine.runmode import GGUF_WEIGHTS, RunMode

log = logging.getLogger(__name__)

METHOD = 1  # bumped when what is timed changes: older choices are measured again
PREFILL = 128  # cached tokens under the timed steps
TREE = 8  # tokens of the timed draft tree: about what REST verifies a step on a CPU
ROUNDS = 3  # medians of this many rounds, after one warm-up round


@dataclass(frozen=True)
class Timing:
    """One mode's measured milliseconds (medians over the rounds)."""

    step_ms: float  # a step verifying 1 token
    tree_ms: float  # a step verifying TREE tokens
    prefill_ms: float  # a prefill of PREFILL tokens

    @property
    def cost(self) -> float:
        return self.step_ms + self.tree_ms


@dataclass(frozen=True)
class Choice:
    mode: str  # a `--dtype` value: the winner
    timings: dict[str, Timing]  # by mode
    source: str  # "measured" | "cache"


def candidates(rule: RunMode, gguf: bool) -> list[str]:
    """The modes worth timing for a load without a dtype: the rule's and the gguf mode, on a CPU that builds the
    integer kernel, for a .gguf; none (the rule decides alone) otherwise."""
    from rest_lsp.engine.matmuls import q8_packs

    if not gguf or rule.device.type != "cpu" or rule.name == GGUF_WEIGHTS or not q8_packs(torch.float32, rule.device):
        return []
    return [rule.name, GGUF_WEIGHTS]


def choice_key(path: str | Path, device: torch.device, names: list[str]) -> dict:
    """Which machine, file (the sha256 of its bytes: cache_dir.content_digest), candidates and build of the integer
    kernel (an update or a forced level times the gguf mode again) a choice belongs to."""
    from rest_lsp.kernels import quant_matmul

    return {"method": METHOD, "machine": machine_name(device), "torch": torch.__version__,
            "file": content_digest(path), "candidates": names, "kernel": quant_matmul.build_name()}


def cache_file(cache_dir: Path, key: dict) -> Path:
    return calibration.cache_file(cache_dir, key, prefix="mode-")


def read_cached(path: Path, key: dict) -> Choice | None:
    """The kept choice for `key`; None when absent, and (one warning) when unreadable, not this user's alone,
    another key's, naming no candidate, or holding a timing that is not a positive number of milliseconds."""
    try:
        data = json.loads(read_bytes(path))
        if not isinstance(data, dict) or data.get("key") != key or data.get("mode") not in key["candidates"]:
            raise ValueError("another machine, file or candidate list")
        timings = _timings(data.get("timings"))
        if data["mode"] not in timings:
            raise ValueError(f"no timing of the chosen mode {data['mode']}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("Mode choice %s is not used (%s); measuring again.", path, err)
        return None
    return Choice(data["mode"], timings, "cache")


def _timings(raw) -> dict[str, Timing]:
    """The timings of a kept choice, each field a finite positive number; ValueError otherwise."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError("no timings")
    timings = {}
    for name, t in raw.items():
        fields = [f.name for f in dataclasses.fields(Timing)]
        if not isinstance(t, dict) or sorted(t) != sorted(fields):
            raise ValueError(f"the timing of {name} is not {', '.join(fields)}")
        for value in t.values():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"the timing of {name} holds {value!r}, not a positive number of milliseconds")
        timings[str(name)] = Timing(**{k: float(v) for k, v in t.items()})
    return timings


def write_cached(path: Path, key: dict, choice: Choice) -> None:
    """Atomically; a folder that cannot be written costs the next load a measurement, nothing else."""
    try:
        calibration.write_json(path, {"key": key, "mode": choice.mode,
                                      "timings": {name: asdict(t) for name, t in choice.timings.items()}})
    except OSError as err:
        log.warning("Could not keep the mode choice in %s (%s); the next start measures again.", path, err)


def choose(timings: dict[str, Timing]) -> str:
    """The mode with the cheapest steps; on a tie the first candidate (the rule's)."""
    return min(timings, key=lambda name: timings[name].cost)


def _weights(model: torch.nn.Module, name: str, rule: RunMode) -> tuple[torch.nn.Module, str]:
    """(the weights mode `name` runs: a bf16 copy for bfloat16, else the fp32 model itself; its lean packing)."""
    from rest_lsp.engine.runmode import decide

    mode = decide(rule.device.type, name, gguf=True)
    weights = model if mode.dtype == torch.float32 else copy.deepcopy(model).to(mode.dtype)
    return weights, mode.packing


@torch.no_grad()  # not inference mode: the lean engine's fused weights become the model's own parameters
def time_mode(model: torch.nn.Module, packing: str, rounds: int = ROUNDS) -> tuple[Timing, bool]:
    """(the medians of the lean engine's timings on `model`'s weights in `packing`, whether its rounds disagree by
    more than NOISE_LIMIT or the OS preempted its threads often: calibration.shared_cores). The steps are timed by
    calibration's one step timer (`measure_step_times`: sizes taking turns, a warm-up round dropped, each step run
    twice and the second timed); a step is the forward pass over its tokens and the head over their rows, on a cache
    of PREFILL random tokens whose prefill is timed too."""
    from rest_lsp.engine.lean_llama import LeanLlama, unsupported

    if (why := unsupported(model)) is not None:
        raise ValueError(f"the lean engine does not run this model ({why})")
    max_context = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
    lean = LeanLlama(model, max_context, pack=packing)
    vocab = model.get_input_embeddings().num_embeddings
    prefills: list[float] = []

    def step_timer(context: int):
        ids = torch.randint(0, vocab, (context + TREE,), generator=torch.Generator().manual_seed(0)).to(lean.device)
        positions = torch.arange(context + TREE, device=lean.device)
        cache = lean.new_cache()
        t = time.perf_counter()
        lean.forward(ids[:context], positions[:context], cache)
        prefills.append((time.perf_counter() - t) * 1e3)

        def run(tree) -> None:
            k = len(tree)
            lean.head(lean.forward(ids[context : context + k], positions[context : context + k], cache))
            cache.crop(context)

        return run

    watch = calibration.Preemptions()
    times = calibration.measure_step_times(step_timer, vocab, max_context, sizes=(1, TREE), context=PREFILL,
                                           repeats=rounds, max_seconds=math.inf)
    shared = calibration.shared_cores(watch.rate(), torch.get_num_threads())
    one, tree = times[1], times[TREE]
    spread = max(max(v) / min(v) for v in (one, tree))
    timing = Timing(statistics.median(one), statistics.median(tree), statistics.median(prefills))
    return timing, (rounds > 1 and spread > NOISE_LIMIT) or shared


def measure(model: torch.nn.Module, names: list[str], rule: RunMode) -> tuple[dict[str, Timing], bool]:
    """(each candidate's timings, whether any was noisy) on `model`, loaded in float32 from the .gguf; a candidate
    that cannot run is left out with one log line."""
    timings: dict[str, Timing] = {}
    noisy = False
    for name in names:
        try:
            weights, packing = _weights(model, name, rule)
            timings[name], busy = time_mode(weights, packing)
            noisy = noisy or busy
        except Exception as err:  # noqa: BLE001 - a mode that cannot run here is not a candidate
            log.info("Mode %s cannot run this model here (%s); it is not a candidate.", name, err)
        finally:
            weights = None  # a bf16 copy goes now
    return timings, noisy


def forget_packs(model: torch.nn.Module, keep: str | None, dtype: torch.dtype) -> None:
    """Drops the lean engine's packed weights built for the losing modes (each packing keeps one in the model), and
    its fused fp32 weights when the winner casts the model to another dtype (the cast leaves them unused)."""
    for key in [k for k in model.__dict__ if k.startswith("_lean_") and k != f"_lean_{keep}"]:
        del model.__dict__[key]
    if dtype != next(model.parameters()).dtype:
        for module in model.modules():
            module.__dict__.pop("_lean_fused", None)


def describe(choice: Choice) -> str:
    others = ", ".join(f"{name} {t.step_ms:.1f} / {t.tree_ms:.1f} ms (prefill of {PREFILL}: {t.prefill_ms:.0f} ms)"
                       for name, t in choice.timings.items())
    return f"{choice.mode}, the fastest here ({choice.source}; a step of 1 / {TREE} tokens: {others})"
