"""Latency mechanisms of the service: the prefetch, the suggestion cache, the one-line rule, the time budget and the
adaptive debounce. Real tiny models (conftest_server); the decoder is only counted, never faked."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest
from step_gate import WorkerIdle
from support import chain_model, command, greedy, inline, open_doc, server_command, start, wait_for, wait_until
from lsprotocol import types

from rest_lsp.service.completion import CompletionService
from rest_lsp.engine.decoding import Decoder
from rest_lsp.service.pacing import LineBudget, TypingPace
from rest_lsp.settings import Settings
from rest_lsp.service.suggestion_cache import SuggestionCache
from rest_lsp.service.suggestions import TYPE_THROUGH_ENTRIES

BEFORE = "def add(a, b):\n    return a + b\n\nresult = add("
AFTER = ")\nprint(result)\n"
# more than the cache key's prefix (256 characters) of text above the cursor, so that an edit there is far away
PREAMBLE = "".join(f"def helper_{i}(value):\n    return value * {i}\n\n" for i in range(12))
MAX_NEW = 12


class Calls(list):
    """The real decoder's generate calls: one entry each, its DecodeResult once it returned. `hold_call(n)` holds
    the first decoding step of the n-th call (`held` is set) until `release` is set."""

    def __init__(self):
        super().__init__()
        self.hold_at: int | None = None
        self.held, self.release = threading.Event(), threading.Event()


@pytest.fixture
def generate_calls(monkeypatch) -> Calls:
    calls = Calls()
    generate, verify = Decoder.generate, Decoder.verify
    holding = threading.local()

    def counted(decoder, *args, **kwargs):
        calls.append(None)
        holding.now = len(calls) == calls.hold_at
        index = len(calls) - 1
        result = generate(decoder, *args, **kwargs)
        calls[index] = result
        return result

    def held(decoder, tree, *chain):
        if getattr(holding, "now", False):
            holding.now = False
            calls.held.set()
            assert calls.release.wait(300), "the held step was never released"
        return verify(decoder, tree, *chain)

    monkeypatch.setattr(Decoder, "generate", counted)
    monkeypatch.setattr(Decoder, "verify", held)
    yield calls
    calls.release.set()


def _service(model: Path, **settings) -> CompletionService:
    values = dict(model=str(model), dtype="float32", max_new_tokens=MAX_NEW, debounce_ms=0, index_workspace=False)
    svc = CompletionService(Settings(**{**values, **settings}))
    svc.start([])
    assert svc.wait_ready(120), svc.load_error
    return svc


def _submit(svc: CompletionService, doc: str, before: str, after: str):
    return svc.submit(doc, before + after, len(before)).future.result(60)


@pytest.fixture
def constant_service(tiny_models, generate_calls) -> CompletionService:
    """The constant model (it writes "x" until max_new_tokens=4), plain decoding; a held step is released before
    the service closes."""
    svc = _service(tiny_models["constant"], max_new_tokens=4, draft_budget=0)
    yield svc
    generate_calls.release.set()
    svc.close()


def _answer_and_hold_its_prefetch(svc: CompletionService, calls: Calls, doc: str, call: int = 2) -> None:
    """The constant model answers "xxxx" after "x = "; a prefetch that follows is held in its first step: call 2
    (after the accepted text, at "x = xxxx") or call 3 (on the next line)."""
    calls.hold_at = call
    assert _submit(svc, doc, "x = ", "\n").text == "xxxx"
    assert calls.held.wait(60), f"the prefetch of call {call} never started"


@pytest.fixture(scope="module")
def chain_dir(tiny_models, tmp_path_factory) -> Path:
    """A model that writes "a = 1\\n" over and over after any text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    chain = tok("a = 1\n", add_special_tokens=False)["input_ids"]
    assert len(set(chain)) == len(chain) and tok.decode(chain) == "a = 1\n"
    return chain_model(tmp_path_factory.mktemp("chain"), tok, chain)


# -- 4. prefetch ----------------------------------------------------------------------------------------------


def test_a_prefetch_hit_is_served_without_decoding(tiny_models, generate_calls):
    svc = _service(tiny_models["random"])
    try:
        before, after = PREAMBLE + BEFORE, AFTER
        shown = _submit(svc, "mem://p.py", before, after)
        assert shown is not None and shown.source == "model"
        # while the suggestion is shown and nothing else is asked, the worker computes what follows accepting it
        wait_for(lambda: svc.stats()["prefetched"] == 1, 60, "the prefetch")
        calls = len(generate_calls)
        accepted = before + shown.text
        future = svc.submit("mem://p.py", accepted + after, len(accepted)).future
        assert future.done()  # answered inside submit: never queued for the decoder
        hit = future.result()
        assert hit is not None and hit.source == "prefetch" and (hit.tokens, hit.steps) == (0, 0)
        assert hit.text == greedy(tiny_models["random"], accepted, after, MAX_NEW)  # what decoding would give
        # the only decoding since is the next prefetch (what follows accepting this one)
        wait_for(lambda: svc.stats()["prefetched"] == 2, 60, "the next prefetch")
        stats = svc.stats()
        assert len(generate_calls) == calls + 1 and stats["prefetch_hits"] == 1 and stats["completions_decoded"] == 1
    finally:
        svc.close()


def test_a_prefetch_is_not_served_after_an_unrelated_edit(tiny_models):
    svc = _service(tiny_models["random"])
    try:
        before, after = PREAMBLE + BEFORE, AFTER
        shown = _submit(svc, "mem://q.py", before, after)
        assert shown is not None
        wait_for(lambda: svc.stats()["prefetched"] == 1, 60, "the prefetch")
        # far above the cursor, one character replaced: same lengths, same text near the cursor, another version
        edited = before.replace("def helper_0", "def helper_9", 1)
        assert edited != before and len(edited) == len(before)
        answer = _submit(svc, "mem://q.py", edited + shown.text, after)
        assert answer is not None and answer.source == "model" and answer.steps > 0, answer  # decoded again
        stats = svc.stats()
        assert stats["prefetch_hits"] == 0 and stats["completions_decoded"] == 2
        assert answer.text == greedy(tiny_models["random"], edited + shown.text, after, MAX_NEW)
    finally:
        svc.close()


def test_a_request_stops_a_running_prefetch_after_the_step_it_is_in(constant_service, generate_calls):
    svc = constant_service
    assert _submit(svc, "mem://r.py", "x = ", "\n").text == "xxxx"  # generate call 1
    # calls 2 and 3: after accepting it, at its end and on the next line
    wait_for(lambda: svc.stats()["prefetched"] == 2, 60, "the prefetches after x = xxxx")
    # the prefetch after the next hit: 4 tokens in 4 steps unless a request stops it (a change of maxNewTokens to
    # lengthen it would drop the prefetched hit: a suggestion is served only under the settings it was computed for)
    generate_calls.hold_at = 4
    hit = _submit(svc, "mem://r.py", "x = xxxx", "\n")
    assert hit is not None and hit.source == "prefetch"
    assert generate_calls.held.wait(60), "the next prefetch never started"
    # the request arrives while the prefetch is inside its first step
    ticket = svc.submit("mem://r.py", "z = \n", 4)
    generate_calls.release.set()
    other = ticket.future.result(60)
    assert other is not None and other.text == "xxxx" and other.source == "model"
    prefetch = generate_calls[3]
    assert (prefetch.finish, prefetch.steps) == ("stopped", 1)  # stopped after the step it was in
    stats = svc.stats()
    assert stats["prefetch_cancelled"] == 1 and stats["cancelled"] == 0


def test_accepting_the_shown_suggestion_does_not_stop_its_prefetch(constant_service, generate_calls):
    svc = constant_service
    _answer_and_hold_its_prefetch(svc, generate_calls, "mem://s.py")
    svc.cancel("mem://s.py")  # the document changed (the editor inserted the suggestion) while it ran
    generate_calls.release.set()
    wait_for(lambda: svc.stats()["prefetched"] >= 1, 60, "the prefetch to finish")
    hit = _submit(svc, "mem://s.py", "x = xxxx", "\n")
    assert hit is not None and hit.source == "prefetch" and hit.text == "xxxx"


def test_closing_the_document_stops_its_running_prefetch_and_keeps_nothing(constant_service, generate_calls):
    svc = constant_service
    _answer_and_hold_its_prefetch(svc, generate_calls, "mem://k.py")
    svc.close_document("mem://k.py")  # while the prefetch of accepting "xxxx" is inside its first step
    generate_calls.release.set()
    wait_for(lambda: generate_calls[1] is not None, 60, "the held prefetch to end")
    assert generate_calls[1].finish == "stopped"  # the old code: it ran on and kept its suggestion
    again = _submit(svc, "mem://k.py", "x = xxxx", "\n")
    assert again is not None and again.source == "model"
    assert svc.stats()["prefetch_hits"] == 0


def test_a_request_answered_without_decoding_lets_a_running_prefetch_go_on(constant_service, generate_calls):
    svc = constant_service
    _answer_and_hold_its_prefetch(svc, generate_calls, "mem://g.py", call=3)
    hit = _submit(svc, "mem://g.py", "x = xxxx", "\n")  # the editor asks after accepting: no decoding needed
    assert hit is not None and hit.source == "prefetch"
    generate_calls.release.set()
    wait_for(lambda: generate_calls[2] is not None, 60, "the second prefetch to end")
    assert generate_calls[2].finish == "length" and svc.stats()["prefetch_cancelled"] == 0


def test_a_change_that_cannot_lead_to_the_prefetched_place_stops_it_and_its_guess_runs(constant_service,
                                                                                        generate_calls):
    svc = constant_service
    _answer_and_hold_its_prefetch(svc, generate_calls, "mem://u.py")
    # the person wrote something else than the suggestion (the editor says where its change ended)
    svc.cancel("mem://u.py")
    svc.expect("mem://u.py", "x = 7\n", 5)
    generate_calls.release.set()
    wait_for(lambda: svc.stats()["guessed"] == 1, 60, "the suggestion at the changed place")
    stats = svc.stats()
    assert generate_calls[1].finish == "stopped" and stats["prefetch_cancelled"] == 1
    assert stats["prefetched"] == 0  # the wish on the next line was dropped, never computed
    hit = _submit(svc, "mem://u.py", "x = 7", "\n")
    assert hit is not None and hit.source == "prefetch" and hit.text == "xxxx"


def _running_prefetch(svc: CompletionService) -> bool:
    """A prefetch (not a guess) is the decoding thread's job now: waiting its debounce, or decoding."""
    job = svc._requests._running
    return job is not None and job.speculative and not job.guess


def test_a_change_right_after_an_answer_stops_its_prefetch_before_it_decodes(tiny_models, generate_calls):
    """The prefetch of accepting an answer waits the debounce like any job: a person who writes on at once (not
    accepting) stops it before its first step, which would otherwise hold the decoder from the new place."""
    svc = _service(tiny_models["random"], debounce_ms=300, debounce_max_ms=0)  # a fixed, long debounce
    try:
        shown = _submit(svc, "mem://w.py", BEFORE, AFTER)
        assert shown is not None and len(generate_calls) == 1
        wait_for(lambda: _running_prefetch(svc), 60, "the prefetch of accepting it waiting its debounce")
        svc.cancel("mem://w.py")
        svc.expect("mem://w.py", BEFORE + "zz" + AFTER, len(BEFORE) + 2)  # wrote on: it can no longer be accepted
        wait_for(lambda: svc.stats()["guessed"] == 1, 60, "the suggestion at the changed place")
        assert len(generate_calls) == 2  # the guess; the prefetch never decoded
        assert svc.stats()["prefetched"] == 0 and svc.stats()["prefetch_cancelled"] == 0
    finally:
        svc.close()


def test_a_pause_after_a_change_has_its_suggestion_ready_before_it_is_asked(tiny_models, generate_calls):
    svc = _service(tiny_models["random"])
    try:
        before, after = PREAMBLE + BEFORE, AFTER
        svc.expect("mem://w.py", before + after, len(before))  # the editor's change ended here; no request yet
        wait_for(lambda: svc.stats()["guessed"] == 1, 60, "the suggestion at the changed place")
        assert len(generate_calls) == 1
        _served_without_decoding(svc, "mem://w.py", before, after, tiny_models["random"])
    finally:
        svc.close()



def _served_without_decoding(svc, doc: str, before: str, after: str, model_folder) -> None:
    """A request at this place is answered inside submit (never queued for the decoder) with the suggestion
    computed before it was asked, which is what decoding would give."""
    future = svc.submit(doc, before + after, len(before)).future
    assert future.done()
    hit = future.result()
    assert hit is not None and hit.source == "prefetch" and (hit.tokens, hit.steps) == (0, 0)
    assert hit.text == greedy(model_folder, before, after, MAX_NEW)
    assert svc.stats()["completions_decoded"] == 0

def test_the_place_of_a_request_just_answered_is_not_guessed_again(tiny_models, generate_calls):
    svc = _service(tiny_models["random"], suggestion_cache_size=0)  # no cache that would make a guess needless
    try:
        assert _submit(svc, "mem://n.py", PREAMBLE + BEFORE, AFTER) is not None
        wait_for(lambda: svc.stats()["prefetched"] == 1, 60, "the prefetch after the answer")
        svc.expect("mem://x.py", "y = ", 4)  # an edit elsewhere: its guess runs after anything left at n.py
        wait_for(lambda: svc.stats()["guessed"] == 1, 60, "the guess at the edit")
        assert len(generate_calls) == 3  # the request, its prefetch, the guess at the edit: none at n.py
    finally:
        svc.close()


def test_a_cursor_the_editor_moved_has_its_suggestion_ready_before_it_is_asked(tiny_models, generate_calls):
    svc = _service(tiny_models["random"])
    try:
        before, after = PREAMBLE + BEFORE, AFTER
        # a file just opened, the person clicked here: no edit tells the server where the request will come
        assert svc.moved("mem://m.py", before + after, len(before))
        wait_for(lambda: svc.stats()["guessed"] == 1, 60, "the suggestion at the cursor")
        stats = svc.stats()
        assert len(generate_calls) == 1 and stats["prewarm_tokens"] > 0
        _served_without_decoding(svc, "mem://m.py", before, after, tiny_models["random"])
    finally:
        svc.close()


def test_a_cursor_at_the_place_last_expected_starts_no_work(tiny_models, generate_calls):
    svc = _service(tiny_models["random"], suggestion_cache_size=0)  # no cache that would make a guess needless
    idle = WorkerIdle(svc)
    try:
        before, after = PREAMBLE + BEFORE, AFTER
        assert _submit(svc, "mem://k.py", before, after) is not None
        wait_for(lambda: svc.stats()["prefetched"] == 1, 60, "the prefetch after the answer")
        # the editor reports the cursor where it asked: the answer is known
        # ... and once the decoding thread has seen that and waits idle, nothing else ran
        assert not idle.after(lambda: svc.moved("mem://k.py", before + after, len(before)))
        assert len(generate_calls) == 2 and svc.stats()["guessed"] == 0
        # an edit, then the cursor the edit left: the edit's guess alone
        svc.expect("mem://k.py", "y = " + before + after, len(before) + 4)
        assert not svc.moved("mem://k.py", "y = " + before + after, len(before) + 4)
        wait_for(lambda: svc.stats()["guessed"] == 1, 60, "the guess at the edit")
        idle.after()  # whatever the edit and the cursor called for is done
        assert len(generate_calls) == 3 and svc.stats()["guessed"] == 1
        # elsewhere in the document: a new place
        assert svc.moved("mem://k.py", "y = " + before + after, 2)
        wait_for(lambda: svc.stats()["guessed"] == 2, 60, "the guess at the cursor")
    finally:
        svc.close()


def test_consecutive_requests_down_a_file_keep_the_start_of_their_prompt(tiny_models, generate_calls):
    svc = _service(tiny_models["random"], prefetch=False, suggestion_cache_size=0)
    try:
        text = "".join(f"def helper_{i}(value):\n    return value * {i}\n\n" for i in range(60))  # > 1,024 tokens
        prefills = []
        for i in range(48):
            text += f"total_{i} = helper_{i % 12}({i})\n"
            filled = svc.stats()["prefill_tokens"]
            _submit(svc, "mem://down.py", text, "")
            prefills.append(svc.stats()["prefill_tokens"] - filled)
        # a line typed costs its own tokens (and the last output's), a moved window the whole prompt: when the whole
        # text no longer fits, then once per quarter of the window typed (~20 of these lines), where the grid alone
        # (a fresh start at each request) moved it every ~7 lines
        assert len([n for n in prefills[1:] if n > 300]) <= 2 and sorted(prefills)[len(prefills) // 2] < 40, prefills
    finally:
        svc.close()


def test_a_guess_is_stopped_by_the_next_change_and_never_served(tiny_models, generate_calls):
    svc = _service(tiny_models["constant"], max_new_tokens=2000, draft_budget=0)
    try:
        generate_calls.hold_at = 1
        svc.expect("mem://v.py", "x = \n", 4)
        assert generate_calls.held.wait(60), "the guess never started"
        svc.cancel("mem://v.py")  # the person typed on
        svc.expect("mem://v.py", "x = y\n", 5)
        generate_calls.release.set()
        wait_for(lambda: generate_calls[0] is not None, 60, "the first guess to stop")
        assert (generate_calls[0].finish, generate_calls[0].steps) == ("stopped", 1)
        svc.update_settings(Settings(**{**svc.settings.__dict__, "max_new_tokens": 4}))
        answer = _submit(svc, "mem://v.py", "x = ", "\n")  # the old place: decoded, not served from the guess
        assert answer is not None and answer.source == "model" and answer.text == "xxxx"
    finally:
        generate_calls.release.set()
        svc.close()


# -- 5. the suggestion cache ----------------------------------------------------------------------------------


def test_the_cache_matches_typed_over_text_and_a_return_to_an_earlier_spot(tiny_models, generate_calls):
    svc = _service(tiny_models["random"], prefetch=False)
    try:
        before, after = PREAMBLE + BEFORE, AFTER
        shown = _submit(svc, "mem://c.py", before, after)
        assert shown is not None and len(shown.text) > 3
        # more suggestions shown elsewhere than type-through keeps: only the cache still holds this one
        for i in range(TYPE_THROUGH_ENTRIES):
            _submit(svc, f"mem://other{i}.py", before, after)
        calls = len(generate_calls)
        typed = _submit(svc, "mem://c.py", before + shown.text[:3], after)
        assert typed is not None and typed.source == "cache" and typed.text == shown.text[3:]
        assert len(generate_calls) == calls
        # typed something else, then deleted back to where the suggestion was shown
        other = _submit(svc, "mem://c.py", before + "zq", after)
        assert other is None or other.source == "model"
        assert len(generate_calls) == calls + 1
        back = _submit(svc, "mem://c.py", before, after)
        assert back is not None and back.source == "cache" and back.text == shown.text
        assert len(generate_calls) == calls + 1 and svc.stats()["cache_hits"] == 2
    finally:
        svc.close()


def test_the_cache_is_bounded_and_keeps_the_recently_used():
    cache = SuggestionCache(2)
    cache.put("d", "a = ", "\n", "one")
    cache.put("d", "b = ", "\n", "two")
    assert cache.match("d", "a = ", "\n") == "one"  # now the most recent
    cache.put("d", "c = ", "\n", "three")
    assert len(cache) == 2 and cache.match("d", "b = ", "\n") is None
    assert cache.match("d", "a = o", "\n") == "ne" and cache.match("d", "c = ", "\n") == "three"
    assert cache.match("d", "a = ", "\nother\n") is None  # another suffix: another place
    assert cache.match("d", "a = one", "\n") is None  # typed all of it: nothing left to show


# -- 6. the time budget -----------------------------------------------------------------------------------------


def test_one_line_when_text_follows_the_cursor_on_its_line(chain_dir):
    svc = _service(chain_dir, max_new_tokens=24, draft_budget=0, time_budget_ms=0, wait_budget_ms=0, prefetch=False,
                   max_lines=0)
    try:
        multi = _submit(svc, "mem://o.py", "x = 0\n", "")
        assert multi is not None and multi.text.count("a = 1") >= 3
        one = _submit(svc, "mem://o.py", "x = 0\n", "  # the rest of the line\n")
        assert one is not None and one.text == "a = 1"
        assert one.tokens < 24  # decoding stopped at the line end, not at the token limit
    finally:
        svc.close()


def test_after_the_time_budget_a_completion_ends_at_the_next_line_end(chain_dir):
    svc = _service(chain_dir, max_new_tokens=24, draft_budget=0, time_budget_ms=0, wait_budget_ms=0, prefetch=False,
                   max_lines=0)
    try:
        unbounded = _submit(svc, "mem://t.py", "x = 0\n", "")
        assert unbounded is not None and unbounded.text.count("\n") >= 3
        svc.update_settings(Settings(**{**svc.settings.__dict__, "time_budget_ms": 500}))
        svc._clock = lambda: float("inf")  # every check comes after the budget: no waiting on the wall clock
        bounded = _submit(svc, "mem://t.py", "y = 0\n", "")
        assert bounded is not None and bounded.text == "a = 1"
        assert bounded.tokens < 24
    finally:
        svc.close()


def test_a_completion_someone_waits_for_ends_at_the_line_end_after_the_wait_budget(chain_dir):
    svc = _service(chain_dir, max_new_tokens=24, draft_budget=0, time_budget_ms=0, wait_budget_ms=0, max_lines=0)
    try:
        svc.expect("mem://b.py", "x = 0\n", 6)  # work begun ahead, nobody waiting: no budget applies
        wait_for(lambda: svc.stats()["guessed"] == 1, 60, "the suggestion at the changed place")
        ahead = _submit(svc, "mem://b.py", "x = 0\n", "")
        assert ahead.source == "prefetch" and ahead.text.count("\n") >= 3
        svc.update_settings(Settings(**{**svc.settings.__dict__, "wait_budget_ms": 50, "prefetch": False}))
        svc._clock = lambda: float("inf")  # every check comes after the budget: no waiting on the wall clock
        waited = _submit(svc, "mem://b.py", "y = 0\n", "")
        assert waited.source == "model" and waited.text == "a = 1" and waited.tokens < 24
    finally:
        svc.close()


def test_a_suggestion_holds_max_lines_lines_whatever_the_clock_says(chain_dir):
    """The default cap of one line sets a suggestion's length by its text alone: a budget that has run out and one
    that never does give the same suggestion, so REST and plain decoding, faster or slower, show the same."""
    svc = _service(chain_dir, max_new_tokens=24, draft_budget=0, prefetch=False)
    try:
        assert svc.settings.max_lines == 1
        free = _submit(svc, "mem://m.py", "x = 0\n", "")
        assert free is not None and free.text == "a = 1" and free.tokens < 24  # stopped at the first line's end
        svc._clock = lambda: float("inf")  # every check comes after both budgets
        late = _submit(svc, "mem://m.py", "y = 0\n", "")
        assert late is not None and late.text == free.text
        svc.update_settings(Settings(**{**svc.settings.__dict__, "max_lines": 2, "time_budget_ms": 0,
                                        "wait_budget_ms": 0}))
        two = _submit(svc, "mem://m.py", "z = 0\n", "")
        assert two is not None and two.text == "a = 1\na = 1"
    finally:
        svc.close()


def test_the_line_budget_keeps_the_whole_lines_once_it_runs_out():
    now = [0.0]
    budget = LineBudget(0.0, 1.0, lambda: now[0])
    assert not budget.stop("a = 1\nb")  # within the budget: the stop rules alone decide
    now[0] = 2.0
    assert budget.stop("a = 1\nb = ")  # ran out in the second line: the first is whole, the second is dropped
    assert budget.cut("a = 1\nb = 2") == "a = 1"
    first = LineBudget(0.0, 1.0, lambda: now[0])
    assert not first.stop("a = ")  # no whole line yet: the first line's end
    assert first.stop("a = 1\nb") and first.cut("a = 1\nb = 2") == "a = 1"
    broken = LineBudget(0.0, 1.0, lambda: now[0])
    assert not broken.stop("\n") and not broken.stop("\n  ")  # a break first: no whole line with text yet
    assert broken.stop("\n  b = 2\n  c") and broken.cut("\n  b = 2\n  c = 3") == "\n  b = 2"
    assert LineBudget(0.0, 0.0, lambda: 99.0).stop("a\nb\nc") is False  # 0: no budget
    later = LineBudget(0.0, 10.0, lambda: now[0])
    later.by(1.0)  # a person began waiting: the earlier deadline counts
    later.by(5.0)  # ... and a later one never moves it back
    assert later.stop("a = 1\nb = 2\nc") and later.cut("a = 1\nb = 2\nc = 3") == "a = 1\nb = 2"


def test_the_debounce_follows_the_typing_speed(tiny_models):
    svc = _service(tiny_models["random"], debounce_ms=20, debounce_max_ms=250)
    try:
        assert svc.stats()["debounce_ms"] == pytest.approx(20)  # no typing seen yet: the configured debounce
        times = iter([100.0 + 0.12 * i for i in range(6)] + [100.65, 200.0, 200.05])
        svc._pace = TypingPace(clock=lambda: next(times))  # the changes' times, not the wall clock's
        for _ in range(6):
            svc.cancel("mem://d.py")  # what the server calls on each change of a document
        assert svc.stats()["debounce_ms"] == pytest.approx(120)
        # what the decoding thread waits 50 ms after the last change: the rest of the debounce
        assert svc._requests._debounce_s() == pytest.approx(0.07)
        svc.cancel("mem://d.py")  # a pause of 99 s is not typing
        svc.cancel("mem://d.py")  # then one quick keystroke
        assert svc.stats()["debounce_ms"] == pytest.approx(120)
    finally:
        svc.close()


def test_the_line_budget_stops_at_a_line_end_when_the_next_line_would_not_fit():
    now = [0.1]
    budget = LineBudget(0.0, 1.0, lambda: now[0])
    assert not budget.stop("a = ")  # the first step's tokens: the first line's clock starts here
    now[0] = 0.3
    assert not budget.stop("a = 1\nb")  # the first line took 0.2 s: a second one fits before the deadline
    now[0] = 0.5
    assert not budget.stop("a = 1\nb = 2")  # no new line end, no new estimate
    now[0] = 0.7
    assert budget.stop("a = 1\nb = 2\nc")  # the second took 0.4 s: a third would end at 1.1 s, past the deadline
    assert budget.cut("a = 1\nb = 2\nc = 3") == "a = 1\nb = 2"  # what running out at 1.0 s would have kept
    two = LineBudget(0.0, 1.0, lambda: now[0])
    now[0] = 0.0
    assert not two.stop("a")
    now[0] = 0.4
    assert not two.stop("a = 1\nb = 2\nc")  # two lines in one step: 0.2 s a line, a third fits
    now[0] = 0.9
    assert two.stop("a = 1\nb = 2\nc = 3\nd") and two.cut("a = 1\nb = 2\nc = 3\nd = 4") == "a = 1\nb = 2\nc = 3"
    late = LineBudget(0.0, 1.0, lambda: now[0])
    now[0] = 0.5
    assert not late.stop("a")  # half the budget went to the debounce and the prompt before the first token ...
    now[0] = 0.6
    assert not late.stop("a = 1\nb")  # ... which the line's time does not count: 0.1 s a line, a second one fits
    assert not LineBudget(0.0, 0.0, lambda: 0.9).stop("a = 1\nb")  # no budget: never


def test_a_gap_with_an_answer_is_not_typing():
    pace = TypingPace(clock=iter((0.0, 0.05, 0.10, 0.29, 0.30, 0.49, 0.50, 0.69, 0.70)).__next__)
    for _ in range(3):
        pace.changed()  # typing: two gaps of 50 ms
    for _ in range(3):
        pace.answered()  # a suggestion went out, the person read it, then wrote on 200 ms later
        pace.changed()
    assert pace.debounce_s(0.02, 0.25) == pytest.approx(0.05)  # counted, the gaps would say 200 ms


def test_a_fast_answer_does_not_lengthen_the_next_wait(tiny_models):
    """A person who asks, reads the answer and writes on: however soon that comes after the answer, it is not typing
    speed, and the next request waits only the configured debounce (the server's own speed must not slow it)."""
    svc = _service(tiny_models["random"], debounce_ms=20, debounce_max_ms=250, prefetch=False)
    try:
        ticks = itertools.count()
        svc._pace = TypingPace(clock=lambda: 100.0 + 0.1 * next(ticks))  # every look at the clock: 100 ms later
        svc.cancel("mem://d.py")
        for i in range(3):
            _submit(svc, "mem://d.py", f"def f{i}(x):\n    return ", "")  # answered (text or nothing)
            svc.cancel("mem://d.py")  # the person writes on, 200 ms after the last change
        assert svc.stats()["debounce_ms"] == pytest.approx(20)
    finally:
        svc.close()


def test_the_debounce_counts_from_the_last_change_or_answer():
    now = [0.0]
    pace = TypingPace(clock=lambda: now[0])
    assert pace.wait_s(0.02, 0.25) == 0.02  # nothing yet: all of it
    pace.changed()
    now[0] = 0.005
    assert pace.wait_s(0.02, 0.25) == pytest.approx(0.015)  # work queued 5 ms after the change waits the rest
    now[0] = 0.05
    assert pace.wait_s(0.02, 0.25) == 0.0  # a warm-up that took longer than the debounce: none left
    pace.answered()
    assert pace.wait_s(0.02, 0.25) == 0.02  # an answer starts it again: the person reads it


def test_the_debounce_is_clamped():
    pace = TypingPace(clock=iter((0.0, 0.001, 0.002, 0.003)).__next__)
    for _ in range(4):
        pace.changed()
    assert pace.debounce_s(0.02, 0.25) == 0.02  # faster than the floor
    slow = TypingPace(clock=iter((0.0, 0.3, 0.6, 0.9)).__next__)
    for _ in range(4):
        slow.changed()
    assert slow.debounce_s(0.02, 0.25) == 0.02  # every gap is a pause for this ceiling
    assert slow.debounce_s(0.02, 0.5) == pytest.approx(0.3)
    assert slow.debounce_s(0.02, 0.01) == 0.02  # ceiling below the floor: fixed


# -- end to end: a prefetch through the real server ------------------------------------------------------------


async def test_accepting_a_suggestion_is_answered_by_the_prefetch_over_lsp(tiny_models, tmp_path):
    options = {"model": str(tiny_models["random"]), "dtype": "float32", "maxNewTokens": MAX_NEW, "debounceMs": 0,
               "indexWorkspace": False}
    client, _ = await start(server_command(), tmp_path, "visual-studio-code", options)
    try:
        async def stats():
            return await command(client, "rest-lsp.stats")

        assert await wait_until(lambda: _ready(stats), timeout=120), "the model did not load"
        uri = (tmp_path / "a.py").as_uri()
        open_doc(client, uri, BEFORE + AFTER)
        line, col = 3, len("result = add(")
        first = await inline(client, uri, line, col)
        assert len(first.items) == 1
        text = first.items[0].insert_text
        assert "\n" not in text  # one line: the position after it is on the same line

        async def prefetched():
            return (await stats())["prefetched"] >= 1

        assert await wait_until(prefetched, timeout=60), "the prefetch never ran"
        decoded = (await stats())["completions_decoded"]
        # the editor inserts the suggestion, tells the server it was accepted, and asks again after it
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line, col), end=types.Position(line, col)), text=text)]))
        await command(client, "rest-lsp.accept", first.items[0].command.arguments[0])
        second = await inline(client, uri, line, col + len(text.encode("utf-16-le")) // 2)
        s = await stats()
        assert s["prefetch_hits"] == 1 and s["completions_decoded"] == decoded, s
        expected = greedy(tiny_models["random"], BEFORE + text, AFTER, MAX_NEW)
        assert [i.insert_text for i in second.items] == ([expected] if expected else [])
    finally:
        await client.shutdown_session()


async def _ready(stats) -> bool:
    return (await stats())["ready"]


def test_the_latency_settings_from_the_editor_and_the_command_line():
    import argparse

    from rest_lsp import settings as settings_module

    s, errors = Settings().update({"timeBudgetMs": 300, "debounceMaxMs": 400, "suggestionCacheSize": 10,
                                   "prefetch": False, "waitBudgetMs": 100})
    assert not errors
    assert (s.time_budget_ms, s.debounce_max_ms, s.suggestion_cache_size, s.prefetch) == (300, 400, 10, False)
    assert s.wait_budget_ms == 100
    kept, errors = s.update({"timeBudgetMs": -1, "prefetch": "no", "suggestionCacheSize": 1.5})
    assert kept == s and len(errors) == 3
    parser = argparse.ArgumentParser()
    settings_module.add_arguments(parser)
    args = parser.parse_args(["--time-budget-ms", "0", "--debounce-max-ms", "100", "--suggestion-cache-size", "0",
                              "--no-prefetch", "--wait-budget-ms", "0"])
    cli = Settings.from_args(args)
    assert cli.wait_budget_ms == 0
    assert (cli.time_budget_ms, cli.debounce_max_ms, cli.suggestion_cache_size, cli.prefetch) == (0, 100, 0, False)
    assert Settings.from_args(parser.parse_args([])).prefetch is True


def test_the_prefetch_places_are_after_the_accepted_text_and_on_the_next_line():
    from rest_lsp.service.suggestion_cache import Prefetch

    prefetch = Prefetch()
    prefetch.want("d", "def f(x):\n    ", "\n", "if x:")
    assert prefetch.take_wanted() == ("d", "def f(x):\n    if x:", "\n")
    assert prefetch.take_wanted() == ("d", "def f(x):\n    if x:\n        ", "\n")  # Enter after an opener
    assert prefetch.take_wanted() is None
    prefetch.want("d", "y = f(", ")\n", "1, 2")  # mid-line: only the end of the accepted text
    assert prefetch.take_wanted() == ("d", "y = f(1, 2", ")\n") and prefetch.take_wanted() is None


@pytest.mark.parametrize("covered", [True, False], ids=["a-pass-covers-the-debounce", "a-longer-debounce"])
def test_an_edits_tokens_ride_the_first_pass_of_its_guess_when_that_pass_covers_the_debounce(
        tiny_models, generate_calls, monkeypatch, covered):
    """After an edit the warm-up leaves the few tokens it added to the guess, whose first pass computes them with
    the first drafts on top (one pass instead of two) and starts at once, when what is left of the debounce is no
    longer than any pass takes here: the pass covers it, as the warm-up's own pass did. With a longer debounce
    left, the warm-up computes them and the guess waits the debounce. The suggestion is the same either way."""
    model = tiny_models["random"]
    debounce_s = 3.0
    svc = _service(model, suggestion_cache_size=0, debounce_ms=int(debounce_s * 1e3),
                   debounce_max_ms=int(debounce_s * 1e3))
    try:
        doc, before = "mem://e.py", PREAMBLE + BEFORE
        assert _submit(svc, doc, before, AFTER) is not None  # the decoder has timed its passes
        wait_for(lambda: svc.stats()["prefetched"] == 1, 60, "the prefetch after the answer")
        WorkerIdle(svc).after()  # the warm-up at the place just answered (nothing to compute) is over
        if covered:  # a machine where a pass takes longer than the debounce
            monkeypatch.setattr(Decoder, "shortest_pass_s", lambda decoder: 2 * debounce_s)
        warmed = svc.stats()["prewarm_tokens"]
        edited = before + "1, 2"
        # the jobs the decoding thread ran, and the debounce each waited before it ran (none: it started at once)
        jobs, waited = [], []
        queue = svc._requests
        run, debounce = queue._run, queue._debounce_s
        monkeypatch.setattr(queue, "_run", lambda job: (jobs.append(job), run(job))[1])
        monkeypatch.setattr(queue, "_debounce_s",
                            lambda: (waited.append((queue._running, debounce())), waited[-1][1])[1])
        svc.cancel(doc)  # what the server does at a change (the debounce counts from it), then where it was
        svc.expect(doc, edited + AFTER, len(edited))
        wait_for(lambda: svc.stats()["guessed"] == 1, 60, "the guess at the edit")
        guess = generate_calls[-1]
        added = svc.stats()["prewarm_tokens"] - warmed
        guesses = [job for job in jobs if job.guess]
        assert len(guesses) == 1
        waits = [w for job, w in waited if job is guesses[0]]
        if covered:  # the guess's first pass computed the edit, at once: it waited no debounce
            assert added == 0 and guess.prefill_tokens > 0 and guesses[0].at_once and waits == []
        else:  # the warm-up did, and the guess waited what was left of the debounce
            assert added > 0 and guess.prefill_tokens == 0 and not guesses[0].at_once
            assert len(waits) == 1 and 0 < waits[0] <= debounce_s
        hit = svc.submit(doc, edited + AFTER, len(edited)).future
        assert hit.done() and hit.result().source == "prefetch"
        assert hit.result().text == greedy(model, edited, AFTER, MAX_NEW)
    finally:
        svc.close()
