"""The bounds of two windows the service keeps: how far behind the cursor a cached suggestion may have been shown
(typed over since: rest_lsp/service/suggestion_cache.py, TYPED_SCAN_CHARS), and how many recent gaps between
changes set the typing pace (rest_lsp/service/pacing.py, PACE_WINDOW). Each is checked at its edge, so a window
set far larger (or smaller) than the README's turns a test red."""

import pytest

from rest_lsp.service.pacing import PACE_WINDOW, TypingPace
from rest_lsp.service.suggestion_cache import TYPED_SCAN_CHARS, SuggestionCache

BEFORE, AFTER = "values = compute(", ")\n"


def test_the_typed_scan_reaches_128_characters_back_and_no_further():
    assert TYPED_SCAN_CHARS == 128  # llama.vim's scan (README, the suggestion cache)
    text = "".join(f"arg_{i}, " for i in range(40))  # 300 characters, no blank stretch
    cache = SuggestionCache(4)
    cache.put("d", BEFORE, AFTER, text)
    assert cache.match("d", BEFORE + text[:128], AFTER) == text[128:]  # typed 128 of it: the rest shows
    assert cache.match("d", BEFORE + text[:129], AFTER) is None  # 129: too far back to look
    assert cache.match("d", BEFORE + text[:1], AFTER) == text[1:]


def _pace_after(gaps: list[float]) -> TypingPace:
    times, now = [0.0], 0.0
    for gap in gaps:
        now += gap
        times.append(now)
    pace = TypingPace(clock=iter(times).__next__)
    for _ in times:
        pace.changed()
    return pace


def test_the_pace_follows_the_last_10_gaps_only():
    assert PACE_WINDOW == 10
    # ten quick gaps, then ten slower ones: only the slower ones still count
    pace = _pace_after([0.05] * 10 + [0.2] * 10)
    assert pace.debounce_s(0.02, 0.25) == pytest.approx(0.2)
    # nine slow gaps after the quick ones: one quick gap is still in the window, and the median is still slow
    pace = _pace_after([0.05] * 10 + [0.2] * 9)
    assert pace.debounce_s(0.02, 0.25) == pytest.approx(0.2)
    # five slow gaps after many quick ones: the window's median is between them
    pace = _pace_after([0.05] * 20 + [0.2] * 5)
    assert pace.debounce_s(0.02, 0.25) == pytest.approx(0.125)
