"""A request for exactly the text and cursor that a prefetch or a guess is computing joins it while it runs (README,
`prefetch`): it gets that computation's answer, and nothing decodes a second time for it."""

from test_latency import _answer_and_hold_its_prefetch, _service, constant_service, generate_calls  # noqa: F401


def test_a_request_for_the_place_a_prefetch_is_computing_joins_it(constant_service, generate_calls):
    svc = constant_service
    # "xxxx" shown after "x = "; the prefetch of accepting it (call 2, at "x = xxxx") is held in its first step
    _answer_and_hold_its_prefetch(svc, generate_calls, "mem://j.py")
    ticket = svc.submit("mem://j.py", "x = xxxx\n", len("x = xxxx"))  # the editor asks there after accepting
    assert not ticket.future.done()  # not known yet: the prefetch is still computing it
    generate_calls.release.set()
    joined = ticket.future.result(60)
    assert joined is not None and joined.text == "xxxx"
    assert generate_calls[1].finish == "length"  # the prefetch ran to its end, not stopped for the request
    stats = svc.stats()
    assert stats["completions_decoded"] == 1 and stats["prefetched"] >= 1  # the first answer's decode only


def test_a_request_for_the_place_a_guess_is_computing_joins_it(tiny_models, generate_calls):
    svc = _service(tiny_models["constant"], max_new_tokens=4, draft_budget=0)
    try:
        generate_calls.hold_at = 1
        svc.expect("mem://g.py", "y = \n", 4)  # an edit ended here: its suggestion is guessed before a request
        assert generate_calls.held.wait(60), "the guess never started"
        ticket = svc.submit("mem://g.py", "y = \n", 4)
        assert not ticket.future.done()
        generate_calls.release.set()
        joined = ticket.future.result(60)
        assert joined is not None and joined.text == "xxxx"
        assert len(generate_calls) >= 1 and generate_calls[0].finish == "length"
        stats = svc.stats()
        assert stats["completions_decoded"] == 0 and stats["guessed"] == 1
    finally:
        generate_calls.release.set()
        svc.close()
