"""Segments on disk: written once, memory-mapped at start, listed by a manifest swapped in last.

A save writes the segments the folder lacks, then a new manifest under a temporary name, then
renames it over the old one. A crash at any point leaves the old manifest and the segments it names
intact; files no manifest names are removed by the next save or load. The manifest records the
tokenizer and the format, so a change of either discards the folder's contents.

What is loaded is checked (shapes, ranges, a crc32 of every array): a damaged folder is cleared and
rebuilt from the disk, with one log line, never served and never a crash.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .scan import Signature
from .segment import SEP, Segment, new_segment_name
from .store import Source

log = logging.getLogger(__name__)

FORMAT_VERSION = 3          # 2: the pair table of each segment; 3: checksums, signatures of 5
MANIFEST = "manifest.json"


def default_cache_dir() -> Path:
    env = os.environ.get("REST_LSP_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("rest-lsp"))


def index_folder(cache_dir: Path, root: Path) -> Path:
    """One folder per workspace root (the tokenizer is checked inside, so a change replaces, not piles up)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", root.name)[:40] or "root"
    return cache_dir / "index" / f"{name}-{hashlib.sha256(str(root).encode()).hexdigest()[:16]}"


@dataclass
class Saved:
    segments: list[Segment]
    files: dict[str, Signature]      # indexed files and their signature when read
    skipped: dict[str, Signature]    # binary or unreadable files, so they are not read again


class IndexFolder:
    """The saved index of one workspace root.

    Segments in memory get names of their own at each load: two roots that share a datastore save the same
    merged segment into both folders under one file stem, and must not install it twice under one name.
    """

    def __init__(self, folder: Path, tokenizer_key: str, root: Path):
        self.folder = folder
        self.tokenizer_key = tokenizer_key
        self.root = str(root)
        self._stems: dict[str, str] = {}       # name of a loaded segment in memory -> its file stem here

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # Two servers on one workspace share the folder; one of them saves or loads at a time.
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def load(self) -> Saved | None:
        """The saved index, memory-mapped; None if there is none or it cannot be trusted (then it is cleared).

        Whatever is wrong with the files (truncated, empty, malformed, out of range, a checksum that fails),
        the answer is the same: one log line, an empty folder, and a rebuild from the disk.
        """
        if not self.folder.is_dir():
            return None
        with self._locked():
            if not (self.folder / MANIFEST).exists():
                self._collect_garbage(set())          # what a save killed before its first manifest left
                return None
            try:
                manifest = json.loads((self.folder / MANIFEST).read_text("utf-8"))
                if not isinstance(manifest, dict):
                    raise ValueError("the manifest is not an object")
                if (manifest.get("format") != FORMAT_VERSION or manifest.get("tokenizer") != self.tokenizer_key
                        or manifest.get("root") != self.root):
                    log.info("Index in %s was made by another tokenizer or format; rebuilding.", self.folder)
                    self._clear()
                    return None
                stems = [(_segment_name(e), _dead_list(e)) for e in _list(manifest["segments"])]
                segments = [self._read_segment(stem, dead) for stem, dead in stems]
                saved = Saved(segments, _sigs(manifest["files"]), _sigs(manifest["skipped"]))
            except Exception as err:     # noqa: BLE001 - any damage at all means: rebuild, never crash
                log.warning("Index in %s is damaged (%s: %s); rebuilding it.", self.folder, type(err).__name__, err)
                self._clear()
                return None
            self._collect_garbage({stem for stem, _ in stems})
        renamed = [replace(seg, name=new_segment_name()) for seg in saved.segments]
        self._stems = {seg.name: old.name for seg, old in zip(renamed, saved.segments)}
        saved.segments = renamed
        return saved

    def save(self, segments: Sequence[Segment], own: Callable[[str], bool],
             files: dict[str, Signature], skipped: dict[str, Signature]) -> None:
        """Persist the documents of `segments` that `own` accepts and that came from the disk, with the
        signatures of those files. A file whose document came from elsewhere (an editor's unsaved buffer)
        is left out, signature included, so the next start reads it from the disk again."""
        with self._locked():
            entries, kept, written = [], set(), []
            try:
                for seg in segments:
                    dead = [i for i, d in enumerate(seg.doc_ids)
                            if not (seg.live[i] and seg.sources[i] == DISK_SOURCE and own(d))]
                    if len(dead) == seg.doc_count:
                        continue
                    stem = self._stems.get(seg.name, seg.name)
                    if not (self.folder / f"{stem}.docs.json").exists():
                        written.append(stem)
                        self._write_segment(seg, stem)
                    entries.append({"name": stem, "dead": dead})
                    dead_set = set(dead)
                    kept.update(d for i, d in enumerate(seg.doc_ids) if i not in dead_set)
                manifest = {"format": FORMAT_VERSION, "tokenizer": self.tokenizer_key, "root": self.root,
                            "segments": entries, "files": {p: list(s) for p, s in files.items() if p in kept},
                            "skipped": {p: list(s) for p, s in skipped.items()}}
                tmp = self.folder / f"{MANIFEST}.tmp"
                _write_bytes(tmp, json.dumps(manifest).encode())
                _swap_in(tmp, self.folder / MANIFEST)
            except BaseException:
                self._remove_files(set(written) | {"manifest"})    # a full disk keeps no half-written file
                raise
            self._collect_garbage({e["name"] for e in entries})
        live = {s.name for s in segments}
        self._stems = {name: stem for name, stem in self._stems.items() if name in live}

    # --- segment files ---------------------------------------------------------------------
    def _write_segment(self, seg: Segment, stem: str) -> None:
        for suffix, arr in (("tokens", seg.tokens), ("rsa", seg.rsa)):
            tmp = self.folder / f"{stem}.{suffix}.tmp.npy"
            np.save(tmp, np.asarray(arr))
            _fsync(tmp)
            os.replace(tmp, self.folder / f"{stem}.{suffix}.npy")
        tmp = self.folder / f"{stem}.meta.tmp.npz"
        np.savez(tmp, **{k: getattr(seg, k) for k in _TABLES})
        _fsync(tmp)
        os.replace(tmp, self.folder / f"{stem}.meta.npz")
        # The doc list goes last: its presence means the segment is complete. It holds the arrays' checksums.
        crc = _checksums(seg.tokens, seg.rsa, {k: getattr(seg, k) for k in _TABLES})
        info = {"docs": list(seg.doc_ids), "crc": crc}
        _write_bytes(self.folder / f"{stem}.docs.tmp", json.dumps(info).encode())
        os.replace(self.folder / f"{stem}.docs.tmp", self.folder / f"{stem}.docs.json")

    def _read_segment(self, stem: str, dead: list[int]) -> Segment:
        # Plain ndarray views of the maps: np.memmap's indexing overhead shows in every query.
        tokens = np.asarray(np.load(self.folder / f"{stem}.tokens.npy", mmap_mode="r", allow_pickle=False))
        rsa = np.asarray(np.load(self.folder / f"{stem}.rsa.npy", mmap_mode="r", allow_pickle=False))
        with np.load(self.folder / f"{stem}.meta.npz", allow_pickle=False) as meta:
            tables = {k: meta[k] for k in _TABLES}
        info = json.loads((self.folder / f"{stem}.docs.json").read_text("utf-8"))
        if not isinstance(info, dict) or not isinstance(info.get("docs"), list):
            raise ValueError(f"segment {stem} has no document list")
        doc_ids = tuple(info["docs"])
        if not all(isinstance(d, str) for d in doc_ids):
            raise ValueError(f"segment {stem} has a document id that is not a string")
        _check_shapes(stem, tokens, rsa, tables, len(doc_ids))
        if info.get("crc") != _checksums(tokens, rsa, tables):
            raise ValueError(f"segment {stem} fails its checksum")
        _check_values(stem, tokens, rsa, tables)
        if any(i >= len(doc_ids) for i in dead):
            raise ValueError(f"segment {stem} has a tombstone out of range")
        live = np.ones(len(doc_ids), dtype=bool)
        live[dead] = False
        return Segment(name=stem, tokens=tokens, rsa=rsa, doc_ids=doc_ids, live=live, **tables)

    def _collect_garbage(self, keep: set[str]) -> None:
        self._remove_files({path.name.split(".", 1)[0] for path in self.folder.iterdir()} - keep - {"lock"})

    def _remove_files(self, stems: set[str]) -> None:
        for path in self.folder.iterdir():
            if path.name not in (MANIFEST, "lock") and path.name.split(".", 1)[0] in stems:
                try:
                    path.unlink()
                except OSError:
                    pass

    def _clear(self) -> None:
        (self.folder / MANIFEST).unlink(missing_ok=True)
        self._collect_garbage(set())


# The small arrays of a segment, kept in one .npz and read whole (tokens and rsa are memory-mapped).
_TABLES = ("doc_starts", "sources", "bucket_tokens", "bucket_starts", "bucket_pairs", "pair_tokens", "pair_starts")
_DTYPES = {"doc_starts": "i", "sources": "u", "bucket_tokens": "u", "bucket_starts": "i", "bucket_pairs": "i",
           "pair_tokens": "u", "pair_starts": "i"}
DISK_SOURCE = Source.WORKSPACE.value     # the only source whose text is the file's on disk


def _checksums(tokens: np.ndarray, rsa: np.ndarray, tables: dict[str, np.ndarray]) -> dict[str, int]:
    # crc32 streams at memory speed: cheap next to what a start maps, so every start verifies every segment.
    arrays = {"tokens": tokens, "rsa": rsa, **tables}
    return {k: zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B")) for k, a in arrays.items()}


def _check_shapes(stem: str, tokens: np.ndarray, rsa: np.ndarray, t: dict[str, np.ndarray], docs: int) -> None:
    n = tokens.shape[0] if tokens.ndim == 1 else -1
    ok = (tokens.dtype == np.uint32 and n >= 1 and rsa.shape == tokens.shape and rsa.dtype.kind == "i"
          and all(t[k].ndim == 1 and t[k].dtype.kind == kind for k, kind in _DTYPES.items())
          and t["doc_starts"].shape[0] == docs + 1 and t["sources"].shape[0] == docs
          and t["bucket_starts"].shape[0] == t["bucket_tokens"].shape[0] + 1
          and t["bucket_pairs"].shape == t["bucket_starts"].shape
          and t["pair_starts"].shape[0] == t["pair_tokens"].shape[0] + 1)
    if not ok:
        raise ValueError(f"segment {stem} has arrays of the wrong shape or type")


def _check_values(stem: str, tokens: np.ndarray, rsa: np.ndarray, t: dict[str, np.ndarray]) -> None:
    """Ranges a bug (or a checksum collision) could break and a query would index with."""
    n = tokens.shape[0]
    ds = t["doc_starts"]
    ok = (int(ds[0]) == 1 and int(ds[-1]) == n and bool((np.diff(ds) >= 1).all())
          and bool((tokens[ds - 1] == SEP).all())
          and int(rsa.min()) >= 0 and int(rsa.max()) < n
          and (t["sources"].shape[0] == 0 or int(t["sources"].max()) < len(Source))
          and int(t["bucket_starts"][0]) == 0 and int(t["bucket_starts"][-1]) == n
          and bool((np.diff(t["bucket_starts"]) >= 0).all())
          and int(t["bucket_pairs"][0]) == 0 and int(t["bucket_pairs"][-1]) == t["pair_tokens"].shape[0]
          and bool((np.diff(t["bucket_pairs"]) >= 0).all())
          and int(t["pair_starts"][0]) == 0 and int(t["pair_starts"][-1]) == n
          and bool((np.diff(t["pair_starts"]) >= 0).all()))
    if not ok:
        raise ValueError(f"segment {stem} holds values out of range")


def _list(value) -> list:
    if not isinstance(value, list):
        raise ValueError("the manifest's segment list is not a list")
    return value


def _segment_name(entry) -> str:
    name = entry.get("name") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not re.fullmatch(r"[0-9a-f]{16}", name):
        raise ValueError(f"bad segment name {name!r}")
    return name


def _dead_list(entry: dict) -> list[int]:
    dead = entry.get("dead")
    if not isinstance(dead, list) or not all(type(i) is int and i >= 0 for i in dead):
        raise ValueError("bad tombstone list")
    return dead


def _sigs(d) -> dict[str, Signature]:
    if not isinstance(d, dict):
        raise ValueError("bad file table")
    out = {}
    for p, s in d.items():
        if not isinstance(s, list) or len(s) != 5 or not all(type(x) is int for x in s):
            raise ValueError(f"bad signature for {p!r}")
        out[p] = tuple(s)
    return out


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap_in(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)           # the rename itself survives a power cut
    finally:
        os.close(fd)
