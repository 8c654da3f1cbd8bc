"""The README's "a .gguf is dequantized once and kept under the user's cache folder": the first load of the default
model into an empty cache converts it, the second reads the converted copy and converts nothing."""

import pytest
import torch

from rest_lsp.engine import model
from rest_lsp.engine.model import DEFAULT_GGUF_NAME, load_model

pytestmark = pytest.mark.slow


def test_a_gguf_is_converted_once(tmp_path, monkeypatch):
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path))
    loads = []  # the gguf file name of each transformers load (None: a plain model folder)
    from_pretrained = model._from_pretrained

    def counted(folder, gguf_file, dtype):
        loads.append(gguf_file)
        return from_pretrained(folder, gguf_file, dtype)

    monkeypatch.setattr(model, "_from_pretrained", counted)
    first = load_model(None, "cpu", "float32")
    assert loads == [DEFAULT_GGUF_NAME], loads  # dequantized from the .gguf
    kept = [p for p in (tmp_path / "models").iterdir()]
    assert len(kept) == 1 and (kept[0] / "config.json").is_file(), kept  # one converted folder, no leftovers
    written = {p: p.stat().st_mtime_ns for p in kept[0].rglob("*")}

    loads.clear()
    second = load_model(None, "cpu", "float32")
    assert loads == [None], loads  # the converted folder, not the .gguf
    assert {p: p.stat().st_mtime_ns for p in kept[0].rglob("*")} == written  # nothing written again
    assert list((tmp_path / "models").iterdir()) == kept
    for (name, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), name
