"""benchmarks/bench_kernels.py: which kernel levels a CPU runs, and a level forced on a child run of the benchmark."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_kernels import (  # noqa: E402
    LEVEL_ENV, chosen_levels, curves_for_plot, in_subprocess, report, runnable_levels, strip_level_args)

EPYC = {"avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni"}  # AVX-512 VNNI, no AMX


def test_the_levels_a_cpu_runs_follow_its_flags():
    assert runnable_levels(set()) == ["portable"]
    assert runnable_levels({"avx2", "fma", "f16c"}) == ["portable", "avx2"]
    assert runnable_levels(EPYC) == ["portable", "avx2", "avx-vnni", "avx512-vnni"]
    assert runnable_levels(EPYC | {"amx_tile", "amx_int8"})[-1] == "amx"


def test_all_is_every_runnable_level_and_a_missing_one_is_left_out(capsys):
    assert chosen_levels(["all"], EPYC) == ["portable", "avx2", "avx-vnni", "avx512-vnni"]
    assert chosen_levels(["amx", "avx2", "portable"], EPYC) == ["portable", "avx2"]
    assert "amx: this CPU lacks its instructions" in capsys.readouterr().out


def test_a_child_gets_the_arguments_but_not_the_level_or_the_plot():
    argv = ["--rows", "1,2", "--level", "avx2", "--level=amx", "--plot", "k.png", "--kinds", "q8"]
    assert strip_level_args(argv) == ["--rows", "1,2", "--kinds", "q8"]


def test_each_level_runs_in_a_child_with_the_level_set():
    result = in_subprocess("portable", ["--kinds", "", "--modes", ""])
    assert result is not None and result["level"] == "portable", LEVEL_ENV


def test_the_tables_and_the_plot_name_each_level_when_several_ran():
    per = {1: 10.0, 2: 12.0}
    results = [{"level": level, "threads": 2, "rows": [1, 2], "integer_kernel": "AVX2", "modes": {"float32": per}}
               for level in ("avx2", "portable")]
    text = "\n".join(report(results))
    assert "level avx2" in text and "level portable" in text and "12.0 (1.20x)" in text
    assert set(curves_for_plot(results)["whole step, per mode"]) == {"float32 [avx2]", "float32 [portable]"}
