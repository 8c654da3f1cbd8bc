"""Medians of timings taken in turns, for the kernel curves (step_curve.py, attn_curve.py): every round visits each
row count (forwards, then backwards in the next round) and each level at it, so a machine that slows down or speeds
up meanwhile weighs on every cell alike."""

from __future__ import annotations

import statistics
from typing import Callable


def medians(runs: dict[str, Callable[[int], float]], rows, rounds: int) -> dict[str, dict[int, float]]:
    """{level: {rows: median of runs[level](rows)}} over `rounds` rounds (each call returns one timing)."""
    times: dict[str, dict[int, list[float]]] = {level: {r: [] for r in rows} for level in runs}
    for i in range(rounds):
        for r in list(rows) if i % 2 == 0 else list(reversed(rows)):
            for level, run in runs.items():
                times[level][r].append(run(r))
    return {level: {r: statistics.median(ts) for r, ts in by_rows.items()} for level, by_rows in times.items()}
