"""`--ignore` (the server's command line) and `ignore` in the editor's settings (what VS Code's `restLsp.ignore`
and Neovim's `settings.ignore` send) keep matching files out of the workspace index."""

import pytest
from lsprotocol import types

from support import command, server_command, start, wait_until
from rest_lsp.lsp.server import DRAFTS_COMMAND, STATS_COMMAND

FILES = {
    "kept.py": "def kept_marker_fn(alpha):\n    return alpha\n",
    "generated_api.py": "def generated_marker_fn(beta):\n    return beta\n",
    "vendor/dep.py": "def vendored_marker_fn(gamma):\n    return gamma\n",
}
PATTERNS = ["generated_*.py", "vendor/"]


@pytest.mark.parametrize("where", ["command-line", "editor-settings"])
async def test_ignore_patterns_keep_files_out_of_the_index(tiny_models, tmp_path, where):
    root = tmp_path / "workspace"
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    options = {"model": str(tiny_models["random"]), "debounceMs": 0, "cacheDir": str(tmp_path / "index")}
    args = []
    if where == "command-line":
        args = [f"--ignore={p}" for p in PATTERNS]
    else:
        options["ignore"] = PATTERNS
    client, _ = await start(server_command(*args), root, "visual-studio-code", options)
    try:
        async def indexed():
            stats = await command(client, STATS_COMMAND)
            assert not stats["load_error"], stats["load_error"]
            return stats if stats["ready"] and stats["documents"] >= 1 else None

        stats = await wait_until(indexed, timeout=120)
        assert stats, "the workspace was not indexed"

        async def proposes(context: str, start_text: str) -> bool:
            return any(d["text"].startswith(start_text) for d in await command(client, DRAFTS_COMMAND, context))

        assert await proposes("def kept_marker_fn", "(alpha")  # indexed: the drafts see the workspace
        assert not await proposes("def generated_marker_fn", "(beta")
        assert not await proposes("def vendored_marker_fn", "(gamma")
        assert (await command(client, STATS_COMMAND))["documents"] == 1
    finally:
        await client.shutdown_session()
