"""What is on disk: walk a root for indexable files, and read one as text.

Symlinks are never followed (neither to folders nor to files): a target inside the root is indexed
under its own path, a target outside is not ours, and a symlink loop cannot trap the walk.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from pathlib import Path

from .ignore import IgnoreRules

log = logging.getLogger(__name__)

# (mtime_ns, size, inode, ctime_ns, digest): a file whose signature is unchanged is not re-read. A write within
# the same timestamp tick as the read, and of the same size, leaves the first four as they were, so a file read
# while its timestamps were that fresh ("racy", as git says) also keeps a digest of the bytes read; else 0.
Signature = tuple[int, int, int, int, int]
BINARY_SNIFF_BYTES = 8192
# Timestamps are only as fine as the kernel's clock tick, or the file system's (2 s on FAT): younger is racy.
RACY_NS = 2_000_000_000


def signature(st: os.stat_result) -> Signature:
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns, 0)


def settled(sig: Signature, data: bytes | None, now_ns: int | None = None) -> Signature:
    """`sig` of the file whose bytes were `data`, with their digest if its timestamps were racy when read."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    if data is None or now_ns - max(sig[0], sig[3]) >= RACY_NS:
        return sig[:4] + (0,)
    return sig[:4] + (digest(data),)


def digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") or 1


def unchanged(path: str, old: Signature | None, new: Signature, max_file_bytes: int) -> bool:
    """True if the file at `path`, now signed `new`, still holds what was read when it was signed `old`."""
    if old is None or old[:4] != new[:4]:
        return False
    return old[4] == 0 or digest(read_bytes(path, max_file_bytes) or b"") == old[4]


def walk(root: Path, rules: IgnoreRules, max_file_bytes: int, under: str = "") -> dict[str, Signature]:
    """Absolute path -> signature of every regular, not ignored, not oversized file below `root/under`."""
    found: dict[str, Signature] = {}
    stack = [under]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = list(os.scandir(root / rel_dir if rel_dir else root))
        except OSError as err:
            log.info("Skipping unreadable folder %s: %s", root / rel_dir, err)
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if not rules.ignored(rel, True):
                    stack.append(rel)
            elif stat.S_ISREG(st.st_mode) and st.st_size <= max_file_bytes and not rules.ignored(rel, False):
                found[entry.path] = signature(st)
    return found


def stat_file(path: str, max_file_bytes: int) -> Signature | None:
    """The signature of an indexable regular file at `path`, or None (gone, symlink, special, too big)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_file_bytes:
        return None
    return signature(st)


def read_bytes(path: str, max_file_bytes: int) -> bytes | None:
    """The file's bytes (at most `max_file_bytes` + 1), or None if unreadable or a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            return f.read(max_file_bytes + 1)
    except OSError as err:
        log.info("Not indexing unreadable file %s: %s", path, err)
        return None


def as_text(data: bytes | None, max_file_bytes: int) -> str | None:
    """The bytes as text (UTF-8, undecodable bytes replaced), or None if absent, binary or too big."""
    if data is None or len(data) > max_file_bytes or b"\0" in data[:BINARY_SNIFF_BYTES]:
        return None
    return data.decode("utf-8", errors="replace")


def read_text(path: str, max_file_bytes: int) -> str | None:
    """The file as text (UTF-8, undecodable bytes replaced), or None if unreadable, binary or too big."""
    return as_text(read_bytes(path, max_file_bytes), max_file_bytes)
