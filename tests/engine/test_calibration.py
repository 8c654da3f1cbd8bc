"""The measured step-cost curve (cache, re-measuring, tree sizing by it) and the dtype the hardware runs."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time

import pytest
import torch

from rest_lsp.engine import calibration
from rest_lsp.engine import runmode, step_cost
from rest_lsp.engine.calibration import Interrupted, cache_file, calibration_key, relative_curve
from rest_lsp.engine.runmode import runnable_dtype
from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.engine.runmode import cost_curve
from rest_lsp.kernels import levels
from rest_lsp.drafting.draft_tree import DraftTree, fit_to_cost
from rest_lsp.drafting.drafts import Proposal

from support import tiny_folder, tiny_model

# Small and quick on a tiny model: what is tested is the plumbing, not the numbers.
QUICK = dict(sizes=(1, 2, 4, 8), context=48, repeats=1)
READ_PREEMPTIONS = calibration._preemptions


@pytest.fixture(autouse=True)
def _cores_of_our_own(monkeypatch):
    """The suite's workers share the cores, so the OS preempts a measuring test often: these tests check what is
    kept and read, so each counts no preemption; the busy-cores tests set their own count or read the real one."""
    monkeypatch.setattr(calibration, "_preemptions", lambda: 0)


@pytest.fixture
def decoder() -> Decoder:
    return Decoder(tiny_model("llama"))


def _key_path(decoder: Decoder, cache_dir):
    key = calibration_key(decoder.model, decoder.name, decoder.device, decoder.dtype, decoder.engine)
    return key, cache_file(cache_dir, key)


# -- the cache -----------------------------------------------------------------------------------------------------
def test_cache_round_trip(decoder, tmp_path):
    first = decoder.calibrate(tmp_path, **QUICK)
    assert first.source == "measured" and first.path is not None and first.path.is_file()
    assert sorted(first.ms) == [1, 2, 4, 8] and first.curve[1] == 1.0 and len(first.curve) == 9
    assert decoder.step_cost is first.curve

    again = Decoder(tiny_model("llama"))  # a restart: same machine, model and dtype
    second = again.calibrate(tmp_path, **QUICK)
    assert second.source == "cache" and second.path == first.path
    assert second.ms == first.ms and second.curve == first.curve and again.step_cost == first.curve


def test_a_curve_measured_on_other_kernel_instructions_is_measured_again(tmp_path, monkeypatch):
    """The quantized modes' curve depends on the instructions the integer kernel runs on (AMX tiles make a tree
    step cheaper): the key names them, so a curve measured on others is not read; the other engines' keys do not
    change."""
    from rest_lsp.kernels import quant_matmul

    if not quant_matmul.available():
        pytest.skip("no C compiler here builds the quantized kernel")
    q8 = Decoder(tiny_model("llama"), pack="q8")
    assert q8.kernel.startswith(quant_matmul.path_name() + " (") and Decoder(tiny_model("llama")).kernel == ""
    assert quant_matmul.build_name() in q8.kernel
    assert re.fullmatch(rf"quant_matmul-{levels.chosen()}-[0-9a-f]+", quant_matmul.build_name())
    first = q8.calibrate(tmp_path, **QUICK)
    assert json.loads(first.path.read_text())["key"]["kernel"] == q8.kernel
    monkeypatch.setattr(quant_matmul, "path_name", lambda lib=None: "other instructions")
    again = Decoder(tiny_model("llama"), pack="q8")
    assert again.calibrate(tmp_path, measure=False) is None
    assert again.calibrate(tmp_path, **QUICK).source == "measured"
    assert "kernel" not in calibration_key(q8.model, "m", q8.device, q8.dtype, "lean-panel")


def test_a_curve_measured_on_another_build_of_the_kernel_is_measured_again(tmp_path, monkeypatch):
    """A kernel update (a new build of the same instructions) changes what a tree step costs: the key names the
    build, so a curve the old build measured is not read."""
    from rest_lsp.kernels import quant_matmul

    if not quant_matmul.available():
        pytest.skip("no C compiler here builds the quantized kernel")
    first = Decoder(tiny_model("llama"), pack="q8").calibrate(tmp_path, **QUICK)
    assert first.source == "measured"
    assert Decoder(tiny_model("llama"), pack="q8").calibrate(tmp_path, measure=False) is not None
    monkeypatch.setattr(quant_matmul, "build_name", lambda lib=None: "quant_matmul-avx2-0123456789abcdef")
    again = Decoder(tiny_model("llama"), pack="q8")
    assert again.calibrate(tmp_path, measure=False) is None
    assert again.calibrate(tmp_path, **QUICK).source == "measured"


def test_reading_only_never_measures(decoder, tmp_path):
    """What the server does at start: the curve measured here before, or nothing (the built-in curve stays)."""
    before = decoder.step_cost
    assert decoder.calibrate(tmp_path, measure=False) is None and decoder.step_cost is before
    assert not list(tmp_path.rglob("*.json"))
    measured = decoder.calibrate(tmp_path, **QUICK)
    again = Decoder(tiny_model("llama"))
    read = again.calibrate(tmp_path, measure=False)
    assert read.source == "cache" and again.step_cost == measured.curve


def test_another_dtype_or_model_gets_its_own_file(decoder, tmp_path):
    _, path = _key_path(decoder, tmp_path)
    other = Decoder(tiny_model("qwen2"))
    _, other_path = _key_path(other, tmp_path)
    decoder.model.to(torch.bfloat16)
    decoder.dtype = torch.bfloat16
    _, bf16_path = _key_path(decoder, tmp_path)
    assert len({path, other_path, bf16_path}) == 3


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xffnot json at all",
        b"[1, 2, 3]",
        b'{"key": {"method": 1}, "ms": {"1": 3.0, "2": 4.0}}',  # a foreign key: another machine's file
        "OWN_KEY_BAD_MS",  # our key, but timings that cannot be real
        "OWN_KEY_NO_BASE",  # our key, but no 1-token step to relate to
    ],
)
def test_a_corrupt_or_foreign_cache_is_measured_again_with_one_log_line(decoder, tmp_path, caplog, content):
    key, path = _key_path(decoder, tmp_path)
    path.parent.mkdir(parents=True)
    if content == "OWN_KEY_BAD_MS":
        content = json.dumps({"key": key, "ms": {"1": 3.0, "2": -1.0, "4": "NaN"}}).encode()
    elif content == "OWN_KEY_NO_BASE":
        content = json.dumps({"key": key, "ms": {"2": 3.0, "4": 5.0}}).encode()
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.calibration"):
        found = decoder.calibrate(tmp_path, **QUICK)
    assert found.source == "measured"
    assert len(caplog.records) == 1 and str(path) in caplog.records[0].getMessage()
    saved = json.loads(path.read_text())  # replaced by a good file: the next start trusts it
    assert saved["key"] == key and {int(k) for k in saved["ms"]} == {1, 2, 4, 8}


@pytest.mark.parametrize("how", ["file", "folder", "link"])
def test_a_cache_file_another_user_could_write_is_not_trusted(decoder, tmp_path, caplog, how):
    """A curve decides tree sizes: one from a file or folder others may write, or behind a link, is measured again."""
    key, path = _key_path(decoder, tmp_path)
    path.parent.mkdir(parents=True)
    good = json.dumps({"key": key, "ms": {"1": 3.0, "2": 4.0, "4": 5.0, "8": 6.0}}).encode()
    if how == "link":
        (tmp_path / "elsewhere.json").write_bytes(good)
        path.symlink_to(tmp_path / "elsewhere.json")
    else:
        path.write_bytes(good)
        (path if how == "file" else path.parent).chmod(0o777 if how == "folder" else 0o666)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.calibration"):
        found = decoder.calibrate(tmp_path, **QUICK)
    assert found.source == "measured"
    assert "is unreadable" in caplog.records[0].getMessage()


def test_a_missing_cache_is_measured_without_a_warning(decoder, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.calibration"):
        assert decoder.calibrate(tmp_path, **QUICK).source == "measured"
    assert not caplog.records


def test_an_unwritable_cache_folder_still_gives_a_curve(decoder, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.calibration"):
        found = decoder.calibrate(blocker, **QUICK)
    assert found.source == "measured" and found.path is None and decoder.step_cost is found.curve
    assert len(caplog.records) == 1


# -- measuring beside a serving decoder ----------------------------------------------------------------------------
def _first_keys(decoder: Decoder) -> torch.Tensor:
    cache = decoder._cache
    return cache.k[0, :, : cache.length].clone() if decoder.lean is not None else cache.layers[0].keys.clone()


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers"])
def test_calibrating_in_a_thread_leaves_the_decoders_cache_alone(lean, tmp_path):
    decoder = Decoder(tiny_model("llama"), lean=lean)
    prompt = [random.Random(1).randrange(97) for _ in range(40)]
    before = decoder.generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=12, budget=0)).tokens
    cache, cached, length = decoder._cache, list(decoder._cached), decoder._cache_length()
    keys0 = _first_keys(decoder)

    errors: list[BaseException] = []

    def run():
        try:
            decoder.calibrate(tmp_path, **QUICK)
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            errors.append(err)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "calibration did not finish within 120 s"
    assert not errors, errors
    assert decoder._cache is cache and decoder._cached == cached and decoder._cache_length() == length
    assert torch.equal(_first_keys(decoder), keys0)
    # and the decoder goes on from its cache as before: same output, only the last token to compute
    again = decoder.generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=12, budget=0))
    assert again.tokens == before and again.prefill_tokens == 0


def test_should_stop_abandons_the_measurement_and_keeps_the_old_curve(decoder, tmp_path):
    calls = iter(range(1000))
    built_in = decoder.step_cost
    with pytest.raises(Interrupted):
        decoder.calibrate(tmp_path, should_stop=lambda: next(calls) >= 3, **QUICK)
    assert decoder.step_cost is built_in and decoder.calibration is None
    assert not (tmp_path / "calibration").exists() or not any((tmp_path / "calibration").iterdir())


# -- tree sizing by the calibrated curve ---------------------------------------------------------------------------
class _Oracle:
    """Proposes the true continuation as one sure chain (ratios 1)."""

    def __init__(self, full: list[int]):
        self.full = full

    def propose(self, context):
        nxt = self.full[len(context) : len(context) + 8]
        if not nxt or self.full[: len(context)] != list(context):
            return []
        return [Proposal("oracle", 16, tuple(nxt), tuple(range(-1, len(nxt) - 1)), (1.0,) * len(nxt))]


@pytest.mark.parametrize("curve, few_steps", [("flat", True), ("steep", False)])
def test_generate_sizes_trees_by_the_calibrated_curve(decoder, tmp_path, curve, few_steps):
    """A cached flat curve lets sure drafts through; a steep one (a step of 2 tokens costs 50 plain steps) cuts
    every tree to its root: one token per step."""
    prompt = [random.Random(2).randrange(97) for _ in range(30)]
    truth = decoder.generate(prompt, _Oracle([]), DecodeConfig(max_new_tokens=16, budget=0)).tokens
    decoder.reset()
    key, path = _key_path(decoder, tmp_path)
    ms = {1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0, 16: 10.0} if curve == "flat" else {1: 10.0, 2: 500.0, 16: 5000.0}
    assert calibration.write_cached(path, key, ms)
    assert decoder.calibrate(tmp_path).source == "cache"
    result = decoder.generate(prompt, _Oracle(prompt + truth), DecodeConfig(max_new_tokens=16, budget=8))
    assert result.tokens == truth
    assert (result.steps < 8) == few_steps, result.steps


def _tree(shares: list[float]) -> DraftTree:
    """A tree whose shape does not matter to fit_to_cost: only the shares of its prefixes do."""
    n = len(shares)
    return DraftTree(list(range(n + 1)), [-1] + [i // 2 for i in range(n)], [0] + [1] * n,
                     (1.0, *shares), ((),) * (n + 1))


def _brute_force(tree: DraftTree, cost: list[float]) -> float:
    """The least expected time per expected token over every prefix of the tree (root alone included)."""
    gains = [1.0]
    for share in tree.shares[1:]:
        gains.append(gains[-1] + share)
    return min(cost[n + 1] / gains[n] for n in range(len(tree)))


SYNTHETIC_MS = {
    "flat": {k: 40.0 for k in (1, 2, 4, 8, 16, 32, 64)},
    "linear": {k: 40.0 * k for k in (1, 2, 4, 8, 16, 32, 64)},
    "steep": {k: 40.0 * k**1.5 for k in (1, 2, 4, 8, 16, 32, 64)},
    "2 costs more than 4": {1: 60.0, 2: 99.0, 4: 83.0, 8: 81.0, 16: 97.0, 32: 130.0, 64: 195.0},
    "gpu noise": {1: 10.0, 2: 9.6, 4: 9.9, 8: 10.1, 16: 10.4, 32: 11.0, 64: 12.5},
}


def _share_sets() -> list[list[float]]:
    rnd = random.Random(0)
    sets = [[0.95**i for i in range(1, 40)], [0.3 * 0.5**i for i in range(1, 40)], [0.9, 0.05, 0.04, 0.03, 0.02]]
    for _ in range(20):
        shares, p = [], 1.0
        for _ in range(rnd.randrange(1, 50)):
            p *= rnd.uniform(0.3, 1.0)
            shares.append(p)
        sets.append(sorted(shares, reverse=True))  # heaviest first, as build_tree emits them
    return sets


@pytest.mark.parametrize("name", list(SYNTHETIC_MS))
def test_fit_to_cost_minimises_time_per_expected_token_on_calibrated_curves(name):
    cost = cost_curve(relative_curve(SYNTHETIC_MS[name]))
    assert cost[1] == 1.0 and min(cost[1:]) >= 1.0
    for shares in _share_sets():
        tree = _tree(shares)
        kept = fit_to_cost(tree, cost)
        gain = 1.0 + sum(kept.shares[1:])
        assert cost[len(kept)] / gain == pytest.approx(_brute_force(tree, cost), rel=1e-12), (name, shares)


def test_where_2_costs_more_than_4_a_single_draft_gives_way_to_a_larger_tree():
    cost = cost_curve(relative_curve(SYNTHETIC_MS["2 costs more than 4"]))
    assert cost[2] > cost[4]  # the dip is kept, not smoothed away
    assert len(fit_to_cost(_tree([0.5]), cost)) == 1  # 1.5 tokens for 1.65 steps: the root alone is cheaper
    # 1.9 tokens for 1.38 steps: three drafts pay where one alone did not
    assert len(fit_to_cost(_tree([0.5, 0.2, 0.2]), cost)) == 4


def test_relative_curve_never_prices_a_draft_as_free_and_keeps_real_dips():
    rel = relative_curve({1: 10.0, 2: 9.0, 4: 12.0, 8: 11.0, 16: 10.2})
    assert rel == {1: 1.0, 2: 1.05, 4: 1.2, 8: 1.1, 16: 1.05}


def test_a_draft_that_is_never_accepted_stops_being_drafted_on_a_flat_measured_curve():
    """The acceptance model keeps a small exploration bonus for every bucket; on a curve whose 2-token step measured
    as cheap as one token, the floor is what drops a draft that is always rejected."""
    from rest_lsp.drafting.acceptance import AcceptanceModel

    cost = cost_curve(relative_curve({1: 30.0, 2: 29.5, 4: 34.0}))
    model = AcceptanceModel()
    key = ("useless", 5, 1)
    for _ in range(2000):
        model.observe(key, 1.0, accepted=False)
    p = model.probability(key, 1.0)
    assert 0 < p < calibration.MIN_DRAFT_COST
    assert len(fit_to_cost(_tree([p]), cost)) == 1  # the root alone


# -- dtype by hardware ---------------------------------------------------------------------------------------------
X86_OLD = {"sse2", "avx", "avx2", "fma"}  # this kind of AMD EPYC: no AVX-512 at all
X86_BF16 = X86_OLD | {"avx512f", "avx512bw", "avx512_bf16"}
X86_AMX = X86_OLD | {"avx512f", "amx_tile", "amx_bf16", "avx512_fp16", "amx_fp16"}
CPU = torch.device("cpu")


def _one_sentence(note: str) -> bool:
    return note.endswith(".") and note.count(". ") == 0 and note[0].isupper()


def test_bfloat16_on_a_cpu_without_it_falls_back_to_float32_with_one_sentence():
    dtype, note = runnable_dtype(CPU, torch.bfloat16, flags=X86_OLD, capability="AVX2")
    assert dtype == torch.float32 and _one_sentence(note) and "bfloat16" in note and "float32" in note


@pytest.mark.parametrize("flags, capability", [(X86_BF16, "AVX512"), (X86_AMX, "AVX512"), ({"fp", "asimd", "bf16"}, "DEFAULT")])
def test_bfloat16_stays_where_the_cpu_has_it(flags, capability):
    assert runnable_dtype(CPU, torch.bfloat16, flags=flags, capability=capability) == (torch.bfloat16, None)


def test_bf16_flags_without_avx512_dispatch_are_not_native():
    assert not runmode.native_bf16(X86_BF16, capability="AVX2")


def test_float16_on_a_cpu_without_it_falls_back_and_names_bfloat16_when_that_is_native():
    dtype, note = runnable_dtype(CPU, torch.float16, flags=X86_BF16, capability="AVX512")
    assert dtype == torch.float32 and _one_sentence(note) and "--dtype bfloat16" in note
    dtype, note = runnable_dtype(CPU, torch.float16, flags=X86_OLD, capability="AVX2")
    assert dtype == torch.float32 and _one_sentence(note) and "bfloat16" not in note
    assert runnable_dtype(CPU, torch.float16, flags=X86_AMX, capability="AVX512") == (torch.float16, None)


def test_loading_a_model_in_a_dtype_this_cpu_only_emulates_falls_back_with_one_sentence(tmp_path, monkeypatch, caplog):
    from rest_lsp.engine.model import load_model

    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(runmode, "cpu_flags", lambda cpuinfo=None: set(X86_OLD))
    folder = tiny_folder(tmp_path / "m")
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.model"):
        loaded = load_model(str(folder), "cpu", "bfloat16")
    assert loaded.dtype == torch.float32 and next(loaded.model.parameters()).dtype == torch.float32
    assert len(loaded.notes) == 1 and _one_sentence(loaded.notes[0])
    assert [r.getMessage() for r in caplog.records] == loaded.notes
    # auto picks bf16 only where the CPU computes it natively
    assert load_model(str(folder), "cpu", "auto").dtype == torch.float32


def test_auto_dtype_is_bfloat16_on_a_cpu_that_computes_it(tmp_path, monkeypatch):
    from rest_lsp.engine.runmode import pick_dtype

    monkeypatch.setattr(runmode, "cpu_flags", lambda cpuinfo=None: set(X86_AMX))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert pick_dtype("auto", CPU) == (torch.bfloat16, None)
    assert pick_dtype("float32", CPU) == (torch.float32, None)  # the exact mode, always


def test_auto_dtype_is_float32_on_a_gpu():
    """Measured on an H200: the graphed step is no faster in bf16 for the default model, and bf16 changes half the
    completions, so a GPU runs the exact mode unless asked otherwise."""
    from rest_lsp.engine.runmode import pick_dtype

    assert pick_dtype("auto", torch.device("cuda")) == (torch.float32, None)


def test_float32_always_runs():
    assert runnable_dtype(CPU, torch.float32, flags=set(), capability="DEFAULT") == (torch.float32, None)


def test_a_gpu_without_bfloat16_runs_float16():
    gpu = torch.device("cuda")
    dtype, note = runnable_dtype(gpu, torch.bfloat16, cuda_bf16=False)
    assert dtype == torch.float16 and _one_sentence(note)
    assert runnable_dtype(gpu, torch.bfloat16, cuda_bf16=True) == (torch.bfloat16, None)


def test_cpu_flags_are_read_from_x86_and_arm_cpuinfo():
    x86 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd bf16 sve\nCPU implementer\t: 0x41\n"
    assert runmode.cpu_flags(x86) == {"fpu", "avx2", "avx512_bf16"}
    assert runmode.cpu_flags(arm) == {"fp", "asimd", "bf16", "sve"}


# -- in the background, while idle ---------------------------------------------------------------------------------
def test_calibrate_when_idle_starts_again_after_a_request_interrupts_it(decoder, tmp_path):
    calls = []

    def busy():  # a request arrives during the first measurement (its 5th check), then the decoder is idle
        calls.append(1)
        return len(calls) == 5

    thread = calibration.calibrate_when_idle(decoder, busy, threading.Event(), tmp_path, poll_s=0.01)
    thread.join(120)
    assert not thread.is_alive(), "calibration did not finish within 120 s"
    assert decoder.calibration is not None and decoder.calibration.source == "measured"
    assert len(calls) > 5  # it went on after the interruption


def test_calibrate_when_idle_ends_when_stopped_while_busy(decoder, tmp_path):
    stopped = threading.Event()
    waiting = threading.Event()

    def busy():
        waiting.set()
        return True

    thread = calibration.calibrate_when_idle(decoder, busy, stopped, tmp_path, poll_s=0.01)
    assert waiting.wait(30), "the calibration thread never asked whether the decoder was busy"
    stopped.set()
    thread.join(30)
    assert not thread.is_alive(), "the calibration thread did not end within 30 s of being stopped"
    assert decoder.calibration is None
    assert decoder.step_cost is step_cost.CONSERVATIVE  # nothing measured here: the conservative seed


# -- busy cores ----------------------------------------------------------------------------------------------------
def test_rounds_that_disagree_are_too_noisy_to_keep():
    assert calibration.too_noisy({1: [60.0, 130.0, 61.0], 2: [99.0, 250.0, 98.0], 4: [83.0, 84.0, 85.0]})
    assert not calibration.too_noisy({1: [60.0, 66.0, 61.0], 2: [99.0, 250.0, 98.0], 4: [83.0, 84.0, 85.0]})
    assert not calibration.too_noisy({1: [60.0], 2: [200.0]})  # one round cannot tell


def test_a_noisy_measurement_is_used_but_not_kept(decoder, tmp_path, monkeypatch):
    noisy = {1: [60.0, 150.0, 61.0], 2: [99.0, 250.0, 98.0], 4: [83.0, 200.0, 85.0]}
    monkeypatch.setattr(calibration, "measure_step_times", lambda *a, **kw: noisy)
    found = decoder.calibrate(tmp_path)
    assert found.source == "measured" and found.path is None and found.ms == {1: 61.0, 2: 99.0, 4: 85.0}
    assert decoder.step_cost is found.curve
    _, path = _key_path(decoder, tmp_path)
    assert not path.exists()  # the next start measures again


def test_a_measurement_whose_threads_were_preempted_often_is_used_but_not_kept(decoder, tmp_path, monkeypatch):
    """Rounds that agree (a steady competitor slows every size alike, and one round is always trusted), but threads
    the OS preempted far more than BUSY_SWITCHES times a second: used now, not kept; a quiet measurement is."""
    import itertools

    counts = itertools.count(0, 10**6)
    monkeypatch.setattr(calibration, "_preemptions", lambda: next(counts))
    found = decoder.calibrate(tmp_path, **QUICK)
    assert found.source == "measured" and found.path is None and decoder.step_cost is found.curve
    assert not _key_path(decoder, tmp_path)[1].exists()  # the next start measures again
    monkeypatch.setattr(calibration, "_preemptions", lambda: 0)
    again = decoder.calibrate(tmp_path, **QUICK)
    assert again.source == "measured" and again.path is not None and again.path.is_file()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins threads to a core (Linux)")
def test_a_thread_sharing_its_core_with_busy_processes_is_preempted_often(monkeypatch):
    """What the busy-cores check reads: a thread spinning on one core beside two busy processes pinned there is
    preempted more than BUSY_SWITCHES times a second (one core loaded, whatever the machine's size)."""
    import subprocess
    import sys

    monkeypatch.setattr(calibration, "_preemptions", READ_PREEMPTIONS)
    before = os.sched_getaffinity(0)
    core = min(before)
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    os.sched_setaffinity(0, {core})  # this thread
    try:
        time.sleep(0.3)  # they start
        watch = calibration.Preemptions()
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            pass
        rate = watch.rate()
        assert rate is not None and calibration.shared_cores(rate, 1), rate
    finally:
        os.sched_setaffinity(0, before)
        for process in busy:
            process.kill()
            process.wait()


def test_a_measurement_cut_short_by_its_time_limit_is_used_but_not_kept(decoder, tmp_path):
    found = decoder.calibrate(tmp_path, sizes=(1, 2, 4), context=48, repeats=3, max_seconds=0.0)
    assert found.source == "measured" and found.path is None and decoder.step_cost is found.curve
    assert not _key_path(decoder, tmp_path)[1].exists()


def test_the_heads_cost_by_rows_is_measured_by_its_fastest_rounds():
    """measure_head times one head call per size in interleaved rounds and keeps each size's fastest: a head whose
    rows cost one unit each gives a rising curve, a head whose rows are free a flat one, and rounds slowed by other
    work (here part of the first timed one and all of the second) are not what the curve says."""
    import time

    from rest_lsp.engine.calibration import measure_head

    calls = {"n": 0}

    def head(dear: bool):
        def run(hidden: torch.Tensor) -> None:
            calls["n"] += 1
            busy = 8 <= calls["n"] < 16  # the first timed round meets other work
            time.sleep(0.002 * (hidden.shape[0] if dear else 1) + (0.05 if busy else 0.0))
        return run

    steep = measure_head(head(True), 4, torch.float32, largest=6)
    assert len(steep) == 7 and steep[1] == 1.0
    assert 1.5 < steep[2] < 2.6 and steep[6] > 3.5 and steep[6] > steep[4] > steep[2]
    calls["n"] = 0
    flat = measure_head(head(False), 4, torch.float32, largest=6)
    assert max(flat[1:]) < 1.5


def test_a_decoder_on_a_cpu_weighs_its_head_rows_on_a_curve_measured_here(monkeypatch):
    """The decoder's head is timed by rows as it is built, up to the rows of its largest call or miss, on rows as
    wide as the head reads; what it measured is what its first head calls are weighed on."""
    from rest_lsp.engine import decoding

    asked = []

    def measured(head, width, dtype, largest):
        asked.append((width, dtype, largest))
        return [0.0, 1.0, 1.25, 1.5, 2.0]

    monkeypatch.setattr(decoding, "measure_head", measured)
    decoder = Decoder(tiny_model("llama"))
    assert asked == [(64, torch.float32, max(decoder.run.head_batch, decoder.run.miss_rows))]
    assert decoder.run.head_cost == (0.0, 1.0, 1.25, 1.5, 2.0)
    monkeypatch.undo()
    cost = Decoder(tiny_model("llama")).run.head_cost  # measured for real: one row is the unit, no row cheaper
    assert len(cost) > max(decoder.run.head_batch, decoder.run.miss_rows)
    assert cost[1] == 1.0 and all(c >= 1.0 for c in cost[1:])


def test_a_head_that_reads_a_projected_state_is_timed_on_rows_of_its_width(monkeypatch):
    """OPT-350m's decoder projects its hidden state (1024 wide) to 512 before the head: the head is timed on rows of
    its own width, and a head the probe cannot run at all leaves the flat curve rather than a model that cannot
    load."""
    from transformers import OPTConfig, OPTForCausalLM

    from rest_lsp.engine import decoding
    from rest_lsp.engine.model import LoadedModel
    from rest_lsp.engine.runmode import FLAT_STEP_COST

    torch.manual_seed(0)
    opt = OPTForCausalLM(OPTConfig(vocab_size=97, hidden_size=64, word_embed_proj_dim=32, num_hidden_layers=1,
                                   num_attention_heads=4, ffn_dim=128, max_position_embeddings=64)).eval()
    loaded = LoadedModel(model=opt, tokenizer=None, device=torch.device("cpu"), dtype=torch.float32, name="opt")
    decoder = Decoder(loaded)
    assert decoder.head is not None and decoder.head.in_features == 32
    assert len(decoder.run.head_cost) > 3 and decoder.run.head_cost[1] == 1.0

    def broken(*args):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(decoding, "measure_head", broken)
    assert Decoder(loaded).run.head_cost == tuple(FLAT_STEP_COST)
