"""The documents a newcomer reads stay what they promise: a short README whose file tree names every module, results
headed by when and how they were measured, and no lab-notebook language."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
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


def test_each_results_section_names_its_commit_and_command():
    text = (REPO / "benchmarks" / "RESULTS.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    bare = [s.splitlines()[0] for s in sections
            if not (re.search(r"\bcommit [0-9a-f]{7}\b", s) and re.search(r"`(bash )?benchmarks/\w+\.(py|sh)", s))]
    assert bare == [], f"RESULTS.md sections without a commit or a command: {bare}"


def test_the_benchmarks_readme_lists_every_benchmark():
    text = (REPO / "benchmarks" / "README.md").read_text()
    scripts = sorted(p.name for p in (REPO / "benchmarks").iterdir() if p.suffix in {".py", ".sh"})
    assert [name for name in scripts if f"`{name}`" not in text] == []


def test_links_between_the_documents_resolve():
    broken = []
    for doc in [README, REPO / "benchmarks" / "README.md", REPO / "benchmarks" / "RESULTS.md",
                *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)\)", doc.read_text()):
            if "://" not in target and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert broken == []


TIMING = re.compile(r"\b\d+(\.\d+)? ?(ms|µs)\b")


def test_the_design_document_states_decisions_without_timings():
    text = (REPO / "docs" / "how-it-works.md").read_text()
    assert [line for line in text.splitlines() if TIMING.search(line)] == []


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    source = path.read_text()
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
    return found


def test_no_timing_in_a_comment_or_docstring():
    found = []
    for path in sorted((REPO / "rest_lsp").rglob("*.py")):
        name = str(path.relative_to(REPO))
        found += [f"{name}:{line}" for line, text in comments_and_docstrings(path) if TIMING.search(text)]
    assert found == [], f"timings in comments or docstrings (state the rule; figures go to RESULTS.md): {found}"
