"""benchmarks/step_budget.py: the arithmetic of its predictions (a call's tiles, the two models of a streamed pass,
the hidden share) on made-up numbers, and one tiny table on this CPU's level."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from rest_lsp.kernels import levels, loader  # noqa: E402

import step_budget  # noqa: E402
import tile_rates  # noqa: E402

NS = {r: 10.0 - r * 0.5 for r in range(1, 13)}  # a level whose tiles take at most 12 rows


def test_a_call_runs_in_tiles_of_the_levels_largest_size():
    # 16 rows on 12-row tiles: one of 12 and one of 4; 1000 blocks on 2 threads; ns -> ms
    assert step_budget.compute_ms(NS, 16, 1000, 2) == pytest.approx((12 * NS[12] + 4 * NS[4]) * 1000 / 2 / 1e6)
    assert step_budget.compute_ms(NS, 8, 1000, 1) == pytest.approx(8 * NS[8] * 1000 / 1e6)


def test_a_pass_counts_its_blocks_by_panel_and_block():
    # one layer of the code model without the head: qkv 1152 x 896, o 896 x 896, gate/up 9728 x 896, down 896 x 4864
    want = 72 * 28 + 56 * 28 + 608 * 28 + 56 * 152
    assert step_budget.pass_blocks(5, layers=1, head=False) == want
    assert step_budget.pass_blocks(5, layers=2, head=True) == 2 * want + 9496 * 28


@pytest.mark.parametrize("hidden", [0.0, 0.5, 1.0])
def test_the_hidden_share_is_zero_where_times_add_up_and_one_where_the_longer_wins(hidden):
    blocks, threads = 2_000_000, 2
    c1, c8 = (step_budget.compute_ms(NS, r, blocks, threads) for r in (1, 8))
    one = 20.0
    added, overlapped = one + c8 - c1, max(one, c8)
    cells = step_budget.cells_of({1: one, 8: added - hidden * (added - overlapped)}, NS, blocks, threads)
    assert cells[8]["hidden"] == pytest.approx(hidden)
    assert cells[8]["additive_ms"] == pytest.approx(added) and cells[8]["overlapped_ms"] == pytest.approx(overlapped)
    assert cells[8]["bar_room_ms"] == pytest.approx(0.5 * one) and cells[1]["hidden"] is None


@pytest.mark.skipif(loader._compiler() is None, reason="no C compiler here")
def test_a_tiny_table_on_this_cpus_level(tmp_path):
    level = levels.chosen()
    ns = tile_rates.measure(tile_rates.build(level, tmp_path), rounds=1)[8]
    table = step_budget.budget(level, 8, [1, 2], threads=1, rounds=1, ns=ns, layers=1, head=False)
    assert sorted(table["cells"]) == [1, 2]
    assert all(c["measured_ms"] > 0 and c["compute_ms"] > 0 for c in table["cells"].values())
