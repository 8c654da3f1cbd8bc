"""What a decoding step costs on this machine: a measured cost curve, and a dtype the hardware runs natively.

The cost curve says how long a step verifying k tokens takes relative to a plain (1-token) step. Tree sizing
(`draft_tree.fit_to_cost`) follows it, so it must be the curve of THIS machine, model and dtype: measured once, in
a few seconds, on a KV cache of its own, and kept as JSON under the cache folder.

Safe to run in a background thread while the decoder serves: it never touches the decoder's KV cache. It does
share the model's weights and the machine's cores, so the timings are only worth keeping when nothing else runs
(the caller passes `should_stop` to abandon a measurement when a request arrives; rounds that disagree, or threads
the OS preempted often, mark a measurement used but not kept).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from rest_lsp.drafting.draft_tree import DraftTree, build_tree
from rest_lsp.cache_dir import read_bytes, write_bytes
from rest_lsp.engine.runmode import cost_curve, cpuinfo_field

log = logging.getLogger(__name__)

# Tree sizes (root + drafts) timed; cost_curve interpolates between them. 64 is the largest budget (CUDA).
SIZES = (1, 2, 4, 6, 8, 12, 16, 32, 64)  # 6 and 12: fbgemm computes rows in blocks of 6
CONTEXT = 384  # cached tokens under each step: a typical completion prompt
REPEATS = 3  # medians of this many rounds, after one warm-up round
MAX_SECONDS = 10.0  # no new round starts after this long: a slow model or a busy machine gets fewer rounds
NOISE_LIMIT = 1.5  # rounds further apart than this (median over sizes of slowest / fastest) are not kept
# Involuntary context switches a second, per thread timing steps, above which a measurement's cores were shared:
# the OS took them for other work mid-step. A steady competitor slows every size alike, so the rounds agree and
# NOISE_LIMIT passes them, while the curve is not this machine's. The limit sits well above a quiet machine's rate
# and well below one with a busy process beside it (measured: docs/LOG.md, 2026-12-07 (Zen 4)). The count is the
# whole process's: a thread of its own that the steps' threads preempt counts too (its cores were not the
# measurement's alone either). CPU steps only: a GPU's curve is the device's.
BUSY_SWITCHES = 40
# Bumped when what is timed changes (e.g. a new step implementation): older files are then re-measured.
# 2: the decoder's own step (lean engine or transformers), head included; 3: with no other thread of the process
# holding OpenMP workers (before, a datastore's suffix sort in another thread could make libgomp stop spin-waiting,
# which added the same wake-ups to every size and made the curve look flatter than it is: priority.py); 4: the lean
# step with fewer small ops per layer (the norm as one kernel, one roll per rotation, attention's scale in the
# query weights), which costs a tree less than one token in absolute terms; 5: the lean engine's layers run as
# TorchScript on a CPU (a third less per step, and a steeper curve)
METHOD = 5


@dataclass
class Calibration:
    curve: list[float]  # curve[k]: relative cost of a step verifying k tokens; curve[0] unused, curve[1] == 1
    ms: dict[int, float]  # measured median ms per tree size
    source: str  # "measured" | "cache"
    path: Path | None  # the cache file (None when not kept: unwritable, or timings from busy cores)


class Interrupted(Exception):
    """`should_stop` said so: the measurement was abandoned and nothing was kept."""


# -- the key: which machine, model and dtype a curve belongs to ---------------------------------------------------
def machine_name(device: torch.device) -> str:
    """GPU name, or CPU model string, plus the torch thread count (both change the curve's shape)."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}; cuda {torch.version.cuda}"
    cpu = cpuinfo_field("model name") or platform.processor() or platform.machine()
    return f"{cpu}; {torch.get_num_threads()} threads"


def model_fingerprint(model: torch.nn.Module, name: str) -> str:
    """The model's name plus a hash of its config: a different model at the same path gets its own curve."""
    config = getattr(model, "config", None)
    blob = config.to_json_string(use_diff=False) if config is not None else repr(model)
    return f"{name}#{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def calibration_key(model: torch.nn.Module, name: str, device: torch.device, dtype: torch.dtype,
                    engine: str = "transformers", kernel: str = "") -> dict:
    """`kernel`: the instructions the engine's own kernel runs on where they change the curve (the quantized
    kernel's tiles for many rows, e.g. "AVX-512 VNNI + AMX-INT8"); empty for the others."""
    key = {
        "method": METHOD,
        "engine": engine,
        "machine": machine_name(device),
        "device": device.type,
        "model": model_fingerprint(model, name),
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
    }
    if kernel:
        key["kernel"] = kernel
    return key


def cache_file(cache_dir: Path, key: dict, prefix: str = "") -> Path:
    """The file under the cache folder's calibration/ named by a hash of `key` (a `prefix` for other measurements
    kept there: mode_choice's "mode-")."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / "calibration" / f"{prefix}{digest}.json"


# -- measuring -----------------------------------------------------------------------------------------------------
def _test_tree(root: int, vocab: int, size: int) -> DraftTree:
    """A branchy tree of `size` tokens (root + size-1 drafts): two children per node, as retrieval gives."""
    a, b = root % vocab, (root + 1) % vocab
    conts = [(tuple(a if (i >> k) & 1 else b for k in range(7)), 1.0) for i in range(128)]
    tree = build_tree(root, conts, size - 1)
    if len(tree) != size:  # 254 candidate nodes: any size up to 255 fits
        raise ValueError(f"Cannot time a step of {size} tokens: at most 255 are supported.")
    return tree


def measure_step_times(
    step_timer: Callable[[int], Callable[[DraftTree], None]],
    vocab: int,
    max_context: int,
    sizes: Sequence[int] = SIZES,
    context: int = CONTEXT,
    repeats: int = REPEATS,
    should_stop: Callable[[], bool] | None = None,
    max_seconds: float = MAX_SECONDS,
) -> dict[int, list[float]]:
    """The ms of each measured round of a step verifying k tokens, for each k in `sizes`, each step on the same
    cache of `context` tokens (`step_timer(context)` gives the decoder's own step over a cache of its own).

    Sizes are interleaved within each round so that a busy moment of the machine hits all of them alike; the
    first round warms up (kernel choice, allocations) and is dropped. Each size runs twice in a row and the second
    step is timed, as in a decoding loop, where a step follows one of about its size (that alone did not make the
    2-token step cost what it does in a loop: see MIN_DRAFT_COST). Rounds stop early past `max_seconds` (at least
    one is measured): on cores shared with other work a long calibration only measures the neighbours.
    Raises Interrupted when `should_stop()`.
    """
    start = time.perf_counter()
    context = min(context, max_context - max(sizes) - 1)
    run = step_timer(context)
    trees = {k: _test_tree(1, vocab, k) for k in sizes}
    times: dict[int, list[float]] = {k: [] for k in sizes}
    for rnd in range(repeats + 1):
        for k in sizes:
            if should_stop is not None and should_stop():
                raise Interrupted()
            run(trees[k])  # settles: what a decoding loop's step finds
            t0 = time.perf_counter()
            run(trees[k])
            elapsed = (time.perf_counter() - t0) * 1e3
            if rnd:
                times[k].append(elapsed)
        if rnd and time.perf_counter() - start > max_seconds:
            break
    return times


def medians(times: dict[int, list[float]]) -> dict[int, float]:
    return {k: statistics.median(v) for k, v in times.items()}


def _preemptions() -> int | None:
    """This process's involuntary context switches so far (its threads preempted for other work); None where the OS
    does not count them."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


class Preemptions:
    """Started before a measurement; `rate()` after it: how often the OS preempted this process's threads."""

    def __init__(self) -> None:
        self.count, self.start = _preemptions(), time.perf_counter()

    def rate(self) -> float | None:
        """Preemptions a second since the start; None where they are not counted."""
        now, seconds = _preemptions(), time.perf_counter() - self.start
        if self.count is None or now is None or seconds <= 0:
            return None
        return (now - self.count) / seconds


def shared_cores(rate: float | None, threads: int) -> bool:
    """Whether a measurement whose process was preempted `rate` times a second (None: not counted) while `threads`
    threads timed steps had its cores shared with other work: more than BUSY_SWITCHES a second for each."""
    return rate is not None and rate > BUSY_SWITCHES * max(1, threads)


def too_noisy(times: dict[int, list[float]], limit: float = NOISE_LIMIT) -> bool:
    """Whether the rounds disagree so much that the cores were busy with other work: a typical size's slowest
    round more than `limit` times its fastest. One round cannot tell, and is trusted."""
    spreads = [max(v) / min(v) for v in times.values() if len(v) > 1]
    return bool(spreads) and statistics.median(spreads) > limit


# The least a step with drafts costs over a one-token step: more rows through every matmul, a tree mask, the walk.
# Calibration rounds can time a 2-token step as free where a decoding loop pays for it; priced as free, a draft the
# model never accepts is still drafted at the acceptance model's exploration bonus, and an always-wrong source makes
# REST slower than plain decoding (docs/LOG.md).
MIN_DRAFT_COST = 0.05


def relative_curve(ms: dict[int, float]) -> dict[int, float]:
    """Times relative to a 1-token step; a step with drafts at least 1 + MIN_DRAFT_COST.

    A step over k tokens does all the work of a 1-token step and more, so a ratio under that is noise (on a GPU,
    where the curve is flat, it would make a worthless draft look free). Between larger sizes the curve is NOT
    made monotone: 2 tokens really can cost more than 4 (another kernel path), and fit_to_cost
    compares every prefix, so it picks the cheaper larger tree by itself.
    """
    base = ms[1]
    return {k: max(1.0 if k == 1 else 1.0 + MIN_DRAFT_COST, v / base) for k, v in sorted(ms.items())}


# -- the LM head ---------------------------------------------------------------------------------------------------
HEAD_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)  # rows of one head call timed (up to the largest asked for)
HEAD_ROUNDS = 3  # the fastest of at most this many rounds, after one warm-up round
HEAD_SECONDS = 1.0  # no new round starts after this long (a warm-up and one timed round always run): a large model's
# head is slow, and the decoder is built while a server loads


def measure_head(head: Callable[[torch.Tensor], torch.Tensor], width: int, dtype: torch.dtype, largest: int,
                 rounds: int = HEAD_ROUNDS, max_seconds: float = HEAD_SECONDS) -> list[float]:
    """cost_curve of one LM head call by rows over one row, on this machine's cores (CPU; a GPU's is flat): what
    decides how many rows a step's first head call takes (decoding.head_rows).

    The head streams its whole [V, H] weight per call, so its rows' cost depends on the kernel's tiles and the CPU
    (on AVX-512, 4 rows cost about one; on AVX2 twice as much at 8): measured, not assumed. Each size's fastest round is
    kept, so work beside it (an index being built) that slows a round does not reach the curve."""
    sizes = [k for k in HEAD_SIZES if k <= max(1, largest)]
    hidden = torch.randn(sizes[-1], width, generator=torch.Generator().manual_seed(0)).to(dtype)  # [K, H]
    best = {k: math.inf for k in sizes}
    start = time.perf_counter()
    with torch.inference_mode():
        for rnd in range(rounds + 1):
            for k in sizes:  # interleaved: a busy moment slows every size alike
                t0 = time.perf_counter()
                head(hidden[:k])
                if rnd:
                    best[k] = min(best[k], time.perf_counter() - t0)
            if rnd and time.perf_counter() - start > max_seconds:
                break
    base = best[1]
    return cost_curve({k: max(1.0, t / base) if base > 0 else 1.0 for k, t in best.items()})


# -- the cache file ------------------------------------------------------------------------------------------------
def _valid_ms(raw) -> dict[int, float] | None:
    if not isinstance(raw, dict):
        return None
    try:
        ms = {int(k): float(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        return None
    if 1 not in ms or len(ms) < 2 or any(k < 1 or not math.isfinite(v) or v <= 0 for k, v in ms.items()):
        return None
    return ms


def read_cached(path: Path, key: dict) -> dict[int, float] | None:
    """The measured ms of a cache file that belongs to `key`; None (with one log line) if absent, corrupt or foreign."""
    try:
        data = json.loads(read_bytes(path))  # only a file of this user's alone (cache_dir)
    except (FileNotFoundError, NotADirectoryError):  # never measured here; a blocked folder is told on writing
        return None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        log.warning("Calibration cache %s is unreadable (%s); measuring the step cost again.", path, err)
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        log.warning("Calibration cache %s belongs to another machine, model or dtype; measuring again.", path)
        return None
    ms = _valid_ms(data.get("ms"))
    if ms is None:
        log.warning("Calibration cache %s holds no valid timings; measuring the step cost again.", path)
    return ms


def write_json(path: Path, data: dict) -> None:
    """Atomically, into a folder of this user's alone: a reader sees the old file or the whole new one. OSError when
    it cannot be written (UntrustedCache when the folder is another user's or others may write it)."""
    write_bytes(path, json.dumps(data, indent=1).encode("utf-8"))


def write_cached(path: Path, key: dict, ms: dict[int, float]) -> bool:
    """The measured ms under `key`, atomically (`write_json`)."""
    try:
        write_json(path, {"key": key, "ms": {str(k): v for k, v in sorted(ms.items())},
                          "relative": {str(k): round(v, 4) for k, v in relative_curve(ms).items()}})
        return True
    except OSError as err:
        log.warning("Could not keep the step-cost calibration in %s (%s); the next start measures again.", path, err)
        return False


def calibrate(
    model: torch.nn.Module,
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    cache_dir: Path,
    step_timer: Callable[[int], Callable[[DraftTree], None]],
    engine: str = "transformers",
    force: bool = False,
    should_stop: Callable[[], bool] | None = None,
    measure: bool = True,
    kernel: str = "",
    **measure_kw,
) -> Calibration | None:
    """The cost curve of this machine, model, dtype, engine and kernel: from the cache file, else measured and saved
    (with `measure=False`: None when there is no cache file to read)."""

    key = calibration_key(model, name, device, dtype, engine, kernel)
    path = cache_file(cache_dir, key)
    ms = None if force else read_cached(path, key)
    source = "cache"
    if ms is None and not measure:
        return None
    if ms is None:
        vocab = int(getattr(model.config, "vocab_size", 1000))
        max_context = int(getattr(model.config, "max_position_embeddings", 2048))
        watch = Preemptions()
        times = measure_step_times(step_timer, vocab, max_context, should_stop=should_stop, **measure_kw)
        rate, threads = watch.rate(), torch.get_num_threads()
        shared = device.type == "cpu" and shared_cores(rate, threads)
        ms, source = medians(times), "measured"
        cut_short = min(map(len, times.values())) < measure_kw.get("repeats", REPEATS)
        if cut_short or too_noisy(times) or shared:
            # better than the constants of another machine for now, but not worth keeping: next start measures again
            log.info("Step-cost timings %s (busy cores?); using them without keeping them.",
                     "ran out of time" if cut_short else
                     f"were preempted {rate:.0f} times a second on {threads} threads (at most "
                     f"{BUSY_SWITCHES} a thread kept)" if shared else
                     f"varied by more than {NOISE_LIMIT}x between rounds")
            path = None
        elif not write_cached(path, key, ms):
            path = None
    return Calibration(cost_curve(relative_curve(ms)), ms, source, path)


def calibrate_when_idle(decoder, busy: Callable[[], bool], stopped: threading.Event, cache_dir: Path | None = None,
                        attempts: int = 5, poll_s: float = 0.5) -> threading.Thread:
    """Calibrate `decoder` in a daemon thread, only while `busy()` is False; returns the thread.

    `busy` says True while a request is queued or decoding: a measurement it interrupts is thrown away and started
    again once the decoder is idle, up to `attempts` times; until one completes the decoder keeps its built-in
    curve. Setting `stopped` ends the thread within one step (join it before the process exits: a thread still
    inside torch at exit can crash it). Errors are logged, never raised.
    """

    def run() -> None:
        for _ in range(attempts):
            while busy():
                # polling: the owner's request queue has no "became idle" event to wait on
                if stopped.wait(poll_s):
                    return
            if stopped.is_set():
                return
            try:
                found = decoder.calibrate(cache_dir, should_stop=lambda: busy() or stopped.is_set())
            except Interrupted:
                continue
            except Exception as err:  # noqa: BLE001 - a failed calibration must never take the server down
                log.warning("Could not measure the step cost (%s); tree sizing keeps its built-in curve.", err)
                return
            log.info("Step cost (%s): %s", found.source,
                     ", ".join(f"{k}: {v:.2f}x" for k, v in relative_curve(found.ms).items()))
            return

    thread = threading.Thread(target=run, name="rest-lsp-calibrate", daemon=True)
    thread.start()
    return thread


# -- dtype by hardware ---------------------------------------------------------------------------------------------
