"""A .gguf's header, metadata and tensor table, read without its vocabulary and checked against the file's size.

gguf-py's GGUFReader turns every array of the file into numpy objects (a code model's 150k tokens and merges: many
seconds) and trusts what the header claims. Here every count, length, dimension, type and offset is checked against
the bytes the file really has before anything is built from it, arrays of strings are stepped over (only their
lengths are read), and numeric arrays are kept only when short. A file that breaks a rule raises BadGguf with one
sentence; nothing here allocates more than the file's own header holds.

Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count; each metadata
entry a string key, a u32 value type and the value (an array: u32 element type, u64 count, the elements); each
tensor a string name, u32 dims, u64 per dim (innermost first), u32 GGML type, u64 offset into the data section,
which starts at the next multiple of general.alignment (32 by default) after the table. Strings are a u64 length
and UTF-8 bytes.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
KEPT_ARRAY = 4096  # numeric arrays up to this many elements are kept (per-layer head counts); longer ones skipped
MAX_NAME = 256  # a metadata key or tensor name longer than this is not one (llama.cpp's: 64)
MAX_STRING = 1 << 24  # a metadata string longer than this (16 MiB) is not a GGUF string

# metadata value types: struct format of a scalar (STRING = 8 and ARRAY = 9 are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class BadGguf(ValueError):
    """The file is not a GGUF file this reader can trust; the message is one sentence."""


@dataclass(frozen=True)
class Tensor:
    """One entry of the tensor table, checked: its bytes lie inside the file."""

    name: str
    shape: tuple[int, ...]  # GGUF order: innermost (row length) first
    type_id: int
    offset: int  # absolute, from the start of the file
    nbytes: int
    path: str

    @property
    def tensor_type(self):
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.type_id)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def data(self) -> np.ndarray:
        """The raw bytes, memory-mapped, as [rows, bytes per row] (uint8)."""
        rows = self.n_elements // self.shape[0] if self.shape and self.shape[0] else 0
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.offset, shape=(self.nbytes,))
        return raw.reshape(rows, self.nbytes // rows if rows else 0)


@dataclass
class Header:
    path: str
    version: int
    size: int  # bytes of the file
    fields: dict[str, object]  # scalars and strings; kept numeric arrays as lists
    array_lengths: dict[str, int]  # every array's element count, kept or not
    tensors: dict[str, Tensor] = field(default_factory=dict)
    data_offset: int = 0

    @property
    def arch(self) -> str:
        arch = self.fields.get("general.architecture")
        return arch if isinstance(arch, str) else ""

    def get(self, key: str, kind: type | tuple[type, ...] = (int, float, str, bool, list)):
        """The value of `key` if it has the type `kind` (bool is not an int here); else None."""
        value = self.fields.get(key)
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            return None
        return value if isinstance(value, kind) else None


class _Cursor:
    def __init__(self, buf, name: str):
        self.buf, self.pos, self.name = buf, 0, name

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise BadGguf(f"{self.name} is truncated or damaged: its {what} runs past the end of the file "
                          f"({len(self.buf)} bytes).")

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self, what: str, name_like: bool = False) -> str:
        """A GGUF string; `name_like`: a key or tensor name, printable and short (it goes into messages)."""
        n = self.unpack("<Q", what)
        if n > MAX_STRING:
            raise BadGguf(f"{self.name} is damaged: its {what} claims {n} bytes.")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadGguf(f"{self.name} is damaged: its {what} is not UTF-8 text.") from None
        if name_like and not (text.isprintable() and len(text) <= MAX_NAME):
            raise BadGguf(f"{self.name} is damaged: its {what} is not a name (unprintable or too long).")
        return text

    def skip_strings(self, count: int, what: str) -> None:
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                break
            pos += 8 + unpack(buf, pos)[0]
        self.pos = pos
        self.need(0, what)


def read(path: str | Path) -> Header:
    """The header and tensor table of the .gguf at `path`, every claim checked against the file; BadGguf (one
    sentence) when the file breaks a rule, OSError when it cannot be read."""
    path = str(path)
    name = f"'{Path(path).name}'"
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise BadGguf(f"{name} is not a GGUF file: it has only {size} bytes.")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _parse(buf, path, name, size)
            finally:
                del buf  # no exported views may outlive the map


def _parse(buf, path: str, name: str, size: int) -> Header:
    cur = _Cursor(memoryview(buf), name)
    try:
        if bytes(buf[:4]) != MAGIC:
            raise BadGguf(f"{name} is not a GGUF file (it does not start with 'GGUF').")
        version = cur.unpack("<4xI", "version")
        if version not in VERSIONS:
            swapped = struct.unpack("<I", struct.pack(">I", version))[0]
            which = "a big-endian GGUF file" if swapped in VERSIONS else f"GGUF version {version}"
            raise BadGguf(f"{name} is {which}; rest-lsp reads little-endian GGUF versions 2 and 3.")
        n_tensors, n_kv = cur.unpack("<Q", "tensor count"), cur.unpack("<Q", "metadata count")
        # each entry takes at least: a key (8) and a type (4) plus a byte; a tensor 8 + 4 + 4 + 8 bytes
        if n_kv * 13 > size or n_tensors * 24 > size:
            raise BadGguf(f"{name} is damaged: it claims {n_kv} metadata entries and {n_tensors} tensors in "
                          f"{size} bytes.")
        header = Header(path, version, size, {}, {})
        for _ in range(n_kv):
            _read_entry(cur, header)
        alignment = header.fields.get("general.alignment", 32)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):  # bool is no alignment
            raise BadGguf(f"{name} is damaged: general.alignment is {alignment!r}, not a power of two.")
        table = [_read_tensor(cur, name) for _ in range(n_tensors)]
        header.data_offset = -(-cur.pos // alignment) * alignment
        for tensor_name, shape, type_id, offset in table:
            if tensor_name in header.tensors:
                raise BadGguf(f"{name} is damaged: it lists tensor {tensor_name} twice.")
            header.tensors[tensor_name] = _checked_tensor(name, path, size, header.data_offset, alignment,
                                                          tensor_name, shape, type_id, offset)
        _check_overlaps(name, list(header.tensors.values()))
        return header
    finally:
        cur.buf.release()


def _read_entry(cur: _Cursor, header: Header) -> None:
    key = cur.string("metadata key", name_like=True)
    if key in header.fields or key in header.array_lengths:
        raise BadGguf(f"{cur.name} is damaged: metadata key {key} appears twice.")
    kind = cur.unpack("<I", f"type of {key}")
    if kind == ARRAY:
        elem, count = cur.unpack("<I", f"element type of {key}"), cur.unpack("<Q", f"length of {key}")
        header.array_lengths[key] = count
        if elem == STRING:
            cur.need(count * 8, f"array {key}")
            cur.skip_strings(count, f"array {key}")
        elif elem in _SCALARS:
            width = struct.calcsize(_SCALARS[elem])
            cur.need(count * width, f"array {key}")
            if count <= KEPT_ARRAY:
                header.fields[key] = np.frombuffer(cur.buf, _SCALARS[elem][1:], count, cur.pos).tolist()
            cur.pos += count * width
        else:  # arrays of arrays: no key rest-lsp reads holds one
            raise BadGguf(f"{cur.name} is damaged or too new: metadata {key} is an array of type {elem}.")
    elif kind == STRING:
        header.fields[key] = cur.string(f"value of {key}")
    elif kind in _SCALARS:
        header.fields[key] = cur.unpack(_SCALARS[kind], f"value of {key}")
    else:
        raise BadGguf(f"{cur.name} is damaged: metadata {key} has the unknown value type {kind}.")


def _read_tensor(cur: _Cursor, name: str) -> tuple[str, tuple[int, ...], int, int]:
    tensor_name = cur.string("tensor name", name_like=True)
    n_dims = cur.unpack("<I", f"dimension count of {tensor_name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise BadGguf(f"{name} is damaged: tensor {tensor_name} claims {n_dims} dimensions.")
    shape = tuple(cur.unpack("<Q", f"shape of {tensor_name}") for _ in range(n_dims))
    return tensor_name, shape, cur.unpack("<I", f"type of {tensor_name}"), cur.unpack("<Q", f"offset of {tensor_name}")


def _checked_tensor(name: str, path: str, size: int, data: int, alignment: int, tensor_name: str,
                    shape: tuple[int, ...], type_id: int, offset: int) -> Tensor:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        raise BadGguf(f"{name} is damaged or too new: tensor {tensor_name} has the unknown type {type_id}.") from None
    elements = 1
    for d in shape:
        elements *= d
    if elements == 0 or shape[0] % block:
        raise BadGguf(f"{name} is damaged: tensor {tensor_name} has the shape {list(shape)}, which its type "
                      f"{GGMLQuantizationType(type_id).name} cannot hold.")
    nbytes = elements // block * type_size
    if offset % alignment or data + offset + nbytes > size:
        raise BadGguf(f"{name} is truncated or damaged: tensor {tensor_name} ({nbytes} bytes at offset {offset}) "
                      f"does not lie inside the file's {size} bytes.")
    return Tensor(tensor_name, shape, type_id, data + offset, nbytes, path)


def _check_overlaps(name: str, tensors: list[Tensor]) -> None:
    """Each tensor's bytes are its own: a shape grown past its bytes (a damaged dimension) overlaps the next one."""
    ordered = sorted(tensors, key=lambda t: t.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.nbytes > b.offset:
            raise BadGguf(f"{name} is damaged: tensor {a.name} ({a.nbytes} bytes) overlaps tensor {b.name}.")
