"""Datastore queries against a brute-force scan of the same live documents."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings, strategies as st

from rest_lsp.datastore import Datastore, Source


def brute_force(docs: dict[str, list[int]], context: list[int], max_suffix: int, length: int):
    context = context[-max_suffix:]
    for k in range(len(context), 0, -1):
        pattern, found, counts = context[-k:], False, {}
        for toks in docs.values():
            for i in range(len(toks) - k + 1):
                if toks[i:i + k] == pattern:
                    found = True
                    cont = tuple(toks[i + k:i + k + length])
                    if cont:
                        counts[cont] = counts.get(cont, 0) + 1
        if found:
            return k, sorted(counts.items())
    return 0, []


def check(ds: Datastore, docs: dict[str, list[int]], context: list[int]) -> None:
    got = ds.lookup(context)
    assert (got.match_length, sorted(got.continuations)) == brute_force(docs, context, ds.max_suffix,
                                                                        ds.continuation_length)
    assert all(a[1] >= b[1] for a, b in zip(got.continuations, got.continuations[1:]))


operations = st.lists(st.tuples(st.sampled_from(["put", "put", "put", "remove", "merge"]),
                                st.integers(0, 5), st.lists(st.integers(0, 6), max_size=60)),
                      min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(ops=operations, contexts=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=9), min_size=1, max_size=8))
def test_matches_brute_force_after_puts_removes_and_merges(ops, contexts):
    ds = Datastore(max_suffix=6, continuation_length=4, max_matches=10**9, background_merges=False)
    docs: dict[str, list[int]] = {}
    for op, n, toks in ops:
        doc_id = f"doc{n}"
        if op == "put":
            ds.put(doc_id, toks)
            docs[doc_id] = toks
        elif op == "remove":
            ds.remove(doc_id)
            docs.pop(doc_id, None)
        else:
            ds.merge_all()
    for context in contexts:
        check(ds, docs, context)
    for toks in list(docs.values())[:3]:      # contexts that certainly occur, so long matches are exercised
        for end in range(1, len(toks) + 1, 7):
            check(ds, docs, toks[max(0, end - 9):end])


def test_matches_brute_force_on_larger_random_corpora():
    rng = random.Random(7)
    for vocab in (4, 50, 70_000, 2**32 - 2):          # ids above 65,535 must survive (no u16 truncation)
        ds = Datastore(max_suffix=8, continuation_length=6, max_matches=10**9, background_merges=False)
        docs = {}
        for i in range(30):
            toks = [rng.randrange(vocab) for _ in range(rng.randint(0, 400))]
            docs[f"d{i}"] = toks
            ds.put(f"d{i}", toks)
        for i in range(0, 30, 4):
            ds.remove(f"d{i}")
            docs.pop(f"d{i}")
        for _ in range(60):
            toks = rng.choice(list(docs.values()))
            end = rng.randint(1, max(1, len(toks)))
            context = toks[max(0, end - 10):end] or [rng.randrange(vocab)]
            if rng.random() < 0.3:
                context = context + [rng.randrange(vocab)]
            check(ds, docs, context)


def test_never_crosses_a_document_boundary_and_replaced_text_is_gone():
    ds = Datastore(background_merges=False)
    ds.put("a", [1, 2, 3])
    ds.put("b", [4, 5])
    assert ds.lookup([3]).match_length == 1 and ds.lookup([3]).continuations == []
    ds.put("a", [1, 2, 9])
    assert ds.lookup([1, 2]).continuations == [((9,), 1)]
    ds.remove("a")
    assert ds.lookup([1, 2]).match_length == 0
    assert ds.stats()["documents"] == 1 and ds.stats()["tokens"] == 2


def test_merge_keeps_results_identical_and_drops_dead_documents():
    rng = random.Random(3)
    ds = Datastore(background_merges=False)
    docs = {f"d{i}": [rng.randrange(20) for _ in range(300)] for i in range(12)}
    for d, toks in docs.items():
        ds.put(d, toks)
    for d in ("d1", "d5"):
        ds.remove(d)
    contexts = [[rng.randrange(20) for _ in range(rng.randint(1, 5))] for _ in range(50)]
    before = [ds.lookup(c) for c in contexts]
    assert len(ds.segments()) == 10
    ds.merge_all()
    assert len(ds.segments()) == 1 and ds.segments()[0].all_live
    assert [ds.lookup(c) for c in contexts] == before


def test_weights_follow_the_source_and_cap_limits_work():
    ds = Datastore(background_merges=False, max_matches=4, max_continuations=2)
    ds.put("w", [1, 2] * 10)
    ds.put("cur", [1, 3], Source.CURRENT_FILE)
    conts = ds.continuations([1])
    assert len(conts) == 2
    weights = dict(conts)
    assert weights[(3,)] == Source.CURRENT_FILE.default_weight
    assert sum(c for _, c in ds.lookup([1]).continuations) <= 5


def test_bad_input_is_one_clear_error_and_loses_nothing():
    ds = Datastore(background_merges=False)
    ds.put("a", [1, 2])
    with pytest.raises(ValueError, match="token ids"):
        ds.put("b", [1, -4])
    with pytest.raises(ValueError, match="token ids"):
        ds.put("b", [2**32 - 1])
    assert ds.lookup([1]).continuations == [((2,), 1)]
    assert ds.continuations([]) == [] and ds.continuations([-1]) == [] and ds.continuations([2**40]) == []


def test_background_merges_while_queries_run_see_whole_changes_only():
    ds = Datastore(merge_factor=2)
    stop = threading.Event()
    errors = []

    reads = []

    def reader():
        try:
            while not stop.is_set():
                # "x" always holds either [7, 8, 8, 8] or [7, 9, 9, 9]: never both, never neither.
                got = ds.lookup([7]).continuations
                reads.append(1)
                if got not in ([((8, 8, 8), 1)], [((9, 9, 9), 1)]):
                    errors.append(got)
        except BaseException as err:     # an exception would end the thread silently: make it fail the test
            errors.append(err)

    ds.put("x", [7, 8, 8, 8])
    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(300):
        ds.apply([("x", [7, 9, 9, 9] if i % 2 else [7, 8, 8, 8], Source.WORKSPACE), (f"f{i}", [1] * 50, Source.WORKSPACE)])
    stop.set()
    for t in threads:
        t.join()
    assert ds.wait_for_merges(30)
    ds.close()
    assert not errors
    assert reads, "the readers never read"
    assert len(ds.segments()) < 20
    assert ds.stats()["documents"] == 301
