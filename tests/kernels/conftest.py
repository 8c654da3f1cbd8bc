"""The kernel tests build their libraries in a cache folder of their own."""

import pytest


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """Every library these tests build goes to a folder of their own, never the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REST_LSP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield
