"""The packed panels of a .gguf loaded from its blocks, kept for the next load (engine/panel_cache.py): a warm load
reads them and decodes, checks and packs nothing, with the cold load's panels and logits bit for bit; a kept file that
is truncated, tampered with, another model's or not this user's alone is not used (one warning) and written again;
a cache folder others may write keeps none."""

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from gguf_writer import write_gguf as write_random_gguf
from test_gguf_direct import assert_same_as_todays
from test_gguf_mode import needs_kernel, write_gguf

from rest_lsp.engine import gguf_blocks, gguf_direct, huge_pages, panel_cache, runmode
from rest_lsp.engine.decoding import Decoder
from rest_lsp.engine.model import load_model
from rest_lsp.kernels import quant_matmul


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    needs_kernel()
    monkeypatch.setenv("REST_LSP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(runmode.DTYPE_ENV, raising=False)
    return tmp_path / "cache"


def kept_files(cache: Path) -> list[Path]:
    return sorted((cache / "models").glob("*.panels"))


def no_packing(monkeypatch):
    """Makes decoding, dequantizing or packing any block fail the test."""
    def fail(*args, **kwargs):
        pytest.fail("decoded or packed blocks on a warm load")

    monkeypatch.setattr(gguf_blocks, "decode", fail)
    monkeypatch.setattr(quant_matmul, "pack_blocks", fail)
    monkeypatch.setattr(quant_matmul, "quantize_q8_0", fail)


@pytest.mark.parametrize("which", ["qwen2-tied", "odd-widths"])
def test_a_warm_load_reads_the_cold_loads_panels_and_packs_nothing(tmp_path, cache, monkeypatch, which):
    """q/k/v biases and a tied head; and a fused q/k/v packed in one piece (its q rows end inside a panel). The
    panels go into memory advised as huge pages (huge_pages; its page size shrunk here to a small page, so that a
    tiny model's panels take some): the cold load's packed into one arena in build order, the warm load's data
    read into one."""
    monkeypatch.setattr(huge_pages, "HUGE", 4096)
    if which == "qwen2-tied":
        path = write_gguf(tmp_path / "tiny-qwen2.gguf", "qwen2", True)
    else:
        path = write_random_gguf(tmp_path / "odd.gguf", hidden=72, heads=4, kv=2, ffn=136)
    cold = Decoder(load_model(str(path), "cpu", "gguf"))
    [kept] = kept_files(cache)
    written = kept.stat().st_mtime_ns
    with monkeypatch.context() as m:
        no_packing(m)
        loaded = load_model(str(path), "cpu", "gguf")
        warm = Decoder(loaded)
    assert isinstance(loaded.model, gguf_direct.GgufModel)
    assert kept_files(cache) == [kept] and kept.stat().st_mtime_ns == written  # read, not written again
    # the panels are read into advised memory, not left in the page cache's pages of a mapping of the file
    advice = huge_pages.ADVICE is not None and Path("/proc/self/smaps").exists()
    for matmul in (warm.lean.head, warm.lean.layers[0].qkv, warm.lean.layers[-1].down):
        assert all(not mapped_from(kept, part.panels) for part in matmul.parts)
        assert all(huge_pages.advised(part.panels) == advice for part in matmul.parts)
    # the cold load packs into one arena in the order it builds (the head, then each layer's matmuls in a step's
    # order), as the warm load reads them: side by side, each at least a page of advised memory
    order = [cold.lean.head] + [getattr(layer, name) for layer in cold.lean.layers
                                for name in ("qkv", "o", "gate_up", "down")]
    arena = cold.lean.head.parts[0].panels.untyped_storage().data_ptr()
    packed = [part.panels for matmul in order for part in matmul.parts
              if part.panels.untyped_storage().data_ptr() == arena]
    assert {id(p) for p in packed} >= {id(part.panels) for matmul in (cold.lean.layers[0].o, cold.lean.layers[-1].down)
                                        for part in matmul.parts}
    # side by side: panels packed and then not used (a fused matmul packed in one piece) were given back
    assert all(a.data_ptr() + a.numel() == b.data_ptr() for a, b in zip(packed, packed[1:]))
    assert all(huge_pages.advised(p) == advice for p in packed)
    assert_same_as_todays(warm, cold, [3, 14, 15, 2, 9, 7, 1, 5])


def mapped_from(kept: Path, t: torch.Tensor) -> bool:
    """Whether the tensor's bytes lie in a mapping of the file `kept` (/proc/self/maps)."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(kept):
            start, stop = (int(v, 16) for v in fields[0].split("-"))
            if start <= lo and hi <= stop:
                return True
    return False


def _damage(kept: Path, how: str, other: Path) -> None:
    data = bytearray(kept.read_bytes())
    if how == "truncated":
        data = data[: len(data) - 100]
    elif how == "a panel byte flipped":
        data[-200] ^= 0x40
    elif how == "header tampered":  # the head's one part claims a row fewer, the file otherwise whole
        length = int.from_bytes(data[8:16], "little")
        head = json.loads(data[16 : 16 + length])
        head["matmuls"]["head"][0][2] -= 1
        new = json.dumps(head).encode()
        assert 16 + len(new) <= panel_cache.ALIGN
        data[8 : 16 + length] = len(new).to_bytes(8, "little") + new + b" " * (length - len(new))
    elif how == "another model's":
        data = bytearray(other.read_bytes())
    elif how == "not a panels file":
        data = bytearray(b"{}" * 100)
    kept.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "a panel byte flipped", "header tampered", "another model's",
                                 "not a panels file"])
def test_a_damaged_kept_file_is_not_used_and_written_again(tmp_path, cache, monkeypatch, how, caplog):
    other_path = write_random_gguf((tmp_path / "o").mkdir() or tmp_path / "o" / "other.gguf", hidden=64, seed=3)
    load_model(str(other_path), "cpu", "gguf")
    [other] = kept_files(cache)
    path = write_gguf(tmp_path / "tiny-qwen2.gguf", "qwen2", True)
    cold = Decoder(load_model(str(path), "cpu", "gguf"))
    [kept] = [p for p in kept_files(cache) if p != other]
    good = kept.read_bytes()
    _damage(kept, how, other)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.panel_cache"):
        again = Decoder(load_model(str(path), "cpu", "gguf"))
    assert len(caplog.records) == 1 and "are not used" in caplog.text, caplog.text
    assert kept.read_bytes() == good  # written again as the first load wrote it
    assert_same_as_todays(again, cold, [3, 14, 15, 2, 9])
    with monkeypatch.context() as m:
        no_packing(m)
        assert_same_as_todays(Decoder(load_model(str(path), "cpu", "gguf")), cold, [3, 14, 15])


def test_a_kept_file_another_user_could_write_is_not_used(tmp_path, cache, caplog):
    path = write_gguf(tmp_path / "tiny-qwen2.gguf", "qwen2", True)
    load_model(str(path), "cpu", "gguf")
    [kept] = kept_files(cache)
    kept.chmod(0o666)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.panel_cache"):
        load_model(str(path), "cpu", "gguf")
    assert "writable by group or others" in caplog.text
    assert os.stat(kept).st_mode & 0o777 == 0o600  # replaced by this load's own file


def test_a_cache_folder_others_may_write_keeps_no_panels(tmp_path, cache, monkeypatch, caplog):
    path = write_gguf(tmp_path / "tiny-qwen2.gguf", "qwen2", True)
    (cache / "models").mkdir(parents=True)
    (cache / "models").chmod(0o777)
    read = []
    monkeypatch.setattr(panel_cache, "read", lambda *a, **k: read.append(a))
    with caplog.at_level(logging.WARNING):
        load_model(str(path), "cpu", "gguf")
        load_model(str(path), "cpu", "gguf")
    assert read == [] and kept_files(cache) == []
    assert "is not used: it is writable by group or others" in caplog.text


def test_a_new_panel_layout_packs_again(tmp_path, cache, monkeypatch):
    path = write_gguf(tmp_path / "tiny-qwen2.gguf", "qwen2", True)
    load_model(str(path), "cpu", "gguf")
    [first] = kept_files(cache)
    monkeypatch.setattr(panel_cache, "PACK_FORMAT", panel_cache.PACK_FORMAT + 1)
    load_model(str(path), "cpu", "gguf")
    assert len(kept_files(cache)) == 2 and first in kept_files(cache)
