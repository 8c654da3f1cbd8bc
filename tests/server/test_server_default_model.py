"""The language server with the real default model (no --model) end to end over stdio: one server start.

On a clean cache the first load converts the .gguf (about 30 s): the in-process reference model (the
`default_model` fixture) loads first and pays for it, the server then reads the converted copy.
"""

from pathlib import Path

import pytest
from lsprotocol import types

from support import command, cursor_at_end, greedy_of, inline, open_doc, server_command, start, wait_until
from rest_lsp.engine.model import DEFAULT_MODEL
from rest_lsp.lsp.server import STATS_COMMAND

pytestmark = pytest.mark.slow

BEFORE = (
    "import os\n\n\n"
    "def list_python_files(folder):\n"
    '    """Return the paths of the .py files under folder, sorted."""\n'
    "    found = []\n"
    "    for dirpath, dirnames, filenames in os.walk(folder):\n"
    "        for name in filenames:\n"
    "            if name.endswith(\".py\"):\n"
    "                "
)
AFTER = "\n    return sorted(found)\n"
MAX_NEW = 24
LOAD_TIMEOUT_S = 600  # a slow CI machine converting the .gguf


async def test_inline_completion_with_the_default_model(default_model, tmp_path: Path):
    expected = greedy_of(default_model.model, default_model.tokenizer.hf, BEFORE, AFTER, MAX_NEW)
    assert expected.strip(), "the reference completion is empty: pick another prompt"
    # BEFORE ends at a body start: the suggestion starts with code at the cursor, not with a line break
    assert not expected.startswith("\n"), expected
    root = tmp_path / "workspace"
    root.mkdir()
    # REST on, server defaults but the exact mode (a .gguf model defaults to float16-weights on a CPU without bf16,
    # whose output may leave fp32's near a tie), no time budget and no line cap: the answer is compared with the
    # whole greedy continuation of transformers' fp32 generate
    options = {"maxNewTokens": MAX_NEW, "cacheDir": str(tmp_path / "index"), "timeBudgetMs": 0, "waitBudgetMs": 0,
               "dtype": "float32", "maxLines": 0}
    client, _ = await start(server_command(), root, "visual-studio-code", options)
    try:
        async def ready():
            stats = await command(client, STATS_COMMAND)
            assert not stats["load_error"], stats["load_error"]
            return stats if stats["ready"] else None

        stats = await wait_until(ready, timeout=LOAD_TIMEOUT_S)
        assert stats and stats["model"] == DEFAULT_MODEL
        assert stats["dtype"] == "float32" and stats["engine"].startswith("lean")  # as asked: the exact mode
        uri = (root / "walk.py").as_uri()
        open_doc(client, uri, BEFORE + AFTER)
        result = await inline(client, uri, *cursor_at_end(BEFORE))
        assert [item.insert_text for item in result.items] == [expected]
        assert result.items[0].range.start == types.Position(*cursor_at_end(BEFORE))
    finally:
        await client.shutdown_session()
