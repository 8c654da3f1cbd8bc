"""Text the tokenizer refuses: its request fails with one sentence, and nothing of it is kept, so the document's later
requests are answered."""

import pytest
from support import greedy

from rest_lsp.service.completion import BadText, CompletionService, check_text
from rest_lsp.settings import Settings


def test_a_lone_surrogate_is_named_by_its_line():
    check_text("ok = '😋'\n")  # a pair is one character: fine
    with pytest.raises(BadText) as found:
        check_text("a = 1\nb = 2\nc = '😋\udc00'\n")
    assert str(found.value) == ("rest-lsp: line 3 holds a lone surrogate (U+DC00), which is not valid Unicode; "
                                "no completion until it is removed.")


def test_a_bad_text_fails_its_request_only(tiny_models):
    svc = CompletionService(Settings(model=str(tiny_models["random"]), dtype="float32", max_new_tokens=6,
                                     debounce_ms=0, index_workspace=False, prefetch=False))
    svc.start([])
    assert svc.wait_ready(120), svc.load_error
    try:
        bad, clean = 'x = "\ud83d"\ny = ', 'x = ""\ny = '
        svc.expect("mem://a.py", bad, len(bad))  # an edit that leaves it: nothing to warm, nothing raised
        with pytest.raises(BadText):  # the old code: queued, then failing in the worker
            svc.submit("mem://a.py", bad, len(bad))
        # the old code: every later request of this document failed, rebuilding the bad place's prompt first
        c = svc.submit("mem://a.py", clean, len(clean)).future.result(60)
        assert c is not None and c.text == greedy(tiny_models["random"], clean, "", 6)
    finally:
        svc.close()
