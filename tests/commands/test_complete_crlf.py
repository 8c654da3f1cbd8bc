"""`rest-lsp complete` reads a file as an editor sends it: CRLF and lone CR line breaks are kept, so the prompt, and the
answer, are the server's; lines are counted where LSP counts them."""

import subprocess
import sys

import pytest
from support import greedy

from rest_lsp.commands.complete import offset_of

BEFORE = "def add(a, b):\r\n    return a + b\r\n\r\nresult = add("
MAX_NEW = 8


@pytest.mark.parametrize("text, line, col, expected", [
    ("a\r\nbc\r\nd", 2, 2, 4),  # after "b": CRLF is one break
    ("a\rbc\rd", 2, 3, 4),  # a lone CR ends a line too
    ("a\rbc\rd", 3, 1, 5),
    ("a\u2028b\n", 1, 4, 3),  # U+2028 is no LSP line break: the end of line 1
    ("a\r\n", 2, 1, 3),  # the empty line after a final break
])
def test_lines_end_where_lsp_ends_them(text, line, col, expected):
    assert offset_of(text, line, col) == expected


@pytest.mark.parametrize("text, line, col, message", [
    ("a\rb\rc", 4, 1, "Line 4 is past the end of the file (3 lines)."),
    ("ab\r\nc", 1, 4, "Column 4 is past the end of line 1 (2 characters)."),
])
def test_a_place_outside_the_text(text, line, col, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        offset_of(text, line, col)


def test_a_crlf_file_gets_the_completion_of_its_own_text(tiny_models, tmp_path):
    path = tmp_path / "a.py"
    path.write_bytes(BEFORE.encode())
    crlf = greedy(tiny_models["random"], BEFORE, "", MAX_NEW)
    assert crlf != greedy(tiny_models["random"], BEFORE.replace("\r\n", "\n"), "", MAX_NEW)  # the old code's answer
    done = subprocess.run([sys.executable, "-m", "rest_lsp.cli", "complete", f"{path}:4:14", "--model",
                           str(tiny_models["random"]), "--dtype", "float32", "--no-index", "--max-new-tokens",
                           str(MAX_NEW), "--suggestion-cache-size", "0", "--no-prefetch"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == crlf + "\n"
