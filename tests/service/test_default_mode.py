"""The mode a model loads in when no dtype is asked for: this machine's default (bfloat16 where the CPU computes
it, float32 elsewhere for a model folder), or the one REST_LSP_DTYPE names in its place. Marked `default_dtype`:
`./dev.sh test` runs these a second time with REST_LSP_DTYPE set, so both paths run on any machine. In a mode that
claims it (float32, float16-weights), REST writes what plain decoding of the same mode writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import EXACT_MODES, greedy, modes_here

from rest_lsp.service.completion import CompletionService
from rest_lsp.settings import Settings

pytestmark = pytest.mark.default_dtype

BEFORE = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return"
AFTER = "\n"


def expected_mode() -> str:
    """What a load without a dtype runs here: REST_LSP_DTYPE's mode where this machine runs it natively, else
    float32 (the loader says why in one sentence); without it, bfloat16 where native, else float32."""
    here = modes_here()
    forced = os.environ.get("REST_LSP_DTYPE")
    if forced:
        return forced if forced in here else "float32"
    return "bfloat16" if "bfloat16" in here else "float32"


def _service(model, tmp_path, **settings) -> CompletionService:
    svc = CompletionService(Settings(model=str(model), max_new_tokens=16, debounce_ms=0, index_workspace=False,
                                     suggestion_cache_size=0, prefetch=False, cache_dir=str(tmp_path), **settings))
    svc.start([])
    assert svc.wait_ready(120), svc.load_error
    return svc


def test_a_service_without_a_dtype_runs_the_default_mode_and_rest_writes_what_plain_decoding_does(tiny_models,
                                                                                                  tmp_path):
    model = tiny_models["random"]
    rest, plain = _service(model, tmp_path / "rest"), _service(model, tmp_path / "plain", draft_budget=0)
    try:
        mode = expected_mode()
        assert rest.stats()["dtype"] == plain.stats()["dtype"] == mode
        for tail in ("", "\n\nresult = add(", "\n\nvalues = [add(i, i) for i in"):
            before = BEFORE + tail
            a = rest.submit("mem://r.py", before + AFTER, len(before)).future.result(120)
            b = plain.submit("mem://p.py", before + AFTER, len(before)).future.result(120)
            assert a is not None and b is not None
            if mode in EXACT_MODES:
                assert a.text == b.text, (mode, tail)
            if mode == "float32":
                assert a.text == greedy(model, before, AFTER, 16), tail
    finally:
        rest.close()
        plain.close()


def test_the_cli_without_a_dtype_runs_the_default_mode(tiny_models, tmp_path):
    prompt = tmp_path / "p.py"
    prompt.write_text(BEFORE)
    done = subprocess.run([sys.executable, "-m", "rest_lsp.cli", "generate", str(prompt), "--model",
                           str(tiny_models["random"]), "--json", "--max-new-tokens", "4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dtype"] == expected_mode()
