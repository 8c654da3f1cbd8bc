"""Segments on disk: written once, memory-mapped at start, listed by a manifest swapped in last.

A save writes the segments the folder lacks, then a new manifest under a temporary name, then
renames it over the old one. A crash at any point leaves the old manifest and the segments it names
intact; files no manifest names are removed by the next save or load. The manifest records the
tokenizer and the format, so a change of either discards the folder's contents.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .scan import Signature
from .segment import Segment

log = logging.getLogger(__name__)

FORMAT_VERSION = 2          # 2: the pair table of each segment
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
    def __init__(self, folder: Path, tokenizer_key: str, root: Path):
        self.folder = folder
        self.tokenizer_key = tokenizer_key
        self.root = str(root)

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
        """The saved index, memory-mapped; None if there is none or it no longer fits (then it is cleared)."""
        if not (self.folder / MANIFEST).exists():
            return None
        with self._locked():
            try:
                manifest = json.loads((self.folder / MANIFEST).read_text("utf-8"))
                if (manifest.get("format") != FORMAT_VERSION or manifest.get("tokenizer") != self.tokenizer_key
                        or manifest.get("root") != self.root):
                    log.info("Index in %s was made by another tokenizer or format; rebuilding.", self.folder)
                    self._clear()
                    return None
                segments = [self._read_segment(s["name"], s["dead"]) for s in manifest["segments"]]
                saved = Saved(segments, _sigs(manifest["files"]), _sigs(manifest["skipped"]))
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("Index in %s is unreadable (%s); rebuilding.", self.folder, err)
                self._clear()
                return None
            self._collect_garbage({s.name for s in segments})
            return saved

    def save(self, segments: Sequence[Segment], own: Callable[[str], bool],
             files: dict[str, Signature], skipped: dict[str, Signature]) -> None:
        """Persist the documents of `segments` that `own` accepts, with the file signatures."""
        with self._locked():
            entries = []
            for seg in segments:
                dead = [i for i, d in enumerate(seg.doc_ids) if not (seg.live[i] and own(d))]
                if len(dead) == seg.doc_count:
                    continue
                if not (self.folder / f"{seg.name}.docs.json").exists():
                    self._write_segment(seg)
                entries.append({"name": seg.name, "dead": dead})
            manifest = {"format": FORMAT_VERSION, "tokenizer": self.tokenizer_key, "root": self.root,
                        "segments": entries, "files": {p: list(s) for p, s in files.items()},
                        "skipped": {p: list(s) for p, s in skipped.items()}}
            tmp = self.folder / f"{MANIFEST}.tmp"
            _write_bytes(tmp, json.dumps(manifest).encode())
            _swap_in(tmp, self.folder / MANIFEST)
            self._collect_garbage({e["name"] for e in entries})

    # --- segment files ---------------------------------------------------------------------
    def _write_segment(self, seg: Segment) -> None:
        for suffix, arr in (("tokens", seg.tokens), ("rsa", seg.rsa)):
            tmp = self.folder / f"{seg.name}.{suffix}.tmp.npy"
            np.save(tmp, np.asarray(arr))
            _fsync(tmp)
            os.replace(tmp, self.folder / f"{seg.name}.{suffix}.npy")
        tmp = self.folder / f"{seg.name}.meta.tmp.npz"
        np.savez(tmp, **{k: getattr(seg, k) for k in _TABLES})
        _fsync(tmp)
        os.replace(tmp, self.folder / f"{seg.name}.meta.npz")
        # The doc list goes last: its presence means the segment is complete.
        _write_bytes(self.folder / f"{seg.name}.docs.tmp", json.dumps(list(seg.doc_ids)).encode())
        os.replace(self.folder / f"{seg.name}.docs.tmp", self.folder / f"{seg.name}.docs.json")

    def _read_segment(self, name: str, dead: list[int]) -> Segment:
        if not re.fullmatch(r"[0-9a-f]{16}", name):
            raise ValueError(f"bad segment name {name!r}")
        # Plain ndarray views of the maps: np.memmap's indexing overhead shows in every query.
        tokens = np.asarray(np.load(self.folder / f"{name}.tokens.npy", mmap_mode="r"))
        rsa = np.asarray(np.load(self.folder / f"{name}.rsa.npy", mmap_mode="r"))
        with np.load(self.folder / f"{name}.meta.npz") as meta:
            tables = {k: meta[k] for k in _TABLES}
        doc_ids = tuple(json.loads((self.folder / f"{name}.docs.json").read_text("utf-8")))
        n = tokens.shape[0]
        if (tokens.dtype != np.uint32 or rsa.shape != tokens.shape or len(doc_ids) + 1 != tables["doc_starts"].shape[0]
                or tables["sources"].shape[0] != len(doc_ids) or int(tables["bucket_starts"][-1]) != n
                or tables["bucket_pairs"].shape != tables["bucket_starts"].shape
                or int(tables["bucket_pairs"][-1]) != tables["pair_tokens"].shape[0]
                or tables["pair_starts"].shape[0] != tables["pair_tokens"].shape[0] + 1
                or int(tables["pair_starts"][-1]) != n):
            raise ValueError(f"segment {name} is inconsistent")
        live = np.ones(len(doc_ids), dtype=bool)
        live[dead] = False
        return Segment(name=name, tokens=tokens, rsa=rsa, doc_ids=doc_ids, live=live, **tables)

    def _collect_garbage(self, keep: set[str]) -> None:
        for path in self.folder.iterdir():
            stem = path.name.split(".", 1)[0]
            if path.name not in (MANIFEST, "lock") and stem not in keep:
                try:
                    path.unlink()
                except OSError:
                    pass

    def _clear(self) -> None:
        (self.folder / MANIFEST).unlink(missing_ok=True)
        self._collect_garbage(set())


# The small arrays of a segment, kept in one .npz and read whole (tokens and rsa are memory-mapped).
_TABLES = ("doc_starts", "sources", "bucket_tokens", "bucket_starts", "bucket_pairs", "pair_tokens", "pair_starts")


def _sigs(d: dict) -> dict[str, Signature]:
    return {p: (int(s[0]), int(s[1])) for p, s in d.items()}


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
