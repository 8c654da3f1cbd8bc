"""Regressions of issue 14: bugs that lost or corrupted what the index holds, each reproduced here first."""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import random
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
from test_datastore_workspace import (WAIT_S, Changes, built_with_changes, byte_tokenize, follows, make_index,
                                     start_watching_caught_up, toks, write_whole)

from rest_lsp.datastore import Datastore, Source, WorkspaceIndex
from rest_lsp.datastore import indexer as indexer_module
from rest_lsp.datastore import scan as scan_module
from rest_lsp.datastore import store as store_module
from rest_lsp.datastore.segment import MAX_TOKEN_ID, SEP_ID


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve(), tmp_path / "cache"


def assert_consistent(ds: Datastore) -> None:
    """The document table, the stats and what queries can reach agree."""
    live = [d for s in ds.segments() for i, d in enumerate(s.doc_ids) if s.live[i]]
    assert len(live) == len(set(live)), "a document is live twice"
    assert set(live) == set(ds.doc_ids())
    assert ds.stats()["documents"] == len(live)
    assert len({s.name for s in ds.segments()}) == len(ds.segments()), "two segments share a name"


# --- 1. multi-root workspaces --------------------------------------------------------------------------------
def test_two_roots_in_one_datastore_keep_both_roots_over_restarts_and_merges(tmp_path):
    ra, rb, cache = tmp_path / "A", tmp_path / "B", tmp_path / "cache"
    ra.mkdir()
    rb.mkdir()
    for i in range(30):
        (ra / f"a{i}.txt").write_text(f"AMARK{i:02d} " + "y" * 40 + "\n")
        (rb / f"b{i}.txt").write_text(f"BMARK{i:02d} " + "x" * 40 + "\n")

    def start(ds):
        ia = WorkspaceIndex(ra, ds, byte_tokenize, "b", cache_dir=cache)
        ib = WorkspaceIndex(rb, ds, byte_tokenize, "b", cache_dir=cache)
        ia.build()
        ib.build()
        return ia, ib

    def check(ds):
        assert follows(ds, "AMARK07") == {" yyyyyyyyy"}
        assert follows(ds, "BMARK05") == {" xxxxxxxxx"}
        assert_consistent(ds)
        assert ds.stats()["documents"] == 60

    ds = Datastore(background_merges=False)
    ia, ib = start(ds)
    ds.merge_all()                       # one segment holding both roots' documents, saved into both folders
    ia._dirty = ib._dirty = True
    ia.save()
    ib.save()
    ds.close()
    for _ in range(2):                   # restart, merge, save, restart again
        ds = Datastore(background_merges=False)
        ia, ib = start(ds)
        check(ds)
        ds.merge_all()
        check(ds)
        ia._dirty = ib._dirty = True
        ia.save()
        ib.save()
        ds.close()


# --- 2. open buffers are not the disk ------------------------------------------------------------------------
def test_an_unsaved_buffer_is_never_saved_as_the_file(ws):
    root, cache = ws
    f, g = root / "main.py", root / "other.py"
    f.write_text("DISKTEXT saved on disk\n")
    g.write_text("other\n")
    index, ds = make_index(root, cache)
    index.build()
    ds.put(str(f), toks("DISKTEXT unsaved buffer edit\n"), Source.OPEN_BUFFER)   # what the service does
    g.write_text("other changed\n")
    index._on_paths({str(g)})
    index.stop()                                                                 # saves

    index2, ds2 = make_index(root, cache)
    stats = index2.build()
    assert stats["reindexed"] == 1                  # the file is read from the disk again
    assert follows(ds2, "DISKTEXT") == {" saved o"}
    seg, i = next((s, i) for s in ds2.segments() for i, d in enumerate(s.doc_ids) if d == str(f) and s.live[i])
    assert seg.sources[i] == Source.WORKSPACE.value
    assert index2.owns(str(f))


# --- 3. no change lost during the first build ----------------------------------------------------------------
def test_a_change_made_while_the_first_build_runs_is_indexed_once_watching_starts(ws):
    root, cache = ws
    f = root / "a.txt"
    f.write_text("KEY old\n")
    calls = []

    def tokenize(texts):
        if not calls:                   # a formatter or a checkout rewrites the file while the build tokenizes
            f.write_text("KEY new content\n")
        calls.append(1)
        return byte_tokenize(texts)

    changes = Changes()
    ds = Datastore(background_merges=False, continuation_length=8)
    index = WorkspaceIndex(root, ds, tokenize, "b", cache_dir=cache, on_change=changes)
    index.build()
    assert follows(ds, "KEY") == {" old\n"}
    changes.seen.clear()
    index.start_watching()              # the service's order: build, then watch
    try:
        changes.wait_for(f)
        assert follows(ds, "KEY") == {" new con"}
    finally:
        index.stop()


# --- 4. a folder replaced by a file or a symlink in one batch --------------------------------------------------
@pytest.mark.parametrize("replacement", ["file", "symlink inside", "symlink outside"])
def test_a_folder_replaced_in_one_batch_takes_its_files_out(ws, replacement):
    root, cache = ws
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "a.txt").write_text("UNIQUEMARKER alpha\n")
    (root / "d" / "sub" / "b.txt").write_text("SUBMARKER beta\n")
    (root / "keep").mkdir()
    (root / "keep" / "k.txt").write_text("KEEPMARKER kept\n")
    index, ds = make_index(root, cache, persist=False)
    index.build()
    os.rename(root / "d", root.parent / "moved_out")
    if replacement == "file":
        (root / "d").write_text("PLAINFILE now\n")
    elif replacement == "symlink inside":
        os.symlink(root / "keep", root / "d")
    else:
        os.symlink(root.parent / "moved_out", root / "d")
    index._on_paths({str(root / "d")})         # one debounced batch: the folder's own path only
    for gone in (root / "d" / "a.txt", root / "d" / "sub" / "b.txt"):
        assert str(gone) not in ds and not index.owns(str(gone))
    assert follows(ds, "UNIQUEMARKER") == set() and follows(ds, "SUBMARKER") == set()
    assert follows(ds, "KEEPMARKER") == {" kept\n"}
    assert (follows(ds, "PLAINFILE") == {" now\n"}) == (replacement == "file")
    assert_consistent(ds)
    index._on_paths({str(root)})                # the root's own event (its entries changed) removes nothing
    assert follows(ds, "KEEPMARKER") == {" kept\n"}


# --- 5. watcher overflow, whatever the log level ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["kernel overflow event", "watchdog's log record"])
def test_lost_events_are_recovered_at_log_level_error(ws, how, monkeypatch):
    from watchdog.observers.inotify_c import InotifyConstants, InotifyEvent

    root, cache = ws
    (root / "a.py").write_text("old_text = 1\n")
    index, ds, changes = built_with_changes(root, cache)
    monkeypatch.setattr(logging.root, "level", logging.ERROR)        # rest-lsp --log-level ERROR
    start_watching_caught_up(index, monkeypatch)
    try:
        watcher = index._watcher
        monkeypatch.setattr(watcher, "add", lambda paths: None)       # every event from now on is lost
        (root / "a.py").write_text("unseen_change = 1\n")
        if how == "kernel overflow event":
            # What watchdog's inotify reader does when the kernel reports IN_Q_OVERFLOW; its log records are
            # off, so only the hook can see it.
            for name in ("watchdog.observers.inotify_c", "watchdog.observers.inotify"):
                monkeypatch.setattr(logging.getLogger(name), "disabled", True)
            watcher._observer._inotify_fd.handle_event(InotifyEvent(-1, InotifyConstants.IN_Q_OVERFLOW, 0, b""))
        else:
            logging.getLogger("watchdog.observers.inotify_c").warning(
                "Inotify queue overflowed; filesystem events were lost")
        changes.wait_for(root / "a.py")
        assert follows(ds, "unseen_cha") == {"nge = 1\n"} and follows(ds, "old_te") == set()
    finally:
        index.stop()


# --- 6. sampling among live rows ---------------------------------------------------------------------------------
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


# --- 7. a damaged cache rebuilds -----------------------------------------------------------------------------------
def _damage_meta(folder):
    p = next(folder.glob("*.meta.npz"))
    p.write_bytes(p.read_bytes()[:40])


def _damage_tokens(folder):
    next(folder.glob("*.tokens.npy")).write_bytes(b"")


def _damage_manifest_list(folder):
    (folder / "manifest.json").write_text("[]")


def _damage_manifest_json(folder):
    (folder / "manifest.json").write_text('{"format": ')


def _damage_dead(folder):
    m = json.loads((folder / "manifest.json").read_text())
    m["segments"][0]["dead"] = [5]
    (folder / "manifest.json").write_text(json.dumps(m))


def _damage_rsa_values(folder):
    p = next(folder.glob("*.rsa.npy"))
    a = np.load(p)
    np.save(p, a[::-1].copy())               # right shape and type, wrong content


def _damage_tokens_values(folder):
    p = next(folder.glob("*.tokens.npy"))
    a = np.load(p)
    a[3] = a[3] + 1
    np.save(p, a)


def _damage_docs(folder):
    next(folder.glob("*.docs.json")).write_text("{}")


DAMAGES = [_damage_meta, _damage_tokens, _damage_manifest_list, _damage_manifest_json, _damage_dead,
           _damage_rsa_values, _damage_tokens_values, _damage_docs]


@pytest.mark.parametrize("damage", DAMAGES, ids=[d.__name__[8:] for d in DAMAGES])
def test_a_damaged_cache_is_rebuilt_with_one_log_line(ws, damage, caplog):
    root, cache = ws
    (root / "a.txt").write_text("KEY hello there\n")
    index, ds = make_index(root, cache)
    index.build()
    folder = next((cache / "index").iterdir())
    damage(folder)
    caplog.set_level(logging.INFO, logger="rest_lsp.datastore")
    index2, ds2 = make_index(root, cache)
    stats = index2.build()
    assert not stats["loaded"] and stats["reindexed"] == 1 and stats["saved"]
    assert follows(ds2, "KEY") == {" hello t"}
    assert_consistent(ds2)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "rebuilding" in warnings[0].getMessage(), warnings
    index3, ds3 = make_index(root, cache)          # the rebuilt cache loads at the next start
    assert index3.build()["loaded"] and follows(ds3, "KEY") == {" hello t"}


def test_a_save_that_fails_does_not_stop_watching(ws, monkeypatch):
    root, cache = ws
    (root / "a.txt").write_text("KEY hello\n")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    real_save = np.save
    monkeypatch.setattr(np, "save", disk_full)
    changes = Changes()
    index, ds = make_index(root, cache, on_change=changes)
    stats = index.build()
    assert not stats["saved"] and "No space" in index.save_error and follows(ds, "KEY") == {" hello\n"}
    folder = next((cache / "index").iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["lock"]      # no half-written segment left behind
    index.start_watching()
    try:
        write_whole(root / "b.txt", "WATCHED still\n")
        changes.wait_for(root / "b.txt")
        assert follows(ds, "WATCHED") == {" still\n"}
    finally:
        monkeypatch.setattr(np, "save", real_save)                  # space again: stop() saves it all
        index.stop()
    index2, ds2 = make_index(root, cache)
    assert index2.build()["loaded"] and follows(ds2, "WATCHED") == {" still\n"}


# --- 8. no lock held across a join: stop() while the listener waits for the caller's lock -----------------------
def test_stop_returns_while_a_listener_waits_for_the_callers_lock(ws, monkeypatch):
    root, cache = ws
    (root / "a.txt").write_text("one\n")
    outer = threading.Lock()                     # the service's lock, held by whoever calls stop()
    entered = threading.Event()

    def listener(ids):
        entered.set()
        with outer:
            pass

    index, ds = make_index(root, cache, on_change=listener)
    index.build()
    entered.clear()
    start_watching_caught_up(index, monkeypatch)
    with outer:
        (root / "a.txt").write_text("two\n")
        assert entered.wait(WAIT_S), "the change never reached the listener"
        stopper = threading.Thread(target=index.stop, daemon=True)
        stopper.start()
        stopper.join(WAIT_S)
        deadlocked = stopper.is_alive()
    stopper.join(WAIT_S)
    assert not deadlocked, "stop() waited for a listener that waits for the caller's lock"


def test_stop_while_the_watcher_tokenizes_a_batch_does_not_deadlock(ws, monkeypatch):
    root, cache = ws
    (root / "a.txt").write_text("one\n")
    outer = threading.Lock()
    tokenizing, release = threading.Event(), threading.Event()
    started = []

    def tokenize(texts):
        if started:
            tokenizing.set()
            assert release.wait(WAIT_S)
        return byte_tokenize(texts)

    def listener(ids):
        with outer:
            pass

    ds = Datastore(background_merges=False)
    index = WorkspaceIndex(root, ds, tokenize, "b", cache_dir=cache, on_change=listener)
    index.build()
    start_watching_caught_up(index, monkeypatch)
    started.append(1)
    with outer:
        write_whole(root / "a.txt", "two\n")          # never read half-written
        assert tokenizing.wait(WAIT_S), "the watcher never read the change"
        stopper = threading.Thread(target=index.stop, daemon=True)
        stopper.start()
        release.set()
        stopper.join(WAIT_S)
        deadlocked = stopper.is_alive()
    stopper.join(WAIT_S)
    assert not deadlocked, "stop() deadlocked behind the watcher's batch"
    assert ds.lookup(toks("t")).continuations == [(tuple(toks("wo\n")), 1)]     # the batch under way was finished


# --- 9. bounded work after failures ----------------------------------------------------------------------------------
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


# --- 10. one bad document is not the whole build -------------------------------------------------------------------
def test_a_document_with_the_reserved_token_id_is_skipped_alone(ws, caplog):
    root, cache = ws
    (root / "good.txt").write_text("KEY fine\n")
    (root / "odd.txt").write_text("\u2603\n")
    (root / "negative.txt").write_text("\u2604\n")
    calls = []

    def tokenize(texts):
        calls.extend(texts)
        return [[SEP_ID] if "\u2603" in t else [-3] if "\u2604" in t else list(t.encode()) for t in texts]

    caplog.set_level(logging.WARNING, logger="rest_lsp.datastore")
    ds = Datastore(background_merges=False)
    stats = WorkspaceIndex(root, ds, tokenize, "b", cache_dir=cache).build()
    assert follows(ds, "KEY") == {" fine\n"} and stats["files"] == 1 and stats["saved"]
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and any("odd.txt" in m for m in logged) and any("negative.txt" in m for m in logged)
    calls.clear()                                 # not read again until it changes
    WorkspaceIndex(root, Datastore(background_merges=False), tokenize, "b", cache_dir=cache).build()
    assert calls == []


def test_a_context_holding_an_invalid_id_matches_on_its_valid_suffix():
    ds = Datastore(background_merges=False)
    ds.put("m", [5, MAX_TOKEN_ID, 6])
    ds.put("n", [7, 5, 9])
    assert ds.lookup([5, SEP_ID, 7, 5]).match_length == 2
    assert ds.lookup([5, SEP_ID, 7, 5]).continuations == [((9,), 1)]
    assert ds.lookup(np.array([1, -1, 7], dtype=np.int64)).match_length == 1
    assert ds.lookup([3, 2**40]) == ds.lookup([SEP_ID]) == ds.lookup([]) and ds.lookup([]).match_length == 0
    assert {c for c, _ in ds.continuations([9, SEP_ID, 5])} == {(MAX_TOKEN_ID, 6), (9,)}


# --- 11. signatures, accepted documents, ignore files, polling -------------------------------------------------
def test_a_same_size_rewrite_within_one_timestamp_tick_is_seen(ws, monkeypatch):
    root, cache = ws
    f = root / "a.txt"
    f.write_text("KEY aaaa\n")
    frozen = os.stat(f).st_mtime_ns + 10**12

    def coarse(st):          # a file system whose clock has not ticked since: every stat looks the same
        return (frozen, st.st_size, 1, frozen, 0)

    monkeypatch.setattr(scan_module, "signature", coarse)
    index, ds = make_index(root, cache)
    index.build()
    f.write_text("KEY bbbb\n")
    index._on_paths({str(f)})                        # the watcher's batch
    assert follows(ds, "KEY") == {" bbbb\n"}
    index.stop()
    f.write_text("KEY cccc\n")                       # while the server is down
    index2, ds2 = make_index(root, cache)
    assert index2.build()["reindexed"] == 1 and follows(ds2, "KEY") == {" cccc\n"}


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


def test_an_ignore_file_change_walks_only_what_it_rules(ws, monkeypatch):
    root, cache = ws
    (root / "node_modules" / "pkg").mkdir(parents=True)
    (root / "sub").mkdir()
    (root / "sub" / "a.txt").write_text("SUBFILE here\n")
    index, ds = make_index(root, cache)
    index.build()
    walks = []
    real_walk = indexer_module.walk
    monkeypatch.setattr(indexer_module, "walk", lambda *a, **k: walks.append(k.get("under", "")) or real_walk(*a, **k))

    (root / "node_modules" / "pkg" / ".gitignore").write_text("*\n")
    index._on_paths({str(root / "node_modules" / "pkg" / ".gitignore")})
    assert walks == []                               # git reads no ignore file inside an ignored folder

    (root / "sub" / ".gitignore").write_text("a.txt\n")
    index._on_paths({str(root / "sub" / ".gitignore")})
    assert walks == ["sub"] and follows(ds, "SUBFILE") == set()


def test_the_polling_fallback_never_lists_ignored_folders(ws, monkeypatch):
    from watchdog.utils.dirsnapshot import DirectorySnapshot

    root, cache = ws
    for d in ("node_modules/deep", ".git/objects", "generated"):
        (root / d).mkdir(parents=True)
        (root / d / "x.txt").write_text("x\n")
    (root / ".gitignore").write_text("generated/\n")
    (root / "src").mkdir()
    listed = []
    real_walk = DirectorySnapshot.walk
    monkeypatch.setattr(DirectorySnapshot, "walk", lambda self, path: listed.append(path) or real_walk(self, path))
    changes = Changes()
    index, ds = make_index(root, cache, on_change=changes, polling=True)
    index.build()
    index.start_watching()
    try:
        assert index.watching_by_polling
        (root / "src" / "p.py").write_text("polled_file = 1\n")
        changes.wait_for(root / "src" / "p.py")      # at least one whole poll after the start
    finally:
        index.stop()
    assert str(root / "src") in listed
    ignored = [p for p in listed if any(p.startswith(str(root / d)) for d in ("node_modules", ".git", "generated"))]
    assert ignored == []


# --- issue 12, item 7: the default capped-occurrence path ------------------------------------------------------
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
