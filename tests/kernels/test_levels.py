"""The dispatcher (rest_lsp/kernels/levels.py): it never picks a level the CPU does not report, a forced level
runs only where the CPU executes it, and a library of a level this CPU lacks is never loaded."""

import logging

import pytest

from rest_lsp.kernels import levels, quant_matmul

AVX2_ONLY = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi1 bmi2 movbe popcnt".split())
ZEN4 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16"}
ALDER_LAKE = AVX2_ONLY | {"avx_vnni"}
SAPPHIRE_RAPIDS = ZEN4 | {"avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}


@pytest.mark.parametrize("flags,best", [
    (frozenset(), "portable"), (AVX2_ONLY, "avx2"), (AVX2_ONLY - {"fma"}, "portable"), (ALDER_LAKE, "avx-vnni"),
    (ZEN4, "avx512-vnni"), (ZEN4 - {"avx512_vnni"}, "avx2"), (SAPPHIRE_RAPIDS, "amx"),
    (SAPPHIRE_RAPIDS - {"amx_int8"}, "avx512-vnni")], ids=["none", "avx2", "avx-no-fma", "alder-lake", "zen4",
                                                           "avx512-no-vnni", "sapphire-rapids", "amx-tile-only"])
def test_the_best_level_the_cpu_reports_is_chosen(flags, best):
    assert levels.chosen(flags, env={}, x86=True) == best
    for level in levels.runnable(flags, x86=True):
        assert levels.NEEDS[level] <= flags  # never a level whose instructions the CPU lacks


def test_an_avx2_only_cpu_never_gets_a_vnni_level_even_when_forced(caplog):
    with caplog.at_level(logging.WARNING, logger="rest_lsp.kernels.levels"):
        assert levels.chosen(AVX2_ONLY, env={levels.ENV: "avx-vnni"}, x86=True) == "avx2"
        assert levels.chosen(AVX2_ONLY, env={levels.ENV: "avx512-vnni"}, x86=True) == "avx2"
    assert caplog.messages == [f"{levels.ENV}=avx-vnni is not executed by this CPU: the kernels run at the avx2 level.",
                               f"{levels.ENV}=avx512-vnni is not executed by this CPU: the kernels run at the avx2 "
                               "level."]


def test_a_forced_level_the_cpu_executes_is_taken(caplog):
    assert levels.chosen(SAPPHIRE_RAPIDS, env={levels.ENV: "AVX2"}, x86=True) == "avx2"
    assert levels.chosen(SAPPHIRE_RAPIDS, env={levels.ENV: "portable"}, x86=True) == "portable"
    with caplog.at_level(logging.WARNING, logger="rest_lsp.kernels.levels"):
        assert levels.chosen(ZEN4, env={levels.ENV: "sse9"}, x86=True) == "avx512-vnni"
    assert "is not a kernel level" in caplog.text


def test_off_x86_only_the_portable_build_runs():
    assert levels.runnable(SAPPHIRE_RAPIDS, x86=False) == ("portable",)
    assert levels.chosen(frozenset(), env={levels.ENV: "avx2"}, x86=False) == "portable"


def test_a_level_this_cpu_lacks_is_refused_before_anything_is_built_or_loaded(monkeypatch):
    """What the CPU reports is faked down to AVX2: asking for a VNNI library is an error, not a crash."""
    monkeypatch.setattr(levels, "cpu_flags", lambda: AVX2_ONLY)
    monkeypatch.setattr(levels, "is_x86", lambda: True)
    quant_matmul.KERNEL.forget()
    try:
        for level in ("avx-vnni", "avx512-vnni", "amx"):
            with pytest.raises(levels.LevelUnavailable, match=f"does not execute the {level} level"):
                quant_matmul.library(level)
        assert "avx-vnni" not in quant_matmul.KERNEL._libraries
    finally:
        quant_matmul.KERNEL.forget()


def test_the_dispatched_level_is_one_this_cpu_reports():
    assert levels.chosen() in levels.runnable()
    assert all(levels.NEEDS[level] <= levels.cpu_flags() for level in levels.runnable() if levels.is_x86())


def test_the_run_mode_names_the_level_its_kernels_run_at(monkeypatch):
    """The plan the engine gets (runmode.RunMode) carries the kernel level: the dispatcher's, or the forced one."""
    import torch

    from rest_lsp.engine import runmode

    cpu = torch.device("cpu")
    assert runmode.run_mode(cpu, torch.float32, "gguf").level == levels.chosen()
    assert runmode.run_mode(cpu, torch.float32, "onednn").level == ""
    assert runmode.run_mode(torch.device("cuda"), torch.float32, "none").level == ""
    if "avx2" in levels.runnable() and levels.is_x86():
        monkeypatch.setenv(levels.ENV, "avx2")
        assert runmode.run_mode(cpu, torch.float32, "q8").level == "avx2"


def test_a_kernel_call_does_not_read_proc_cpuinfo(monkeypatch):
    """Every call asks the dispatcher which level runs; the CPU's flags are read once a process, not per call (a
    1-token step makes some 150 calls)."""
    import builtins

    import torch

    if quant_matmul.library() is None:
        pytest.skip("no quantized kernel here")
    x, panels = torch.randn(1, 64), quant_matmul.pack(torch.randn(16, 64))
    quant_matmul.quant_mm(x, panels, 16)
    reads = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file) == "/proc/cpuinfo":
            reads.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    for _ in range(3):
        quant_matmul.quant_mm(x, panels, 16)
        levels.chosen()
    assert reads == []
