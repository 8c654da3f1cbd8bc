"""The packed panels of a .gguf loaded from its blocks, kept in one file per model so a later load skips decoding,
checking and packing: it reads the file's data once into memory of 2 MB pages (huge_pages: a step streams its
panels faster from them than from the page cache's 4 KB pages a mapping of the file would run on) and its matmuls
run on those bytes.

The file (in the models cache folder, named by the .gguf's content digest and PACK_FORMAT: model_source) is MAGIC,
the header's length (8 bytes, little-endian), the header (JSON: the key it was written for, PACK_FORMAT, the panel
width, the data's length and CRC-32, the kept-blocks counts, and per matmul its name and its parts as [format code,
first row, rows, panels, bytes per panel, offset]), zeros up to the next multiple of ALIGN, then the data: each
part's panels at an offset that is a multiple of 64. It is written once, atomically (cache_dir.write_chunks).

Read back, nothing in it is trusted: a file that is not this user's alone (cache_dir.open_private), of another key
or PACK_FORMAT, whose size is not the header's, whose parts do not cover each matmul's rows with panels of the
shape the .gguf's tensors give, or whose data's CRC-32 differs (a pass over the bytes the first step reads anyway)
is not used (one log line) and is written again from the blocks.
"""

from __future__ import annotations

import json
import logging
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from rest_lsp import cache_dir
from rest_lsp.engine import huge_pages

log = logging.getLogger(__name__)

PACK_FORMAT = 2  # the layout of quant_matmul.pack_blocks' panels: a change of that layout changes this number
MAGIC = b"RLPANELS"
ALIGN = 4096  # the data starts on a page
PART_ALIGN = 64  # each part's panels start on a cache line


class Damaged(ValueError):
    """The kept file does not hold what its header and the .gguf say it holds."""


def read(path: Path, key: str, shapes: dict[str, tuple[int, int]]) -> tuple[dict, dict] | None:
    """({matmul name: [(format code, first row, rows, panels uint8 [P, B] read from the file)]}, kept counts) of
    the kept file `path`, checked against `shapes` ({matmul name: (rows, width)}); None (one log line unless it is
    just missing) when it is missing or not to be used."""
    try:
        with cache_dir.open_private(path) as f:
            return _parse(f, key, shapes)
    except FileNotFoundError:
        return None
    except (OSError, Damaged, ValueError, KeyError, TypeError) as err:
        log.warning("The kept panels %s are not used (%s); packing the .gguf's blocks again.", path,
                    str(err) or type(err).__name__)
        return None


def _parse(f, key: str, shapes: dict[str, tuple[int, int]]):
    from rest_lsp.kernels import quant_matmul

    start = f.read(len(MAGIC) + 8)
    if len(start) != len(MAGIC) + 8 or start[: len(MAGIC)] != MAGIC:
        raise Damaged("not a panels file")
    (length,) = struct.unpack("<Q", start[len(MAGIC):])
    size = f.seek(0, 2)
    if length > size:
        raise Damaged("a header longer than the file")
    f.seek(len(MAGIC) + 8)
    head = json.loads(f.read(length))
    if head["key"] != key or head["format"] != PACK_FORMAT or head["panel"] != quant_matmul.PANEL:
        raise Damaged("written for another file or panel layout")
    data_at = _round(len(MAGIC) + 8 + length, ALIGN)
    if size != data_at + head["data_bytes"]:
        raise Damaged(f"{size} bytes where its header says {data_at + head['data_bytes']}")
    matmuls = head["matmuls"]
    if set(matmuls) != set(shapes):
        raise Damaged("other matmuls than the .gguf's")
    data = huge_pages.empty((head["data_bytes"],)).numpy()  # read once into 2 MB pages, which a step streams faster
    f.seek(data_at)
    view, done = memoryview(data), 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise Damaged("shorter than its header says")
        done += got
    if zlib.crc32(data) != head["crc32"]:
        raise Damaged("its data's CRC-32 differs")
    found = {name: [_part(data, part, width, quant_matmul) for part in matmuls[name]]
             for name, (rows, width) in shapes.items()}
    for name, (rows, _) in shapes.items():
        covered = 0
        for _, first, n, _ in found[name]:
            if first != covered:
                raise Damaged(f"parts of {name} that do not follow each other")
            covered += n
        if covered != rows:
            raise Damaged(f"{covered} rows of {name}'s {rows}")
    return found, {int(b): int(n) for b, n in head["kept"].items()}


def _part(data: np.ndarray, part: list, width: int, quant_matmul):
    bits, first, rows, count, nbytes, offset = (int(v) for v in part)
    if bits not in quant_matmul.CODES or rows <= 0 or count != -(-rows // quant_matmul.PANEL):
        raise Damaged("a part of another format or panel count")
    if nbytes != quant_matmul.panel_bytes(width, bits) or offset % PART_ALIGN or offset < 0:
        raise Damaged("a part of another width or place")
    if offset + count * nbytes > data.shape[0]:
        raise Damaged("a part past the end")
    return bits, first, rows, torch.from_numpy(data[offset : offset + count * nbytes]).view(count, nbytes)


def write(path: Path, key: str, matmuls: dict[str, list], kept: dict[int, int]) -> None:
    """Keeps `matmuls` ({name: [(format code, first row, rows, panels uint8 [P, B])]}) in `path`, atomically; a
    failure is logged and only costs the next load its packing. Other users' and older entries: cache_dir.prune."""
    index, offset = {}, 0
    for name, parts in matmuls.items():
        index[name] = []
        for bits, first, rows, panels in parts:
            index[name].append([bits, first, rows, panels.shape[0], panels.shape[1], offset])
            offset = _round(offset + panels.numel(), PART_ALIGN)
    crc = 0
    for chunk in _data(matmuls):
        crc = zlib.crc32(chunk, crc)
    from rest_lsp.kernels import quant_matmul

    head = json.dumps({"key": key, "format": PACK_FORMAT, "panel": quant_matmul.PANEL, "data_bytes": offset,
                       "crc32": crc, "kept": {str(b): n for b, n in kept.items()}, "matmuls": index}).encode()
    lead = MAGIC + struct.pack("<Q", len(head)) + head
    lead += bytes(_round(len(lead), ALIGN) - len(lead))
    try:
        cache_dir.write_chunks(path, [lead, *_data(matmuls)])
        cache_dir.prune(path.parent, current=path, max_bytes=cache_dir.MODELS_BYTES)
    except OSError as err:
        log.warning("Could not keep the packed panels in %s (%s); the next load packs them again.", path, err)


def _data(matmuls: dict[str, list]):
    """The data's buffers in order: each part's panels, then zeros up to the next part's offset."""
    for parts in matmuls.values():
        for *_, panels in parts:
            yield memoryview(panels.contiguous().numpy()).cast("B")
            if pad := _round(panels.numel(), PART_ALIGN) - panels.numel():
                yield bytes(pad)


def _round(n: int, to: int) -> int:
    return -(-n // to) * to
