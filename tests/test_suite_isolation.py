"""What the suite itself promises (tests/conftest.py): nothing it runs writes into the user's real rest-lsp cache,
and only the tests marked `default_dtype` see REST_LSP_DTYPE."""

import os
from pathlib import Path

import platformdirs
import pytest

from rest_lsp.datastore.persist import default_cache_dir
from rest_lsp.engine.model_source import cache_root


def test_every_cache_root_is_this_sessions_own_folder(pytestconfig):
    session = Path(pytestconfig.rest_lsp_cache_dir)
    real = Path(platformdirs.user_cache_dir("rest-lsp"))
    assert session.is_dir() and not session.resolve().is_relative_to(real.resolve())
    assert os.environ["REST_LSP_CACHE_DIR"] == str(session)  # what subprocesses inherit
    assert cache_root() == session and default_cache_dir() == session
    from rest_lsp.kernels.loader import kernel_folder

    assert kernel_folder().parent == session


def test_an_unmarked_test_sees_no_forced_dtype():
    assert "REST_LSP_DTYPE" not in os.environ


@pytest.mark.default_dtype
def test_a_marked_test_sees_the_forced_dtype_when_one_was_given(pytestconfig):
    assert os.environ.get("REST_LSP_DTYPE") == pytestconfig.rest_lsp_forced_dtype


def test_the_files_kept_on_one_worker_are_there():
    """SAME_WORKER (conftest.py's scheduler) names files by path: one renamed or moved would run beside the other
    again (two Ray clusters at once) without a word."""
    from support import SAME_WORKER

    root = Path(__file__).resolve().parents[1]
    assert SAME_WORKER and all((root / path).is_file() for path in SAME_WORKER), SAME_WORKER
