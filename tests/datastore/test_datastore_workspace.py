"""WorkspaceIndex: what is indexed, the watcher, restarts and a crash during a save."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from test_datastore_store import assert_consistent

from rest_lsp.datastore import Datastore, Source, WorkspaceIndex
from rest_lsp.datastore import indexer as indexer_module
from rest_lsp.datastore import scan as scan_module
from rest_lsp.datastore.segment import SEP_ID

WAIT_S = 20.0


def byte_tokenize(texts: list[str]) -> list[list[int]]:
    """A stand-in for the model's tokenizer: one token per UTF-8 byte."""
    return [list(t.encode("utf-8")) for t in texts]


def toks(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def follows(ds: Datastore, context: str) -> set[str]:
    """Texts that follow `context` when it is matched in full."""
    got = ds.lookup(toks(context))
    if got.match_length < len(toks(context)):
        return set()
    return {bytes(c).decode("utf-8", "replace") for c, _ in got.continuations}


class Changes:
    """Collects on_change batches so tests wait on an event, never on a sleep."""

    def __init__(self):
        self.cond = threading.Condition()
        self.seen: list[str] = []

    def __call__(self, ids: list[str]) -> None:
        with self.cond:
            self.seen.extend(ids)
            self.cond.notify_all()

    def wait_for(self, path: Path) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: str(path) in self.seen, WAIT_S), f"no change reported for {path}"
            self.seen.clear()


def make_index(root: Path, cache: Path, **kw) -> tuple[WorkspaceIndex, Datastore]:
    ds = Datastore(background_merges=False, continuation_length=8)
    return WorkspaceIndex(root, ds, byte_tokenize, "bytes-v1", cache_dir=cache, **kw), ds


def built_with_changes(root: Path, cache: Path) -> tuple[WorkspaceIndex, Datastore, Changes]:
    """An index built over `root` whose later changes are reported to the returned Changes (none seen yet)."""
    changes = Changes()
    index, ds = make_index(root, cache, on_change=changes)
    index.build()
    changes.seen.clear()
    return index, ds, changes


def write_whole(path: Path, text: str) -> None:
    """Write so that the watcher never reads a half-written file: a temp file moved into place."""
    tmp = path.parent.parent / f".{path.name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)


def start_watching_caught_up(index: WorkspaceIndex, monkeypatch) -> threading.Semaphore:
    """Start watching, and return once the catch-up rescan has run (it would race with the test's first
    writes); the semaphore counts later rescans."""
    rescans = threading.Semaphore(0)
    real_rescan = index.rescan
    monkeypatch.setattr(index, "rescan", lambda: (real_rescan(), rescans.release())[0])
    index.start_watching()
    assert rescans.acquire(timeout=WAIT_S), "no catch-up rescan when watching started"
    return rescans


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve(), tmp_path / "cache"


def test_indexes_text_and_skips_what_must_be_skipped(ws, tmp_path):
    root, cache = ws
    (root / "main.py").write_text("def alpha_marker(): return 1\n")
    (root / "latin1.py").write_bytes(b"x = 'caf\xe9 beta_marker'\n")
    (root / "bin.dat").write_bytes(b"gamma_marker\0\1\2")
    (root / "big.txt").write_text("delta_marker " * 200)
    (root / "ignored.log").write_text("eps_marker\n")
    (root / ".gitignore").write_text("*.log\nsub/generated/\n")
    (root / "sub" / "generated").mkdir(parents=True)
    (root / "sub" / "generated" / "g.py").write_text("zeta_marker\n")
    (root / "sub" / ".gitignore").write_text("!keep.log\nlocal.txt\n")
    (root / "sub" / "keep.log").write_text("kept_marker\n")
    (root / "sub" / "local.txt").write_text("theta_marker\n")
    (root / ".git" / "info").mkdir(parents=True)
    (root / ".git" / "info" / "exclude").write_text("private.py\n")
    (root / ".git" / "HEAD").write_text("iota_marker\n")
    (root / "private.py").write_text("kappa_marker\n")
    for d in ("node_modules", ".venv", "build"):
        (root / d).mkdir()
        (root / d / "x.js").write_text("lambda_marker\n")
    (root / "myenv").mkdir()
    (root / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "myenv" / "site.py").write_text("mu_marker\n")
    (root / "unreadable.py").write_text("nu_marker\n")
    os.chmod(root / "unreadable.py", 0)            # unreadable unless the tests run as root
    os.mkfifo(root / "pipe.py")                      # reading it would block forever
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("xi_marker\n")
    (root / "link_out").symlink_to(outside, target_is_directory=True)
    (root / "link_file.py").symlink_to(outside / "secret.py")
    (root / "loop").mkdir()
    (root / "loop" / "again").symlink_to(root / "loop", target_is_directory=True)

    progress = []
    index, ds = make_index(root, cache, max_file_bytes=1000, on_progress=lambda d, t: progress.append((d, t)))
    stats = index.build()

    assert follows(ds, "alpha_mark") == {"er(): re"}
    assert follows(ds, "beta_mark") == {"er'\n"}            # non-UTF-8 text indexed with replacement
    assert follows(ds, "x = '") == {"caf\ufffd b"}
    assert follows(ds, "kept_mark") == {"er\n"}              # re-included by a nested negation
    for name in ("gamma", "delta", "eps", "zeta", "theta", "iota", "kappa", "lambda", "mu", "xi"):
        assert follows(ds, f"{name}_mark") == set(), name
    if os.geteuid() != 0:
        assert follows(ds, "nu_mark") == set()
    assert stats["files"] == len(index._files)
    assert progress[0][0] == 0 and progress[-1][0] == progress[-1][1]
    assert all(p.startswith(str(root) + os.sep) for p in ds.doc_ids())


def test_watcher_follows_add_change_rename_delete(ws, monkeypatch):
    root, cache = ws
    (root / "a.py").write_text("first_version = 1\n")
    index, ds, changes = built_with_changes(root, cache)
    start_watching_caught_up(index, monkeypatch)
    try:
        new = root / "pkg" / "b.py"
        new.parent.mkdir()
        new.write_text("added_file = 2\n")
        changes.wait_for(new)
        assert follows(ds, "added_fi") == {"le = 2\n"}

        (root / "a.py").write_text("second_version = 1\n")
        changes.wait_for(root / "a.py")
        assert follows(ds, "second_vers") == {"ion = 1\n"}
        assert follows(ds, "first_vers") == set()

        # An editor's atomic save: write a temp file, move it onto the target.
        tmp = root / ".a.py.swp"
        tmp.write_text("third_version = 1\n")
        os.replace(tmp, root / "a.py")
        changes.wait_for(root / "a.py")
        assert follows(ds, "third_vers") == {"ion = 1\n"} and follows(ds, "second_vers") == set()

        os.rename(new, root / "pkg" / "c.py")
        changes.wait_for(root / "pkg" / "c.py")
        assert str(root / "pkg" / "c.py") in ds and str(new) not in ds
        assert follows(ds, "added_fi") == {"le = 2\n"}

        (root / "a.py").unlink()
        changes.wait_for(root / "a.py")
        assert follows(ds, "third_vers") == set()

        # A folder moved in from outside brings files without events of their own.
        outside = root.parent / "incoming"
        outside.mkdir()
        (outside / "d.py").write_text("moved_in_folder = 4\n")
        os.rename(outside, root / "incoming")
        changes.wait_for(root / "incoming" / "d.py")
        assert follows(ds, "moved_in_fol") == {"der = 4\n"}
    finally:
        index.stop()


def test_polling_fallback_still_follows_changes(ws, monkeypatch):
    root, cache = ws
    changes = Changes()
    index, ds = make_index(root, cache, on_change=changes, polling=True)
    index.build()
    start_watching_caught_up(index, monkeypatch)
    try:
        assert index.watching_by_polling
        write_whole(root / "p.py", "polled_file = 1\n")
        changes.wait_for(root / "p.py")
        assert follows(ds, "polled_fi") == {"le = 1\n"}
    finally:
        index.stop()


def test_restart_loads_the_saved_index_without_retokenizing(ws):
    root, cache = ws
    for i in range(20):
        (root / f"m{i}.py").write_text(f"def function_{i}(x):\n    return x * {i}\n")
    index, ds = make_index(root, cache)
    index.build()
    contexts = [toks(f"function_{i}") for i in range(20)] + [toks("return x")]
    before = [ds.lookup(c) for c in contexts]

    calls = []
    ds2 = Datastore(background_merges=False, continuation_length=8)
    index2 = WorkspaceIndex(root, ds2, lambda texts: calls.append(len(texts)) or byte_tokenize(texts),
                            "bytes-v1", cache_dir=cache)
    stats = index2.build()
    assert calls == [] and stats["loaded"]
    assert [ds2.lookup(c) for c in contexts] == before

    # Changed while the server was down: found by reconciliation, and only that file is read again.
    (root / "m3.py").write_text("def renamed_three(x):\n    return x\n")
    (root / "m4.py").unlink()
    ds3 = Datastore(background_merges=False, continuation_length=8)
    calls.clear()
    WorkspaceIndex(root, ds3, lambda texts: calls.append(len(texts)) or byte_tokenize(texts),
                   "bytes-v1", cache_dir=cache).build()
    assert calls == [1]
    assert follows(ds3, "renamed_th") == {"ree(x):\n"} and follows(ds3, "function_3") == set()
    assert follows(ds3, "function_4") == set() and follows(ds3, "function_5") == {"(x):\n   "}

    # Another tokenizer invalidates the saved index.
    calls.clear()
    WorkspaceIndex(root, Datastore(background_merges=False), lambda t: calls.append(len(t)) or byte_tokenize(t),
                   "bytes-v2", cache_dir=cache).build()
    assert sum(calls) == 19


def wait_for_paths(changes: Changes, *paths: Path) -> None:
    with changes.cond:
        assert changes.cond.wait_for(lambda: all(str(p) in changes.seen for p in paths), WAIT_S), \
            f"no change reported for some of {paths}"
        changes.seen.clear()


def test_symlinks_are_never_followed_by_the_watcher(ws, tmp_path, monkeypatch):
    root, cache = ws
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("outside_target = 1\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "real.py").write_text("inside_target = 1\n")
    (root / "a.py").write_text("replaced_by_inner_link = 1\n")
    (root / "b.py").write_text("replaced_by_outer_link = 1\n")
    index, ds, changes = built_with_changes(root, cache)
    start_watching_caught_up(index, monkeypatch)
    try:
        (root / "link_in.py").symlink_to(root / "pkg" / "real.py")
        (root / "link_out.py").symlink_to(outside / "secret.py")
        (root / "link_dir").symlink_to(root / "pkg", target_is_directory=True)
        (root / "link_outdir").symlink_to(outside, target_is_directory=True)
        (root / "a.py").unlink()
        (root / "a.py").symlink_to(root / "pkg" / "real.py")
        (root / "b.py").unlink()
        (root / "b.py").symlink_to(outside / "secret.py")
        write_whole(root / "sentinel.py", "sentinel = 1\n")     # its batch comes after the links'
        wait_for_paths(changes, root / "a.py", root / "b.py", root / "sentinel.py")
        assert follows(ds, "replaced_by") == set() and follows(ds, "outside_tar") == set()
        assert follows(ds, "inside_tar") == {"get = 1\n"}          # once, under its own path
        assert ds.lookup(toks("inside_tar")).continuations == [(tuple(toks("get = 1\n")), 1)]
        assert sorted(ds.doc_ids()) == [str(root / "pkg" / "real.py"), str(root / "sentinel.py")]
    finally:
        index.stop()


def test_restart_reconciliation_drops_what_symlinks_replaced(ws, tmp_path):
    root, cache = ws
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("outside_target = 1\n")
    (outside / "o.py").write_text("outside_folder = 1\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "real.py").write_text("inside_target = 1\n")
    (root / "a.py").write_text("replaced_by_inner_link = 1\n")
    (root / "b.py").write_text("replaced_by_outer_link = 1\n")
    (root / "d1").mkdir()
    (root / "d1" / "x.py").write_text("folder_to_inner_link = 1\n")
    (root / "d2").mkdir()
    (root / "d2" / "y.py").write_text("folder_to_outer_link = 1\n")
    index, ds = make_index(root, cache)
    index.build()
    assert len(ds.doc_ids()) == 5
    # While the server is down, files and folders are replaced by links to inside and outside the root.
    for name, target in (("a.py", root / "pkg" / "real.py"), ("b.py", outside / "secret.py")):
        (root / name).unlink()
        (root / name).symlink_to(target)
    for name, target in (("d1", root / "pkg"), ("d2", outside)):
        for f in (root / name).iterdir():
            f.unlink()
        (root / name).rmdir()
        (root / name).symlink_to(target, target_is_directory=True)
    (root / "new_link.py").symlink_to(root / "pkg" / "real.py")
    index2, ds2 = make_index(root, cache)
    stats = index2.build()
    assert stats["loaded"] and stats["reindexed"] == 4
    assert sorted(ds2.doc_ids()) == [str(root / "pkg" / "real.py")]
    for gone in ("replaced_by", "folder_to", "outside_"):
        assert follows(ds2, gone) == set(), gone
    assert ds2.lookup(toks("inside_tar")).continuations == [(tuple(toks("get = 1\n")), 1)]


CRASHING_WRITER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import rest_lsp.datastore.persist as persist
    from rest_lsp.datastore import Datastore, WorkspaceIndex

    where = sys.argv[3]
    real_fsync = persist._fsync

    def stuck():
        print("saving", flush=True)
        time.sleep(600)

    if where == "manifest swap":      # the new segments and manifest are written, the swap never happens
        persist._swap_in = lambda tmp, final: stuck()
    else:                             # in the middle of a segment: its tokens are written, its suffix array not yet
        def fsync(path):
            real_fsync(path)
            if ".rsa." in str(path):
                stuck()
        persist._fsync = fsync
    root, cache = Path(sys.argv[1]), Path(sys.argv[2])
    tok = lambda texts: [list(t.encode()) for t in texts]
    WorkspaceIndex(root, Datastore(background_merges=False), tok, "bytes-v1", cache_dir=cache).build()
""")


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line of the child's output, or a failure once `timeout` passes without one."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"the child printed nothing within {timeout} s"
    return proc.stdout.readline()


def crash_a_save(root: Path, cache: Path, where: str, tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(CRASHING_WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(cache), where], stdout=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[2], text=True)
    try:
        assert read_line(proc, WAIT_S).strip() == "saving"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def files_in(cache: Path) -> set[str]:
    return {p.name for folder in (cache / "index").iterdir() for p in folder.iterdir()}


def expected_files(cache: Path) -> set[str]:
    """What the folder should hold: the manifest, the lock, and the four files of each segment it names."""
    folder = next((cache / "index").iterdir())
    names = [e["name"] for e in json.loads((folder / "manifest.json").read_text())["segments"]]
    return {"manifest.json", "lock"} | {f"{n}.{s}" for n in names for s in ("tokens.npy", "rsa.npy", "meta.npz",
                                                                           "docs.json")}


@pytest.mark.parametrize("where", ["manifest swap", "segment write"])
def test_a_writer_killed_during_a_save_leaves_the_previous_index_usable(ws, tmp_path, where):
    root, cache = ws
    (root / "a.py").write_text("stable_content = 1\n")
    index, ds = make_index(root, cache)
    index.build()
    (root / "a.py").write_text("content_of_the_crashed_save = 2\n")
    (root / "b.py").write_text("more = 3\n" * 50)
    before = expected_files(cache)
    crash_a_save(root, cache, where, tmp_path)
    assert files_in(cache) - before, "the killed save left nothing behind: the test proves nothing"

    calls = []
    ds2 = Datastore(background_merges=False, continuation_length=8)
    index2 = WorkspaceIndex(root, ds2, lambda t: calls.append(len(t)) or byte_tokenize(t), "bytes-v1", cache_dir=cache)
    # The previous save loads, and what the killed one left behind is removed.
    assert index2._load()
    assert follows(ds2, "stable_cont") == {"ent = 1\n"}
    assert files_in(cache) == before == expected_files(cache)
    # Then the two changed files are found and read again.
    ds3 = Datastore(background_merges=False, continuation_length=8)
    WorkspaceIndex(root, ds3, lambda t: calls.append(len(t)) or byte_tokenize(t), "bytes-v1", cache_dir=cache).build()
    assert calls == [2]
    assert follows(ds3, "content_of_the") == {"_crashed"} and follows(ds3, "stable_cont") == set()
    assert files_in(cache) == expected_files(cache)


def test_a_first_save_killed_in_a_segment_write_is_cleaned_up_at_the_next_start(ws, tmp_path):
    root, cache = ws
    (root / "a.py").write_text("first_ever = 1\n")
    crash_a_save(root, cache, "segment write", tmp_path)
    assert files_in(cache) - {"lock"}, "the killed save left nothing behind: the test proves nothing"
    index, ds = make_index(root, cache)
    assert not index._load()
    assert files_in(cache) == {"lock"}
    assert index.build()["saved"] and follows(ds, "first_e") == {"ver = 1\n"}
    assert files_in(cache) == expected_files(cache)


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
