"""`rest-lsp --stdio --remote URL --token-file F`: the language server editors start, decoding on a team's server."""

from __future__ import annotations

import subprocess
import sys

from support import TEAM_TOKEN as TOKEN
from support import command, cursor_at_end, greedy, inline, open_doc, start, wait_until

BEFORE = "def add(a, b):\n    return a + b\n\nresult = add("
AFTER = ")\nprint(result)\n"


def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


async def test_the_editors_server_completes_through_the_team_server(live, tmp_path, tiny_models):
    url, holder, _ = live
    root = tmp_path / "ws"
    root.mkdir()
    (root / "lib.py").write_text("def frobnicate_widget(count):\n    return count * 7\n")
    options = {"maxNewTokens": 8, "debounceMs": 0, "cacheDir": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "rest_lsp.cli", "--stdio", "--remote", url, "--token-file",
           str(token_file(tmp_path))]
    client, _ = await start(cmd, root, "visual-studio-code", options)
    try:
        async def synced():
            stats = await command(client, "rest-lsp.stats")
            return stats.get("snapshots_sent", 0) >= 1

        await wait_until(synced, 60)
        uri = (root / "main.py").as_uri()
        open_doc(client, uri, BEFORE + AFTER)
        result = await inline(client, uri, *cursor_at_end(BEFORE))
        assert [i.insert_text for i in result.items] == [greedy(tiny_models["random"], BEFORE, AFTER, 8)]
        stats = await command(client, "rest-lsp.stats")
        assert stats["mode"] == "remote" and stats["status"] == "connected" and stats["remote"] == url
        drafts = await command(client, "rest-lsp.drafts", "def frobnicate_widget")
        assert any(d["text"].startswith("(count") for d in drafts)
    finally:
        await client.shutdown_session()


def test_remote_without_a_token_file_refuses_to_start_with_one_sentence(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rest_lsp.cli", "--stdio", "--remote", "http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "--token-file" in out.stderr
    loose = tmp_path / "loose"
    loose.write_text(TOKEN)
    loose.chmod(0o644)
    out = subprocess.run([sys.executable, "-m", "rest_lsp.cli", "--stdio", "--remote", "http://127.0.0.1:9",
                          "--token-file", str(loose)], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "chmod 600" in out.stderr
