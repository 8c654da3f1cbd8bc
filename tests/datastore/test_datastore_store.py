"""Datastore queries against a brute-force scan of the same live documents; tombstones, capped sampling, invalid
ids, merges that fail or end with close()."""

from __future__ import annotations

import gc
import random
import threading
import weakref

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rest_lsp.datastore import Datastore, Source
from rest_lsp.datastore import store as store_module
from rest_lsp.datastore.segment import MAX_TOKEN_ID, SEP_ID

WAIT_S = 20.0  # for a merge thread; generous, as the suite shares its cores


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
    try:
        for i in range(300):
            ds.apply([("x", [7, 9, 9, 9] if i % 2 else [7, 8, 8, 8], Source.WORKSPACE),
                      (f"f{i}", [1] * 50, Source.WORKSPACE)])
    finally:
        stop.set()
        for t in threads:
            t.join()
    try:
        assert ds.wait_for_merges(30)
    finally:
        ds.close()  # even when it fails: its merge thread must not run on into the next test's patches
    assert not errors
    assert reads, "the readers never read"
    assert len(ds.segments()) < 20
    assert ds.stats()["documents"] == 301


def assert_consistent(ds: Datastore) -> None:
    """The document table, the stats and what queries can reach agree."""
    live = [d for s in ds.segments() for i, d in enumerate(s.doc_ids) if s.live[i]]
    assert len(live) == len(set(live)), "a document is live twice"
    assert set(live) == set(ds.doc_ids())
    assert ds.stats()["documents"] == len(live)
    assert len({s.name for s in ds.segments()}) == len(ds.segments()), "two segments share a name"


def test_one_live_match_among_many_deleted_ones_is_found():
    for x in range(1000, 1016):         # the layouts where the live row fell between the sample's picks
        ds = Datastore(background_merges=False)
        dead_doc = [t for p in range(10, 2010) if p != x for t in (p, 1, 2, 3)]     # ~2,000 occurrences of [1, 2]
        filler = list(range(3000, 3300)) * 40
        ds.apply([("dead.py", dead_doc, Source.WORKSPACE), ("live.py", [x, 1, 2, 4, 5], Source.WORKSPACE),
                  ("filler.py", filler, Source.WORKSPACE)])
        ds.remove("dead.py")
        assert ds.lookup([1, 2]).continuations == [((4, 5), 1)], x
        assert ds.continuations([1, 2]) == [((4, 5), 1.0)], x


def test_a_merge_that_keeps_failing_backs_off(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(store_module, "_clock", lambda: now[0])
    attempts = threading.Semaphore(0)
    count = []
    real = store_module.build_segment

    def failing(docs, name=None):
        if len(docs) > 1:
            count.append(1)
            attempts.release()
            raise MemoryError("pretend")
        return real(docs, name)

    monkeypatch.setattr(store_module, "build_segment", failing)
    ds = Datastore(merge_factor=2)
    try:
        ds.put("a", [1, 2])
        ds.put("b", [3, 4])
        assert attempts.acquire(timeout=WAIT_S), "no merge was tried"
        # The clock stands still: the merge thread waits, it does not try again.
        assert ds.wait_for_merges(WAIT_S)
        assert ds._retry_at == 1000.0 + store_module.MERGE_RETRY_S and len(count) == 1
        with ds._lock:                            # time passes: one more try, then twice the wait
            now[0] = ds._retry_at
            ds._merge_wanted.notify_all()
        assert attempts.acquire(timeout=WAIT_S), "the merge was not tried again once its back-off ended"
        assert ds.wait_for_merges(WAIT_S)
        assert ds._retry_at == now[0] + 2 * store_module.MERGE_RETRY_S and len(count) == 2
        assert ds.lookup([1]).continuations == [((2,), 1)]        # nothing lost
    finally:
        ds.close()


def test_merge_all_and_wait_for_merges_return_after_close():
    ds = Datastore(merge_factor=2)
    ds.close()
    ds.put("a", [1, 2])
    ds.put("b", [3, 4])
    assert ds.wait_for_merges(WAIT_S)
    t = threading.Thread(target=ds.merge_all, daemon=True)
    t.start()
    t.join(WAIT_S)
    assert not t.is_alive(), "merge_all() blocked after close()"
    assert ds.lookup([3]).continuations == [((4,), 1)]


def test_the_merge_thread_lets_go_of_its_inputs():
    ds = Datastore(merge_factor=2)
    try:
        ds.put("a", np.arange(5000) % 500)
        ds.put("b", np.arange(5000) % 499)
        assert ds.wait_for_merges(WAIT_S)
        refs = [weakref.ref(s) for s in ds.segments()]
        ds.put("c", np.arange(5000) % 498)
        ds.put("d", np.arange(5000) % 497)
        assert ds.wait_for_merges(WAIT_S)
        gc.collect()
        assert len(ds.segments()) == 1
        assert all(r() is None for r in refs), "a merged-away segment is still referenced"
    finally:
        ds.close()


def test_a_context_holding_an_invalid_id_matches_on_its_valid_suffix():
    ds = Datastore(background_merges=False)
    ds.put("m", [5, MAX_TOKEN_ID, 6])
    ds.put("n", [7, 5, 9])
    assert ds.lookup([5, SEP_ID, 7, 5]).match_length == 2
    assert ds.lookup([5, SEP_ID, 7, 5]).continuations == [((9,), 1)]
    assert ds.lookup(np.array([1, -1, 7], dtype=np.int64)).match_length == 1
    assert ds.lookup([3, 2**40]) == ds.lookup([SEP_ID]) == ds.lookup([]) and ds.lookup([]).match_length == 0
    assert {c for c, _ in ds.continuations([9, SEP_ID, 5])} == {(MAX_TOKEN_ID, 6), (9,)}


def test_old_accepted_documents_can_be_bounded():
    ds = Datastore(background_merges=False)
    ds.put("file.py", [9, 9])
    for i in range(1, 11):
        ds.put(f"accepted:{i}", [100 + i, 1], Source.ACCEPTED)
    ds.put("accepted:2", [102, 2], Source.ACCEPTED)      # put again: now the newest
    assert ds.remove_oldest("accepted:", keep=3) == 7
    assert sorted(d for d in ds.doc_ids() if d.startswith("accepted:")) == ["accepted:10", "accepted:2",
                                                                             "accepted:9"]
    assert "file.py" in ds and ds.lookup([103]).match_length == 0 and ds.lookup([102]).continuations == [((2,), 1)]
    assert ds.remove_oldest("accepted:", keep=3) == 0
    assert_consistent(ds)


def _true_counts(docs: dict[str, list[int]], pattern: list[int], length: int) -> dict[tuple[int, ...], int]:
    k, counts = len(pattern), {}
    for t in docs.values():
        for i in range(len(t) - k + 1):
            if t[i:i + k] == pattern and t[i + k:i + k + length]:
                c = tuple(t[i + k:i + k + length])
                counts[c] = counts.get(c, 0) + 1
    return counts


@pytest.mark.parametrize("seed", range(6))
def test_capped_sampling_returns_real_continuations_in_proportion(seed):
    """With `max_matches` as shipped, many occurrences are sampled: every continuation returned exists, about
    the cap are read, and each continuation's share of the sample is close to its share of all live ones,
    across segments with few and many tombstones."""
    rng = random.Random(seed)
    ds = Datastore(background_merges=False, continuation_length=1)
    cap = ds.max_matches
    docs: dict[str, list[int]] = {}
    # Occurrences of [1, 2], followed by 10 + j, in three segments that each favour their own continuation;
    # 16 of the first segment's 20 documents are deleted later, 4 of the second's 8, none of the third's 4.
    for seg, n_docs in enumerate((20, 8, 4)):
        weights = [12 if j == seg else 1 for j in range(5)]
        batch = []
        for d in range(n_docs):
            t = []
            for _ in range(rng.randint(60, 120)):
                t += [rng.randrange(50, 60), 1, 2, 10 + rng.choices(range(5), weights=weights)[0]]
            batch.append((f"s{seg}d{d}", t, Source.WORKSPACE))
            docs[f"s{seg}d{d}"] = t
        ds.apply(batch)
    for seg, deleted in ((0, 16), (1, 4)):
        for d in rng.sample(range(20 if seg == 0 else 8), deleted):
            ds.remove(f"s{seg}d{d}")
            docs.pop(f"s{seg}d{d}")
    truth = _true_counts(docs, [1, 2], 1)
    total = sum(truth.values())
    assert total > 3 * cap                                     # the cap is in force
    got = ds.lookup([1, 2])
    assert got.match_length == 2
    sampled = dict(got.continuations)
    n = sum(sampled.values())
    assert set(sampled) <= set(truth)                          # everything returned exists
    assert cap * 0.9 <= n <= cap + len(ds.segments())          # about the cap, never much more
    for cont, count in truth.items():
        p = count / total
        # An even spread over rows sorted by what precedes them samples like a random draw, or better.
        assert abs(sampled.get(cont, 0) / n - p) <= 4 * (p * (1 - p) / n) ** 0.5 + 2 / n, (cont, sampled, truth)


def test_installing_a_segment_whose_name_is_taken_gives_it_a_name_of_its_own():
    from rest_lsp.datastore.segment import build_segment

    a = build_segment([("a1", np.array([1, 2], dtype=np.uint32), 3), ("b1", np.array([3, 4], dtype=np.uint32), 3)])
    ds = Datastore(background_merges=False)
    ds.install([a.without([1])])                   # root A's copy: b1 is not A's
    ds.install([a.without([0])])                   # root B's copy of the same file, same name
    assert_consistent(ds)
    assert ds.lookup([1]).continuations == [((2,), 1)] and ds.lookup([3]).continuations == [((4,), 1)]
    ds.remove("a1")
    assert ds.lookup([1]).match_length == 0 and ds.lookup([3]).continuations == [((4,), 1)]
    ds.merge_all()
    assert ds.lookup([3]).continuations == [((4,), 1)]
    assert_consistent(ds)
