"""What a kept suggestion is served for: the cache, type-through and the prefetch only ever answer for the text,
document, model and settings a suggestion was computed for. Real tiny models, float32."""

from __future__ import annotations

import dataclasses

import pytest
from support import greedy, wait_for

from rest_lsp.service.completion import CompletionService
from rest_lsp.service.suggestion_cache import KEY_PREFIX_CHARS, TYPED_SCAN_CHARS, SuggestionCache
from rest_lsp.settings import Settings

DEFINITION = ('def compute_total(items):\n    """Sum the prices of the items."""\n'
              "    return sum(i.price for i in items)\n")
FILLER = "".join(f"\n\ndef helper_{i}(value):\n    return value * {i}\n" for i in range(8))
BEFORE = DEFINITION + FILLER + "\n\ndef report(items):\n    amount = compute_"
AFTER = "\n"
MAX_NEW = 12


def _settings(model, **kw) -> Settings:
    values = {"model": str(model), "dtype": "float32", "max_new_tokens": MAX_NEW, "debounce_ms": 0,
              "index_workspace": False}
    return Settings(**{**values, **kw})


def _service(model, **kw) -> CompletionService:
    svc = CompletionService(_settings(model, **kw))
    svc.start([])
    assert svc.wait_ready(120), svc.load_error
    return svc


def _submit(svc, doc: str, before: str, after: str = AFTER):
    return svc.submit(doc, before + after, len(before)).future.result(60)


def test_the_rename_is_far_above_the_nearby_text():
    assert len(BEFORE) - BEFORE.index("compute_total") > KEY_PREFIX_CHARS


def test_a_cache_entry_is_for_one_text_of_one_document():
    cache = SuggestionCache(8)
    renamed = BEFORE.replace("compute_total", "compute_tally")  # the same length: only the text tells them apart
    cache.put("a.py", BEFORE, AFTER, "total(items)")
    assert cache.match("a.py", BEFORE, AFTER) == "total(items)"
    assert cache.match("a.py", BEFORE + "tot", AFTER) == "al(items)"  # typed over
    assert cache.match("a.py", renamed, AFTER) is None  # an edit above the nearby text
    assert cache.match("a.py", BEFORE.replace("compute_total", "compute_sum"), AFTER) is None
    assert cache.match("a.py", BEFORE, AFTER + FILLER) is None  # an edit below
    assert cache.match("b.py", BEFORE, AFTER) is None  # another document with the same text
    cache.put("b.py", BEFORE, AFTER, "total(x)")
    cache.forget("a.py")  # closed
    assert cache.match("a.py", BEFORE, AFTER) is None and cache.match("b.py", BEFORE, AFTER) == "total(x)"


def test_the_typed_scan_reaches_back_its_width_and_no_further():
    cache = SuggestionCache(8)
    text = "x" * (TYPED_SCAN_CHARS + 8)
    cache.put("a.py", BEFORE, AFTER, text)
    assert cache.match("a.py", BEFORE + text[:TYPED_SCAN_CHARS], AFTER) == text[TYPED_SCAN_CHARS:]
    assert cache.match("a.py", BEFORE + text[: TYPED_SCAN_CHARS + 1], AFTER) is None


def test_a_rename_above_the_cursor_is_decoded_again(tiny_models):
    svc = _service(tiny_models["random"], prefetch=False)
    try:
        first = _submit(svc, "mem://a.py", BEFORE)
        assert first is not None and first.source == "model"
        renamed = BEFORE.replace("compute_total", "compute_tally")  # the same length
        again = _submit(svc, "mem://a.py", renamed)
        assert again is not None and again.source == "model"  # the old code: "cache", the old text
        assert again.text == greedy(tiny_models["random"], renamed, AFTER, MAX_NEW)
        other = _submit(svc, "mem://b.py", BEFORE)  # the same text in another document
        assert other is not None and other.source == "model"
        back = _submit(svc, "mem://a.py", renamed + "zq")  # typed on, then deleted back: the cache still serves
        assert back is not None and _submit(svc, "mem://a.py", renamed).source == "cache"
        assert svc.stats()["cache_hits"] == 1
    finally:
        svc.close()


def test_a_settings_change_makes_kept_suggestions_stale(tiny_models):
    svc = _service(tiny_models["random"], prefetch=False)
    try:
        long = _submit(svc, "mem://s.py", BEFORE)
        assert long is not None and long.text[1:].strip()
        svc.update_settings(dataclasses.replace(svc.settings, max_new_tokens=4))
        # the old code: the rest of the 12-token suggestion, typed through
        typed = _submit(svc, "mem://s.py", BEFORE + long.text[:1])
        assert typed is None or typed.source == "model"
        # the old code: the 12-token suggestion from the cache
        short = _submit(svc, "mem://s.py", BEFORE)
        assert short is not None and short.source == "model"
        assert short.text == greedy(tiny_models["random"], BEFORE, AFTER, 4)
        assert svc.stats()["type_through"] == 0 and svc.stats()["cache_hits"] == 0
        # a setting that shapes no text keeps what was kept
        svc.update_settings(dataclasses.replace(svc.settings, debounce_ms=1))
        assert _submit(svc, "mem://s.py", BEFORE).source == "cache"
    finally:
        svc.close()


def test_a_settings_change_drops_the_parked_prefetch(tiny_models):
    svc = _service(tiny_models["random"])
    try:
        shown = _submit(svc, "mem://p.py", BEFORE)
        assert shown is not None
        # >= 1: both wishes (after the text, on the next line) may end between two polls
        wait_for(lambda: svc.stats()["prefetched"] >= 1, 60, "the prefetch")
        svc.update_settings(dataclasses.replace(svc.settings, max_new_tokens=2))
        accepted = BEFORE + shown.text
        got = _submit(svc, "mem://p.py", accepted)  # the old code: the 12-token prefetch
        assert got is None or got.source == "model"
        assert svc.stats()["prefetch_hits"] == 0
        assert (got.text if got else "") == greedy(tiny_models["random"], accepted, AFTER, 2)
    finally:
        svc.close()


@pytest.mark.parametrize("kept", ["cache", "prefetch"])
def test_a_closed_document_keeps_no_suggestion(tiny_models, kept):
    svc = _service(tiny_models["random"], prefetch=kept == "prefetch")
    try:
        shown = _submit(svc, "mem://c.py", BEFORE)
        assert shown is not None and len(svc._cache) == 1
        if kept == "prefetch":
            wait_for(lambda: svc.stats()["prefetched"] >= 1, 60, "the prefetch")
        svc.close_document("mem://c.py")
        assert len(svc._cache) == 0
        again = _submit(svc, "mem://c.py", BEFORE + shown.text if kept == "prefetch" else BEFORE)
        assert again is None or again.source == "model"
        assert svc.stats()["prefetch_hits"] == 0 and svc.stats()["cache_hits"] == 0
    finally:
        svc.close()
