"""What is on disk: walk a root for indexable files, and read one as text.

Symlinks are never followed (neither to folders nor to files): a target inside the root is indexed
under its own path, a target outside is not ours, and a symlink loop cannot trap the walk.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from .ignore import IgnoreRules

log = logging.getLogger(__name__)

Signature = tuple[int, int]        # (mtime_ns, size): a file whose signature is unchanged is not re-read
BINARY_SNIFF_BYTES = 8192


def signature(st: os.stat_result) -> Signature:
    return (st.st_mtime_ns, st.st_size)


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


def read_text(path: str, max_file_bytes: int) -> str | None:
    """The file as text (UTF-8, undecodable bytes replaced), or None if unreadable, binary or too big."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_file_bytes + 1)
    except OSError as err:
        log.info("Not indexing unreadable file %s: %s", path, err)
        return None
    if len(data) > max_file_bytes or b"\0" in data[:BINARY_SNIFF_BYTES]:
        return None
    return data.decode("utf-8", errors="replace")
