"""A real FIM code model (Qwen2.5-Coder-0.5B, in the gguf mode: its file's own blocks, as a person runs it) answers
at every place a person asks, and REST writes what plain decoding writes there (the gguf mode claims exactness).
Slow: loads a 0.5B model; skips when the model file is not here. REST against `generate` in float32 is
tests/engine/test_exactness.py's."""

import dataclasses
import os
import re
from pathlib import Path

import pytest

from rest_lsp.service.completion import CompletionService
from rest_lsp.settings import Settings

pytestmark = pytest.mark.slow

# place -> (text before the cursor, text after it, what a sensible suggestion there matches)
PLACES = {
    "auto-indented line, spaces": ("def add(a, b):\n    ", "\n", r"^return\b.*\ba\b.*\bb\b"),
    "auto-indented line, tabs": ("def add(a, b):\n\t", "\n", r"^return\b.*\ba\b.*\bb\b"),
    "after a block opener": ("def add(a, b):", "\n", r"^\n[ \t]+return\b"),
    "end of the file": ("import os\n\n\ndef list_files(path):\n    ", "", r"^\S"),
    "indented block, text below": ("def total(xs):\n    s = 0\n    for x in xs:\n        ", "\n    return s\n",
                                   r"^s\b.*\bx\b"),
    "mid-line, text after": ("def biggest(a, b):\n    return max(", ")\n", r"\ba\b.*\bb\b"),
    "CRLF line endings": ("def add(a, b):\r\n    ", "\r\n", r"^return\b.*\ba\b.*\bb\b"),
    "second body line": ("def area(w, h):\n    \"\"\"The area of a rectangle.\"\"\"\n    ",
                         "\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n", r"^return\b.*\bw\b.*\bh\b"),
}


def code_model_path() -> Path:
    """The code model's GGUF where ../shared/models/get_qwen_coder.sh puts it (never fetched here), or a skip."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    path = Path(os.environ.get("REST_LSP_CODE_MODEL") or
                cache / "rest-lsp/models/qwen2.5-coder/qwen2.5-coder-0.5b-instruct.gguf")
    if not path.is_file():
        pytest.skip(f"no code model at {path} (../shared/models/get_qwen_coder.sh)")
    return path


@pytest.fixture(scope="module")
def suggestions(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    """Each place's suggestion with REST (draftBudget 16) and without (0), no time budget: set by the text alone."""
    settings = Settings(model=str(code_model_path()), dtype="gguf", max_new_tokens=24, debounce_ms=0,
                        time_budget_ms=0, wait_budget_ms=0, index_workspace=False, prefetch=False,
                        suggestion_cache_size=0, cache_dir=str(tmp_path_factory.mktemp("cache")))
    service = CompletionService(settings)
    found: dict[str, dict[int, str | None]] = {}
    try:
        service.start([])
        assert service.wait_ready(1200), service.load_error
        assert service.stats()["fim"] == "qwen"
        for budget in (16, 0):
            service.update_settings(dataclasses.replace(service.settings, draft_budget=budget))
            for i, (name, (before, after, _)) in enumerate(PLACES.items()):
                c = service.submit(f"mem://place{i}-{budget}.py", before + after, len(before)).future.result(600)
                found.setdefault(name, {})[budget] = c.text if c is not None else None
    finally:
        service.close()
    return found


@pytest.mark.parametrize("place", list(PLACES))
def test_the_code_model_suggests_something_sensible(suggestions, place):
    text = suggestions[place][16]
    assert text and re.search(PLACES[place][2], text), f"{place}: {text!r}"


@pytest.mark.parametrize("place", list(PLACES))
def test_rest_writes_what_plain_decoding_writes(suggestions, place):
    assert suggestions[place][16] == suggestions[place][0]
