"""Workspace folders added or removed at run time (workspace/didChangeWorkspaceFolders): an added folder is indexed
and watched, a removed one unwatched and its files dropped from the datastore."""

from __future__ import annotations

import os

from lsprotocol import types

from support import cache_with_kernels, command, server_command, start, wait_until
from rest_lsp.lsp.server import DRAFTS_COMMAND, STATS_COMMAND


async def test_added_folders_are_indexed_and_watched_removed_ones_dropped(tiny_models, tmp_path):
    alpha, beta = tmp_path / "alpha", tmp_path / "beta"
    alpha.mkdir()
    beta.mkdir()
    (alpha / "a.py").write_text("alpha_unique_token_one = 1111\n")
    (beta / "b.py").write_text("beta_unique_token_two = 2222\n")
    cache = cache_with_kernels(tmp_path / "cache")
    options = {"model": str(tiny_models["random"]), "dtype": "float32", "cacheDir": str(cache)}
    env = {**os.environ, "REST_LSP_CACHE_DIR": str(cache)}
    client, _ = await start(server_command(), alpha, "visual-studio-code", options, env=env)
    try:
        async def drafted(context: str, start_text: str) -> bool:
            return any(d["text"].startswith(start_text) for d in await command(client, DRAFTS_COMMAND, context))

        async def alpha_in():
            stats = await command(client, STATS_COMMAND)
            assert not stats["load_error"], stats["load_error"]
            return await drafted("alpha_unique_token_one =", " 1111")

        assert await wait_until(alpha_in, timeout=120), "the first folder was not indexed"
        client.workspace_did_change_workspace_folders(types.DidChangeWorkspaceFoldersParams(
            event=types.WorkspaceFoldersChangeEvent(
                added=[types.WorkspaceFolder(uri=beta.as_uri(), name="beta")],
                removed=[types.WorkspaceFolder(uri=alpha.as_uri(), name="alpha")])))

        async def swapped():
            return (await drafted("beta_unique_token_two =", " 2222")
                    and not await drafted("alpha_unique_token_one =", " 1111"))

        assert await wait_until(swapped, timeout=60), "beta/ not indexed, or alpha/ still in the datastore"
        (beta / "later.py").write_text("beta_later_token_three = 3333\n")  # beta/ is watched
        assert await wait_until(lambda: drafted("beta_later_token_three =", " 3333"), timeout=60)
        (alpha / "later.py").write_text("alpha_later_token_four = 4444\n")  # alpha/ is not
        (beta / "last.py").write_text("beta_last_token_five = 5555\n")  # once this is in, alpha's event is past
        assert await wait_until(lambda: drafted("beta_last_token_five =", " 5555"), timeout=60)
        assert not await drafted("alpha_later_token_four =", " 4444")
    finally:
        await client.shutdown_session()
