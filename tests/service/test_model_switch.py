"""A model switch: nothing the old model wrote is served under the new one, neither a completion it was still decoding
at the switch (held there by the step gate) nor a suggestion shown before it (type-through)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from step_gate import StepGate
from support import chain_model, wait_for

from rest_lsp.service.completion import CompletionService
from rest_lsp.settings import Settings

MAX_NEW = 8


@pytest.fixture(scope="module")
def y_model(tiny_models, tmp_path_factory) -> Path:
    """A model that writes "y" after anything, forever (the constant model writes "x")."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    return chain_model(tmp_path_factory.mktemp("constant-y"), tok, [tok.convert_tokens_to_ids("y")])


def _started(model: Path) -> CompletionService:
    svc = CompletionService(Settings(model=str(model), dtype="float32", max_new_tokens=MAX_NEW, draft_budget=0,
                                     debounce_ms=0, index_workspace=False, prefetch=False))
    svc.start([])
    assert svc.wait_ready(120), svc.load_error
    return svc


def _switch(svc: CompletionService, model: Path) -> None:
    svc.update_settings(dataclasses.replace(svc.settings, model=str(model)))
    wait_for(lambda: svc.stats()["model"] == str(model), 120, "the new model to serve")


def test_a_completion_the_old_model_was_decoding_is_neither_served_nor_cached(tiny_models, y_model, monkeypatch):
    gate = StepGate.in_process(monkeypatch)
    svc = _started(tiny_models["constant"])
    try:
        old = svc.submit("mem://v.py", "v = ", 4)
        assert gate.started.wait(120), "the old model's completion never started decoding"
        _switch(svc, y_model)  # while the old model's first step is held
        gate.release.set()
        assert old.future.result(120) is None  # the old code: "xxxxxxxx", then cached
        assert gate.results[0].tokens  # it did decode to its end: its text was dropped, not its work stopped
        new = svc.submit("mem://v.py", "v = ", 4).future.result(120)
        assert new is not None and new.source == "model" and new.text == "y" * MAX_NEW
        assert svc.stats()["cache_hits"] == 0
    finally:
        gate.release.set()
        svc.close()


def test_type_through_does_not_survive_a_model_switch(tiny_models, y_model):
    svc = _started(tiny_models["constant"])
    try:
        shown = svc.submit("mem://t.py", "t = ", 4).future.result(120)
        assert shown is not None and shown.text == "x" * MAX_NEW
        _switch(svc, y_model)
        typed = svc.submit("mem://t.py", "t = x", 5).future.result(120)  # the old code: "xxxxxxx", typed through
        assert typed is not None and typed.source == "model" and typed.text == "y" * MAX_NEW
        assert svc.stats()["type_through"] == 0
    finally:
        svc.close()
