"""The segment's lookup tables and the two ways of gathering continuations, against plain recomputation."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rest_lsp.datastore import Datastore, Source
from rest_lsp.datastore import store as store_module
from rest_lsp.datastore.segment import SEP_ID, build_segment, spread


@pytest.mark.parametrize("vocab", [3, 40, 2**32 - 2])
def test_pair_table_holds_exactly_the_rows_of_each_leading_pair(vocab):
    rng = random.Random(vocab)
    docs = [(f"d{i}", np.array([rng.randrange(vocab) for _ in range(rng.randint(0, 300))], dtype=np.uint32), 3)
            for i in range(20)]
    seg = build_segment(docs)
    rev = seg.tokens[::-1].tolist()
    n = seg.n
    first_two = [tuple(rev[s:s + 2]) for s in seg.rsa.tolist()]        # per row, in suffix array order
    pair_starts, pair_tokens = seg.pair_starts.tolist(), seg.pair_tokens.tolist()
    assert pair_starts[0] == 0 and pair_starts[-1] == n
    assert all(a < b for a, b in zip(pair_starts, pair_starts[1:]))
    for k, t in enumerate(seg.bucket_tokens.tolist()):
        if t == SEP_ID:
            continue                   # no query token is SEP, so its bucket is never searched
        lo, hi = int(seg.bucket_starts[k]), int(seg.bucket_starts[k + 1])
        a, b = int(seg.bucket_pairs[k]), int(seg.bucket_pairs[k + 1])
        assert pair_starts[a] == lo and pair_starts[b] == hi
        seconds = pair_tokens[a:b]
        assert seconds == sorted(set(seconds))               # ascending and distinct within the bucket
        for j in range(a, b):
            rows = first_two[pair_starts[j]:pair_starts[j + 1]]
            assert set(rows) == {(t, pair_tokens[j])}
        assert {p for p in first_two[lo:hi]} == {(t, s) for s in seconds}


def _store(rng: random.Random, weights: dict) -> Datastore:
    ds = Datastore(max_suffix=6, continuation_length=5, max_matches=60, background_merges=False, weights=weights)
    sources = list(Source)
    for batch in range(8):
        # Few distinct tokens and repeated phrases: many occurrences, ties and documents ending mid-continuation.
        ds.apply([(f"d{batch}-{i}", [t for _ in range(rng.randint(0, 30))
                                     for t in rng.choice([[1, 2, 3], [1, 2, 4], [5], [1, 2, 3, 5]])],
                   rng.choice(sources)) for i in range(5)])
        ds.remove(f"d{batch}-{batch % 5}")      # a tombstone in every segment
    return ds


def test_python_and_numpy_gathering_give_the_same_lists_in_the_same_order(monkeypatch):
    rng = random.Random(5)
    ds = _store(rng, {Source.WORKSPACE: 0.1, Source.OPEN_BUFFER: 0.7})     # inexact float sums too
    contexts = [[rng.choice([1, 2, 3, 4, 5]) for _ in range(rng.randint(1, 7))] for _ in range(150)]
    assert len(ds.segments()) > 1 and not all(s.all_live for s in ds.segments())
    results = {}
    for python_rows in (0, 10**9):
        monkeypatch.setattr(store_module, "PYTHON_ROWS", python_rows)
        results[python_rows] = [(ds.continuations(c), ds.lookup(c), ds.lookup(c, limit=2)) for c in contexts]
    assert results[0] == results[10**9]
    assert any(len(r[1].continuations) > 3 for r in results[0])        # the comparison saw real groups


def test_a_list_of_ints_and_other_sequences_of_token_ids_give_the_same_answer():
    ds = Datastore(background_merges=False)
    ds.put("a", [1, 2, 3, 1, 2, 4])
    want = ds.lookup([1, 2])
    assert want.match_length == 2 and sorted(want.continuations) == [((3, 1, 2, 4), 1), ((4,), 1)]
    for same in ((1, 2), np.array([1, 2]), np.array([1, 2], dtype=np.uint32), [np.int64(1), np.int64(2)]):
        assert ds.lookup(same) == want
    for bad in ([1, 2.0], [True], [1, -2], [2**32 - 1], [2**70], [], np.zeros((1, 2), dtype=int)):
        assert ds.lookup(bad).match_length == 0 and ds.continuations(bad) == []


def test_costly_results_are_reused_only_while_the_index_is_unchanged():
    ds = Datastore(background_merges=False, continuation_length=3)
    ds.put("a", [1, 2, 3] * 40)                 # 40 occurrences of [1]: the cached (numpy) path
    first = ds.continuations([1])
    assert first == [((2, 3, 1), 39.0), ((2, 3), 1.0)]
    first.clear()                               # a caller's list is its own
    assert ds.continuations([1]) == [((2, 3, 1), 39.0), ((2, 3), 1.0)]
    assert ds.lookup([1]).continuations == [((2, 3, 1), 39), ((2, 3), 1)]
    ds.put("b", [1, 5] * 50, Source.CURRENT_FILE)
    assert ds.continuations([1])[:2] == [((5, 1, 5), 8.0 * 49), ((2, 3, 1), 39.0)]
    ds.remove("b")
    assert ds.lookup([1]).continuations == [((2, 3, 1), 39), ((2, 3), 1)]


def test_spread_samples_the_same_rows_as_linspace():
    rng = random.Random(11)
    for _ in range(3000):
        size = rng.choice([rng.randint(2, 3000), rng.randint(2, 10**8)])
        limit = rng.randint(1, min(size - 1, 1100))
        assert np.array_equal(spread(size, limit), np.linspace(0, size - 1, limit).astype(np.int64)), (size, limit)
