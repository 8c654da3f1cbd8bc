"""benchmarks/harness.py: picking real code, and the result JSON's date, commit and machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness import (  # noqa: E402
    completion_points, corpus_files, function_starts, python_files, text_after_function, write_json)

FILE = "import os\n" + "# filler line\n" * 40 + "def f(a):\n    return a\n\n\nclass C:\n    def g(self):\n        pass\n" \
    + "# tail line\n" * 30


def test_function_starts_are_body_starts_away_from_the_file_ends():
    starts = function_starts(FILE)
    assert [FILE[s:].split("\n", 1)[0] for s in starts] == ["    return a", "        pass"]
    assert function_starts("def f():\n    pass\n") == []  # nothing above it


def test_completion_points_are_seeded_and_at_most_two_per_file(tmp_path):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(FILE * 2)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "c.py").write_text(FILE)
    files = python_files(tmp_path)
    assert [p.name for p in files] == ["a.py", "b.py"]
    points = completion_points(files, 10, seed=1)
    assert len(points) == 4 and points == completion_points(files, 10, seed=1)
    assert text_after_function(FILE, function_starts(FILE)[0]).startswith("class C:")


def test_corpus_files_keep_the_files_that_parse_with_newline_breaks(tmp_path):
    (tmp_path / "ok.py").write_text("x = 1\n")
    (tmp_path / "bad.py").write_text("def (:\n")
    (tmp_path / "crlf.py").write_bytes(b"x = 1\r\n")
    assert corpus_files(tmp_path) == {"ok.py": "x = 1\n"}


def test_a_result_says_when_where_and_from_which_commit(tmp_path):
    path = write_json(tmp_path / "deep" / "r.json", {"rows": [1]}, ["bench.py", "--x"])
    data = json.loads(path.read_text())
    assert data["rows"] == [1] and data["run"]["command"] == "bench.py --x"
    assert data["run"]["date"].endswith("+00:00") and len(data["run"]["commit"]) == 40
    assert data["run"]["machine"]["cores"] >= 1 and data["run"]["machine"]["cpu"]
