"""The documents a newcomer reads stay what they promise: a short README whose file tree names every module, results
headed by when and how they were measured, and no lab-notebook language."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def test_the_readme_is_short():
    assert len(README.read_bytes()) <= 12 * 1024


def test_the_readme_file_tree_names_every_module():
    text = README.read_text()
    tree = text[text.index("## Files"):]
    missing = [str(p.relative_to(REPO)) for p in sorted((REPO / "rest_lsp").rglob("*.py"))
               if p.name != "__init__.py" and not re.search(rf"\b{re.escape(p.name)}\b", tree)]
    assert missing == [], f"README's file tree lacks {missing}"


def test_each_results_section_says_when_and_on_what():
    text = (REPO / "benchmarks" / "RESULTS.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    undated = [s.splitlines()[0] for s in sections if not re.search(r"\b20\d\d-\d\d-\d\d\b", s)]
    assert undated == [], f"RESULTS.md sections without a date: {undated}"


def test_no_lab_notebook_language_in_tracked_files():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = REPO / name
        if path.suffix not in {".md", ".py", ".ts", ".lua", ".sh", ".toml"} or not path.is_file():
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.search(r"\b(this|last|previous) stop\b", line, re.I) and name != "tests/test_docs.py":
                found.append(f"{name}:{i}")
    assert found == []
