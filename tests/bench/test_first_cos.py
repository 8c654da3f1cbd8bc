"""benchmarks/first_cos.py: the first cos of a fresh process, taken as the lean engine takes its rotary table, is
right in every process (the whole-table way was wrong in about a third of them on the 2-core AMX Xeon)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.first_cos import wrong_processes  # noqa: E402


def test_the_lean_tables_first_cos_is_right_in_fresh_processes():
    assert wrong_processes("pieces", 8, 2) == []
