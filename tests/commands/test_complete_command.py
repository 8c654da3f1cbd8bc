"""`rest-lsp complete FILE:LINE:COL` in a subprocess: the server's completion as JSON, and
bad input answered with one sentence, a non-zero exit and no traceback."""

import json
import subprocess
import sys

import pytest
from support import greedy

BEFORE = "def add(a, b):\n    return a + b\n\nresult = add("
AFTER = ")\nprint(result)\n"
MAX_NEW = 8


def complete(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rest_lsp.cli", "complete", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "calc.py"
    path.write_text(BEFORE + AFTER)
    return path


def test_json_completion_is_the_greedy_continuation(source, tiny_models):
    line, col = BEFORE.count("\n") + 1, len(BEFORE.rsplit("\n", 1)[1]) + 1
    done = complete(f"{source}:{line}:{col}", "--json", "--model", str(tiny_models["random"]),
                    "--max-new-tokens", str(MAX_NEW), "--dtype", "float32")  # the exact mode: compared with generate
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    expected = greedy(tiny_models["random"], BEFORE, AFTER, MAX_NEW)
    assert expected and out["text"] == expected
    assert (out["file"], out["line"], out["column"]) == (str(source), line, col)
    assert 1 <= out["tokens"] <= MAX_NEW and 1 <= out["steps"] <= out["tokens"] and out["latency_ms"] > 0
    assert out["stats"]["ready"] and out["stats"]["completions_served"] == 1


def _one_sentence(done: subprocess.CompletedProcess, *needles: str) -> str:
    assert done.returncode != 0 and not done.stdout
    err = done.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("rest-lsp complete: ") and err.endswith("."), err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("where, needles", [
    ("{dir}/missing.py:1:1", ["missing.py", "no such file"]),
    ("{src}:40:1", ["Line 40 is past the end of the file"]),
    ("{src}:1:99", ["Column 99 is past the end of line 1"]),
    ("{src}:two:1", ["Expected FILE:LINE:COL"]),
    ("{src}", ["Expected FILE:LINE:COL"]),
    ("{src}:0:3", ["1-based"]),
])
def test_bad_location(source, tmp_path, where, needles):
    done = complete(where.format(dir=tmp_path, src=source), "--model", str(tmp_path / "never-loaded"))
    _one_sentence(done, *needles)


def test_unknown_model(source, tmp_path):
    done = complete(f"{source}:1:1", "--model", str(tmp_path / "no-such-model"))
    _one_sentence(done, "no-such-model", "--model")
