"""A .gguf loaded without a dtype that the gguf mode cannot load from its blocks (gguf_direct.refusal; one it can
loads that way: test_gguf_direct.py) runs in the mode that steps fastest on this machine (engine/mode_choice.py):
the machine's rule (bfloat16 or float16-weights) or the gguf mode, timed once on the model itself and kept per
machine and file; an asked-for dtype, REST_LSP_DTYPE or a model folder never times anything."""

import json
import logging
import os

import pytest
import torch
from support import tiny_folder
from test_gguf_mode import needs_kernel, write_gguf

from rest_lsp.engine import gguf_direct, mode_choice, runmode
from rest_lsp.engine.decoding import Decoder
from rest_lsp.engine.model import load_model
from rest_lsp.engine.model_source import cache_root


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A .gguf the gguf mode cannot load from its blocks (as if gguf_direct refused it): the timed choice decides."""
    needs_kernel()
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(runmode.DTYPE_ENV, raising=False)
    monkeypatch.setattr(gguf_direct, "refusal", lambda header: "a refusal of this test")
    return write_gguf(tmp_path / "tiny-qwen2.gguf", "qwen2", True)


def rule() -> str:
    return runmode.decide("cpu", None, gguf=True).name


class Timed:
    """time_mode replaced by given step costs (ms by mode name), counting its calls."""

    def __init__(self, monkeypatch, costs: dict[str, float], noisy: bool = False, failing: str | None = None):
        self.costs, self.noisy, self.failing, self.calls = costs, noisy, failing, []
        monkeypatch.setattr(mode_choice, "time_mode", self)

    def __call__(self, model, packing, rounds=mode_choice.ROUNDS):
        name = runmode.mode_name(next(model.parameters()).dtype, packing)
        self.calls.append(name)
        if name == self.failing:
            raise ValueError("cannot run here")
        ms = self.costs[name]
        return mode_choice.Timing(ms, 2 * ms, 10 * ms), self.noisy


def kept_files() -> list:
    return sorted((cache_root() / "calibration").glob("mode-*.json"))


@pytest.mark.parametrize("gguf_faster", [True, False], ids=["gguf-faster", "rule-faster"])
def test_the_faster_mode_is_chosen_and_kept_for_the_next_load(tiny, monkeypatch, gguf_faster):
    timed = Timed(monkeypatch, {rule(): 20.0 if gguf_faster else 5.0, "gguf": 10.0})
    first = load_model(str(tiny), "cpu")
    want = "gguf" if gguf_faster else rule()
    assert first.mode == want and sorted(timed.calls) == sorted([rule(), "gguf"])
    assert first.dtype == runmode.decide("cpu", want, gguf=True).dtype
    assert [k for k in first.model.__dict__ if k.startswith("_lean_")] in ([], [f"_lean_{first.packing}"])
    assert Decoder(first).mode == want
    (kept,) = kept_files()
    assert json.loads(kept.read_text())["mode"] == want
    second = load_model(str(tiny), "cpu")
    assert second.mode == want and len(timed.calls) == 2  # read, not timed again


def test_an_asked_for_dtype_a_forced_default_or_a_folder_times_nothing(tiny, tmp_path, monkeypatch):
    timed = Timed(monkeypatch, {rule(): 1.0, "gguf": 2.0})
    assert load_model(str(tiny), "cpu", "float32").mode == "float32"
    assert load_model(str(tiny), "cpu", "gguf").mode == "gguf"
    monkeypatch.setenv(runmode.DTYPE_ENV, "float32")
    assert load_model(str(tiny), "cpu").mode == "float32"
    monkeypatch.delenv(runmode.DTYPE_ENV)
    load_model(str(tiny_folder(tmp_path / "folder")), "cpu")
    assert timed.calls == [] and kept_files() == []


def test_noisy_timings_decide_this_load_but_are_not_kept(tiny, monkeypatch):
    timed = Timed(monkeypatch, {rule(): 20.0, "gguf": 10.0}, noisy=True)
    assert load_model(str(tiny), "cpu").mode == "gguf" and kept_files() == []
    load_model(str(tiny), "cpu")
    assert len(timed.calls) == 4


def test_a_mode_that_cannot_run_is_no_candidate_and_nothing_is_kept(tiny, monkeypatch, caplog):
    Timed(monkeypatch, {rule(): 20.0, "gguf": 10.0}, failing="gguf")
    with caplog.at_level(logging.INFO, logger="rest_lsp.engine.mode_choice"):
        assert load_model(str(tiny), "cpu").mode == rule()
    assert "Mode gguf cannot run this model here (cannot run here)" in caplog.text
    assert kept_files() == []


def test_a_damaged_or_foreign_choice_is_measured_again(tiny, monkeypatch):
    timed = Timed(monkeypatch, {rule(): 20.0, "gguf": 10.0})
    load_model(str(tiny), "cpu")
    (kept,) = kept_files()
    for text in ("{not json", json.dumps({"key": {"method": -1}, "mode": "gguf", "timings": {}})):
        kept.write_text(text)
        assert load_model(str(tiny), "cpu").mode == "gguf"
        assert json.loads(kept.read_text())["mode"] == "gguf"
    assert len(timed.calls) == 6


def test_a_changed_file_is_measured_again(tiny, monkeypatch):
    timed = Timed(monkeypatch, {rule(): 20.0, "gguf": 10.0})
    load_model(str(tiny), "cpu")
    write_gguf(tiny, "qwen2", False)  # rewritten as another model
    load_model(str(tiny), "cpu")
    assert len(timed.calls) == 4 and len(kept_files()) == 2


def test_a_choice_follows_the_files_bytes_not_its_path_size_and_time(tiny, tmp_path, monkeypatch):
    """Touched (same bytes): the kept choice holds. Replaced by another file of the same size with the modification
    time kept (cp -p, rsync -a, tar): another model, measured again."""
    timed = Timed(monkeypatch, {rule(): 20.0, "gguf": 10.0})
    load_model(str(tiny), "cpu")
    os.utime(tiny, (1e9, 1e9))
    load_model(str(tiny), "cpu")
    assert len(timed.calls) == 2
    other = bytearray(tiny.read_bytes())
    other[-1] ^= 1  # one bit of the last tensor
    st = tiny.stat()
    tiny.write_bytes(bytes(other))
    os.utime(tiny, ns=(st.st_atime_ns, st.st_mtime_ns))
    load_model(str(tiny), "cpu")
    assert len(timed.calls) == 4 and len(kept_files()) == 2


@pytest.mark.parametrize("bad", [None, "fast", -1.0, float("inf"), True, [1.0]])
def test_a_kept_choice_with_a_bad_timing_is_measured_again_with_one_warning(tiny, monkeypatch, caplog, bad):
    timed = Timed(monkeypatch, {rule(): 20.0, "gguf": 10.0})
    load_model(str(tiny), "cpu")
    (kept,) = kept_files()
    data = json.loads(kept.read_text())
    data["timings"]["gguf"]["step_ms"] = bad
    kept.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.mode_choice"):
        assert load_model(str(tiny), "cpu").mode == "gguf"
    assert len(timed.calls) == 4
    assert len([r for r in caplog.records if "is not used" in r.getMessage()]) == 1
    assert json.loads(kept.read_text())["timings"]["gguf"]["step_ms"] == 10.0  # measured and kept again


def test_a_choice_another_user_could_write_is_not_used(tiny, monkeypatch, caplog):
    timed = Timed(monkeypatch, {rule(): 20.0, "gguf": 10.0})
    load_model(str(tiny), "cpu")
    (kept,) = kept_files()
    kept.chmod(0o666)  # anyone may have written it
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.mode_choice"):
        load_model(str(tiny), "cpu")
    assert len(timed.calls) == 4 and "writable by group or others" in caplog.text


def test_each_candidate_is_timed_on_the_model_itself(tiny):
    """The real timings: both candidates run on the model's weights, steps and prefill take time, and the load runs
    the model in a candidate's mode with weights of its dtype."""
    loaded = load_model(str(tiny), "cpu", "float32")
    names = [rule(), "gguf"]
    timings, _ = mode_choice.measure(loaded.model, names, runmode.decide("cpu", None, gguf=True))
    assert sorted(timings) == sorted(names)
    assert all(t.step_ms > 0 and t.tree_ms > 0 and t.prefill_ms > 0 for t in timings.values())
    assert next(loaded.model.parameters()).dtype == torch.float32  # a bf16 candidate times a copy
    chosen = load_model(str(tiny), "cpu")
    assert chosen.mode in names and next(chosen.model.parameters()).dtype == chosen.dtype


def test_timings_whose_threads_the_os_preempted_often_are_noisy(tiny, monkeypatch):
    """One round (its spread says nothing) timed for real: noisy when the process was preempted far more than
    calibration.BUSY_SWITCHES times a second (cores shared with other work), else not."""
    import itertools

    from rest_lsp.engine import calibration

    loaded = load_model(str(tiny), "cpu", "float32")
    weights, packing = mode_choice._weights(loaded.model, "gguf", runmode.decide("cpu", None, gguf=True))
    monkeypatch.setattr(calibration, "_preemptions", lambda: 0)
    assert mode_choice.time_mode(weights, packing, rounds=1)[1] is False
    counts = itertools.count(0, 10**6)
    monkeypatch.setattr(calibration, "_preemptions", lambda: next(counts))
    assert mode_choice.time_mode(weights, packing, rounds=1)[1] is True


@pytest.mark.parametrize("winner", ["rule", "gguf"])
def test_after_real_timings_the_winner_decodes_and_rest_is_plain_decoding(tiny, monkeypatch, winner):
    """Both candidates timed for real (the lean engine fused and packed the weights for each), then the winner's
    decoder runs the model: no weight left by the loser's timing (inference tensors, fp32 fused copies), and in
    the gguf mode REST writes what plain decoding writes."""
    from test_exactness import assert_rest_is_plain_decoding, plain_tokens

    want = rule() if winner == "rule" else "gguf"
    monkeypatch.setattr(mode_choice, "choose", lambda timings: want)
    loaded = load_model(str(tiny), "cpu")
    assert loaded.mode == want
    assert not any(p.is_inference() for p in loaded.model.parameters())
    fused = [m.__dict__["_lean_fused"] for m in loaded.model.modules() if "_lean_fused" in m.__dict__]
    assert all(t.dtype == loaded.dtype for parts in fused for t in parts if t is not None)
    decoder = Decoder(loaded)
    assert decoder.mode == want and len(plain_tokens(decoder, [1, 2, 3], 6)) == 6
    if want == "gguf":
        assert_rest_is_plain_decoding(decoder, decoder.vocab_size, budgets=(8,), seeds=range(1))


def test_choose_takes_the_cheapest_steps_and_the_rule_on_a_tie():
    t = mode_choice.Timing
    assert mode_choice.choose({"bfloat16": t(40, 41, 1), "gguf": t(20, 27, 9)}) == "gguf"
    assert mode_choice.choose({"bfloat16": t(10, 11, 1), "gguf": t(20, 27, 1)}) == "bfloat16"
    assert mode_choice.choose({"float16-weights": t(10, 10, 1), "gguf": t(10, 10, 1)}) == "float16-weights"


def test_only_a_gguf_on_a_cpu_that_builds_the_kernel_has_candidates(monkeypatch):
    from rest_lsp.kernels import quant_matmul

    needs_kernel()
    cpu = runmode.decide("cpu", None, gguf=True)
    assert mode_choice.candidates(cpu, gguf=True) == [cpu.name, "gguf"]
    assert mode_choice.candidates(cpu, gguf=False) == []
    assert mode_choice.candidates(runmode.decide("cpu", "gguf", gguf=True), gguf=True) == []
    cuda = runmode.run_mode(torch.device("cuda"), torch.float32, None)
    assert mode_choice.candidates(cuda, gguf=True) == []
    monkeypatch.setattr(quant_matmul, "available", lambda: False)
    assert mode_choice.candidates(cpu, gguf=True) == []


def test_a_choice_timed_on_another_build_of_the_kernel_is_not_read(tmp_path, monkeypatch):
    """A kernel update or a forced level changes what the gguf mode's steps cost: the key names the build."""
    from rest_lsp.kernels import quant_matmul

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cpu = torch.device("cpu")
    key = mode_choice.choice_key(gguf, cpu, ["gguf"])
    assert key["kernel"] == quant_matmul.build_name()
    timings = {"gguf": mode_choice.Timing(20.0, 30.0, 100.0)}
    mode_choice.write_cached(mode_choice.cache_file(tmp_path, key), key, mode_choice.Choice("gguf", timings, "x"))
    assert mode_choice.read_cached(mode_choice.cache_file(tmp_path, key), key) is not None
    monkeypatch.setattr(quant_matmul, "build_name", lambda lib=None: "quant_matmul-avx2-0123456789abcdef")
    other = mode_choice.choice_key(gguf, cpu, ["gguf"])
    assert other != key and mode_choice.read_cached(mode_choice.cache_file(tmp_path, other), other) is None
