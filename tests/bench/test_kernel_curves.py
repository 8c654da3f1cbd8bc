"""benchmarks/step_curve.py and attn_curve.py call the kernels' C entry points directly (no Python wrapper in the
timed loop): one tiny curve each on the level this CPU runs, so a change of a kernel's arguments breaks a test, not
the next person's benchmark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from rest_lsp.kernels import levels  # noqa: E402

import attn_curve  # noqa: E402
import step_curve  # noqa: E402


@pytest.mark.parametrize("bits", [8, 4])
def test_the_step_curve_runs_on_this_cpus_level(bits):
    level = levels.chosen()
    curve = step_curve.curves([level], bits, rows=(1, 2), layers=1, rounds=1, head=False)[level]
    assert sorted(curve) == [1, 2] and all(ms > 0 for ms in curve.values())


def test_the_attention_curve_runs_on_this_cpus_level():
    level = levels.chosen()
    curve = attn_curve.curves([level], rows=(1, 2), past=64, layers=1, rounds=1)[level]
    assert sorted(curve) == [1, 2] and all(ms > 0 for ms in curve.values())
