"""benchmarks/tile_rates.py builds a C harness around the kernel's own source: a change of the tiles' signature or
of the names it calls breaks a test here, not the next person's benchmark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rest_lsp.kernels import levels, loader, quant_matmul

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import tile_rates  # noqa: E402


@pytest.mark.skipif(loader._compiler() is None, reason="no C compiler here")
def test_the_tiles_are_timed_on_this_cpus_level(tmp_path):
    level = levels.chosen()
    cells = tile_rates.measure(tile_rates.build(level, tmp_path), rounds=1)
    assert set(cells) == set(quant_matmul.CODES)  # every format
    assert all(sorted(rows) == list(range(1, max(rows) + 1)) and max(rows) >= 4 for rows in cells.values())
    assert all(ns > 0 for rows in cells.values() for ns in rows.values())
