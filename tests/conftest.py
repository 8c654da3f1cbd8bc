"""Shared fixtures: tiny random models of two architectures, small real model folders for the service and server
tests, and the real default model (loaded once)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch

from rest_lsp.engine.model import LoadedModel

sys.path.insert(0, str(Path(__file__).resolve().parent))  # support.py and step_gate.py, for every test folder
from support import SAME_WORKER, TEST_DEVICE, tiny_model, tiny_model_dirs  # noqa: E402

# Tiny models run faster on one thread, and the suite shares its 2 cores with language-server subprocesses.
SUITE_THREADS = 1
torch.set_num_threads(SUITE_THREADS)

# The dtype a load gets when none is asked for (REST_LSP_DTYPE, rest_lsp/engine/runmode.py) reaches the tests marked
# `default_dtype` only: dev.sh runs them a second time with it set, so the other default path runs on any machine;
# every other test sees this machine's own default, whatever the shell that started pytest holds.
FORCED_DTYPE = os.environ.pop("REST_LSP_DTYPE", None)

# Folders under the rest-lsp cache that cost much to fill and hold nothing a test's outcome depends on: converted
# .gguf models. They are kept across sessions in pytest's cache folder and moved into this session's cache folder for
# its length (a cache folder may not be a link: rest_lsp/cache_dir.py); everything else the code writes under its cache
# root (acceptance tables, step-cost curves, indexes, tokenizers, the compiled panel kernel) goes to a folder of this
# session's own, never the user's real cache. A second session running at once starts without them.
KEPT_CACHE_FOLDERS = ("models",)


def _xdist_role(config) -> str | None:
    """None without pytest-xdist; "controller" in the process that only hands tests out; else the worker's id
    ("gw0", "gw1", ...)."""
    worker = getattr(config, "workerinput", {}).get("workerid") or os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        return worker
    return "controller" if getattr(config.option, "numprocesses", None) else None


def _keeps_folders(config) -> bool:
    """Whether this process moves the kept folders in and out: a session without xdist does, and under xdist the
    first worker only (the controller runs no test; a second worker starts without them, as a second session does,
    and whatever it converts is dropped, so the two never race to give a folder back)."""
    return getattr(config, "cache", None) is not None and _xdist_role(config) in (None, "gw0")


def pytest_configure(config):
    config.addinivalue_line("markers", "default_dtype: depends on the dtype a load gets when none is asked for "
                                       "(run again by dev.sh with REST_LSP_DTYPE set)")
    config.addinivalue_line("markers", "quiet: its outcome depends on timings this machine measures while it runs "
                                       "(a step-cost curve, a calibration); dev.sh runs it alone after the "
                                       "parallel pass (pytest-xdist), never beside another test")
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    # beside the kept folders (one file system: a rename moves them), mode 700; one per xdist worker
    session = Path(tempfile.mkdtemp(prefix="rest-lsp-test-cache-",
                                    dir=cache.mkdir("rest-lsp-sessions") if cache is not None else None))
    for name in KEPT_CACHE_FOLDERS if _keeps_folders(config) else ():
        kept = cache.mkdir(f"rest-lsp-{name}")
        try:
            os.rename(kept, session / name)
        except OSError:  # another session holds them
            pass
    config.rest_lsp_cache_dir = session
    config.rest_lsp_forced_dtype = FORCED_DTYPE
    os.environ["REST_LSP_CACHE_DIR"] = str(session)  # subprocesses (servers, the CLI) inherit it


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadfile` (dev.sh): each test file whole on one worker (its module fixtures start once), and the
    files of SAME_WORKER on one worker. (xdist's own `loadgroup` marks do not group under pytest 9.2.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileGroups(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SAME_WORKER.get(path, path)

    return FileGroups(config, log)


def pytest_unconfigure(config):
    session = getattr(config, "rest_lsp_cache_dir", None)
    if session is None:
        return
    cache = getattr(config, "cache", None)
    for name in KEPT_CACHE_FOLDERS if _keeps_folders(config) else ():
        kept = Path(cache.mkdir(f"rest-lsp-{name}"))
        if (session / name).is_dir() and not any(kept.iterdir()):
            kept.rmdir()
            os.rename(session / name, kept)  # kept for the next session
    shutil.rmtree(session, ignore_errors=True)


def _threads_of_a_new_thread() -> int:
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """Every test ends with torch's thread count as it began, in the main thread and in threads started later.

    torch.set_num_threads called in another thread sets the count of every thread started after it, not the main
    thread's: a test that leaves it so makes the later tests of its worker see two counts (a step-cost curve measured
    in the main thread under "1 threads" is not found by a server's loader thread under "2")."""
    yield
    counts = (torch.get_num_threads(), _threads_of_a_new_thread())
    if counts != (SUITE_THREADS, SUITE_THREADS):
        torch.set_num_threads(SUITE_THREADS)
        pytest.fail(f"this test left torch's thread count at {counts[0]} in the main thread and {counts[1]} in a new "
                    f"thread (the suite runs on {SUITE_THREADS}); set it back where it was changed")


@pytest.fixture
def two_threads():
    """torch on 2 threads for the test (the suite runs on SUITE_THREADS); the count it had comes back after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _forced_dtype(request, monkeypatch):
    if FORCED_DTYPE and request.node.get_closest_marker("default_dtype"):
        monkeypatch.setenv("REST_LSP_DTYPE", FORCED_DTYPE)
@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny(request) -> LoadedModel:
    return tiny_model(request.param)


@pytest.fixture(scope="session")
def default_model(pytestconfig) -> LoadedModel:
    from rest_lsp.engine.model import load_model

    with _models_shared_by_workers(pytestconfig):
        return load_model(None, str(TEST_DEVICE), "float32")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist's controller, for each worker it starts: a folder the workers share, in its own session folder
    (removed with it)."""
    node.workerinput["rest_lsp_shared"] = str(node.config.rest_lsp_cache_dir / "shared")


@contextlib.contextmanager
def _models_shared_by_workers(config):
    """Under pytest-xdist, the default model's conversion (slow: a dequantization in Python) made once for all
    workers: the first worker converts while the others wait, then every worker copies the kept entries
    (conversions, packed panels) into its own cache. Without xdist: nothing."""
    shared = getattr(config, "workerinput", {}).get("rest_lsp_shared")
    if shared is None:
        yield
        return
    shared, own = Path(shared), config.rest_lsp_cache_dir / "models"
    shared.mkdir(mode=0o700, exist_ok=True)
    with open(shared / "models.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _copy_entries(shared / "models", own)
        yield
        _copy_entries(own, shared / "models")


def _copy_entries(source: Path, target: Path) -> None:
    """Copies the cache entries of `source` that `target` lacks, and a whole conversion over a tokenizer-only one."""
    if not source.is_dir():
        return
    target.mkdir(mode=0o700, exist_ok=True)
    for entry in source.iterdir():
        mine = target / entry.name
        if entry.name.startswith(".") or mine.exists() and not (
                (entry / "config.json").is_file() and not (mine / "config.json").is_file()):
            continue
        shutil.rmtree(mine, ignore_errors=True)
        (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, mine)


@pytest.fixture(scope="session")
def tiny_models(request) -> dict[str, Path]:
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    folder = cache.mkdir("rest-lsp-tiny-models") if cache else Path(tempfile.gettempdir()) / "rest-lsp-tiny-models"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # xdist workers share this folder: one builds the models while the other waits, then finds them built
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return tiny_model_dirs(folder)
