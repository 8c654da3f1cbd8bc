"""benchmarks/dear_rows.py: a pass's extra rows made dear on purpose, and bench_replay's servers run through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import dear_rows  # noqa: E402
from benchmarks.bench_replay import parse_args, rest_lsp_command  # noqa: E402
from benchmarks.lsp_client import server_command  # noqa: E402
from rest_lsp.drafting.draft_tree import DraftTree  # noqa: E402
from rest_lsp.engine import decoding  # noqa: E402


def _tree(n: int) -> DraftTree:
    """A chain of n nodes: the root and n - 1 drafts."""
    return DraftTree(list(range(n)), list(range(-1, n - 1)), list(range(n)))


def test_every_row_past_the_first_does_the_units_of_work_a_row_is_worth(monkeypatch):
    passes, units = [], []
    monkeypatch.setattr(decoding.Decoder, "_pass", lambda self, cache, tree, chain=(): passes.append(
        (len(tree), len(chain))) or "logits")
    per_row = dear_rows.install(4.0, unit=lambda: units.append(1), unit_s=0.001)
    assert per_row == 4  # 4 ms of 1 ms units
    pass_ = decoding.Decoder._pass
    assert pass_(None, "cache", _tree(1)) == "logits" and units == []  # a plain step as it was
    assert pass_(None, "cache", _tree(3)) == "logits" and len(units) == 2 * 4
    units.clear()
    assert pass_(None, "cache", _tree(2), chain=[7, 8, 9]) == "logits" and len(units) == 4 * 4  # a tail's rows too
    assert passes == [(1, 0), (3, 0), (2, 3)]  # the real pass runs once each, after the work


def test_no_row_cost_changes_nothing_and_a_small_one_is_one_unit(monkeypatch):
    def plain(self, cache, tree, chain=()):
        return "logits"

    monkeypatch.setattr(decoding.Decoder, "_pass", plain)
    assert dear_rows.install(0.0) == 0 and decoding.Decoder._pass is plain
    assert dear_rows.install(0.1, unit=lambda: None, unit_s=0.001) == 1


def test_bench_replay_runs_its_servers_through_the_wrapper_only_when_asked(tmp_path):
    corpus = ["--corpus", str(tmp_path)]
    flags = ["--draft-budget", "0"]
    assert rest_lsp_command(parse_args(corpus), flags) == server_command(*flags)
    command = rest_lsp_command(parse_args([*corpus, "--dear-rows", "4"]), flags)
    assert command[1].endswith("benchmarks/dear_rows.py")
    assert command[2:] == ["--row-ms", "4.0", "--", "--stdio", *flags]
    with pytest.raises(SystemExit):
        parse_args([*corpus, "--dear-rows", "-1"])


def test_the_wrapper_runs_the_real_command_line():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "dear_rows.py"), "--row-ms", "1", "--",
                           "--help"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and "rest-lsp" in done.stdout
