"""The user's cache folder, as something only this user may have written: ownership-checked folders and reads,
entries named by what a model file holds, and caps on how many entries a folder keeps.

A conversion, a tokenizer or a timing read from the cache decides what the model says or how it runs, so one that
another local user could have put there is never used: a folder (the cache root and each folder in it) must belong
to this user and be writable by no one else, in a parent no one else may swap it in (the kernels folder too,
kernels/loader.py), and a file must be a regular file of this user's that no one else may write. A cache that
fails the rule is not used at all (one warning): loads then work without it.

A model file is known by the sha256 of its bytes, not by its path, size and modification time (a file replaced by
another of the same size with its time kept, as cp -p, rsync -a or tar do, is another model). The whole file is
hashed once; the digest is kept per path with the file's (device, inode, size, mtime, ctime): ctime changes with any
write or rename onto the path and cannot be set back by its owner.

Torch-free: `rest-lsp index` reads the saved tokenizer through here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path


log = logging.getLogger(__name__)

# What each folder keeps, least recently used removed first (README.md states these): conversions of .gguf files
# and their kept panels (engine/panel_cache) up to MODELS_BYTES together (the one in use always), so many small models
# fit and a few large ones; saved tokenizers and file digests by count. Only entries named as rest-lsp names them are
# ever removed.
MODELS_BYTES = 8 << 30
KEPT = {"tokenizers": 16, "digests": 64}
ENTRY_NAMES = {"models": re.compile(r".+-[0-9a-f]{12}(?:[0-9a-f]{4})?(?:\.panels)?"),  # 12: before content keys
               "tokenizers": re.compile(r".+-[0-9a-f]{16}\.json"), "digests": re.compile(r"[0-9a-f]{16}\.json")}
_warned: set[str] = set()
_digests: dict[tuple, str] = {}  # (resolved path, dev, inode, size, mtime_ns, ctime_ns) -> sha256, this process


def cache_root() -> Path:
    """The user's rest-lsp cache folder: REST_LSP_CACHE_DIR, else the platform's user cache folder."""
    if env := os.environ.get("REST_LSP_CACHE_DIR"):
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("rest-lsp"))


class UntrustedCache(OSError):
    """A cache folder or file another user could have written: nothing in it is used."""


def not_private(st: os.stat_result) -> str | None:
    """Why a file or folder with this stat may hold another user's data (None when only this user can write it)."""
    if not hasattr(os, "getuid"):  # no POSIX owners here
        return None
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not {os.getuid()}"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_folder(folder: Path) -> None:
    """Makes `folder` (mode 700) where it is missing; UntrustedCache unless it is a folder of this user that no
    one else may write, in a parent no one else may swap it in."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    problem = "a link or a file, not a folder" if not stat.S_ISDIR(st.st_mode) else not_private(st)
    if problem is None and hasattr(os, "getuid"):
        up = os.stat(folder.parent)
        if up.st_uid not in (os.getuid(), 0) or (up.st_mode & 0o002 and not up.st_mode & stat.S_ISVTX):
            problem = f"in a folder other users can change (uid {up.st_uid}, mode {stat.S_IMODE(up.st_mode):o})"
    if problem is not None:
        raise UntrustedCache(f"it is {problem}")


def folder(name: str) -> Path | None:
    """The cache root's folder `name`, made where missing, when it and the root are this user's alone; None (one
    warning per folder and process) when they are not or cannot be made."""
    root = cache_root()
    for where, shown in ((root, root), (root / name, root / name)):
        try:
            private_folder(where)
        except OSError as err:
            why = str(err) if isinstance(err, UntrustedCache) else f"it cannot be made ({err.strerror or err})"
            warn_once(str(shown), f"The cache folder {shown} is not used: {why}; rest-lsp works without it "
                                  "(REST_LSP_CACHE_DIR names another).")
            return None
    return root / name


def warn_once(what: str, message: str) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning(message)


def private_entry(path: Path) -> str | None:
    """Why the cached folder `path` (which exists) is not to be used; None when it is this user's alone."""
    st = os.lstat(path)
    return "a link or a file, not a folder" if not stat.S_ISDIR(st.st_mode) else not_private(st)


def read_bytes(path: Path) -> bytes:
    """The bytes of the cache file `path`, opened without following a link; FileNotFoundError when it is missing,
    UntrustedCache when it or its folder may have been written by another user, OSError when unreadable."""
    with open_private(path) as f:
        return f.read()


def open_private(path: Path):
    """The cache file `path` opened for reading (binary), without following a link; FileNotFoundError when it is
    missing, UntrustedCache when it or its folder may have been written by another user, OSError when unreadable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    f = os.fdopen(fd, "rb")
    try:
        st = os.fstat(f.fileno())
        problem = "not a regular file" if not stat.S_ISREG(st.st_mode) else not_private(st)
        if problem is None:
            up = os.lstat(Path(path).parent)
            if (why := not_private(up)) is not None:
                problem = f"in a folder {why}"
        if problem is not None:
            raise UntrustedCache(f"it is {problem}")
    except BaseException:
        f.close()
        raise
    return f


def write_bytes(path: Path, data: bytes) -> None:
    """Atomically, into a folder of this user's alone (made mode 700): a reader sees the old file or the whole new
    one. OSError (UntrustedCache) when it cannot be written or the folder is not private."""
    write_chunks(path, [data])


def write_chunks(path: Path, chunks) -> None:
    """write_bytes of the buffers `chunks` (an iterable of bytes-like objects) one after the other, none joined."""
    private_folder(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def touch(path: Path) -> None:
    """Marks a cache entry as just used (pruning keeps the most recently used)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def prune(where: Path, keep: int | None = None, current: Path | None = None, max_bytes: int | None = None) -> None:
    """Removes the least recently used entries of the folder `where` that rest-lsp named (ENTRY_NAMES), never
    `current`, until at most `keep` remain, or (`max_bytes`) until they hold at most that many bytes together."""
    pattern = ENTRY_NAMES[where.name]
    try:
        entries = [(p.lstat().st_mtime_ns, p) for p in where.iterdir() if pattern.fullmatch(p.name) and p != current]
    except OSError:
        return
    entries.sort(reverse=True)
    total = _size(current) if current is not None and max_bytes is not None else 0
    for i, (_, old) in enumerate(entries):
        if max_bytes is not None:
            total += _size(old)
            if total <= max_bytes:
                continue
        elif i < keep - (current is not None):
            continue
        remove(old)


def remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            entry.unlink()


def _size(entry: Path) -> int:
    try:
        if not entry.is_dir() or entry.is_symlink():
            return entry.lstat().st_size
        return sum(f.lstat().st_size for f in entry.rglob("*"))
    except OSError:
        return 0


# -- what a model file holds ---------------------------------------------------------------------------------------
def content_digest(path: str | Path) -> str:
    """The sha256 (hex) of the file's bytes: hashed once per version of the file, then read from the cache while
    its (device, inode, size, mtime, ctime) stay the same. OSError when the file cannot be read."""
    path = Path(path).resolve()
    st = os.stat(path)
    ident = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if ident in _digests:
        return _digests[ident]
    where = folder("digests")
    record = where / f"{hashlib.sha256(str(path).encode()).hexdigest()[:16]}.json" if where else None
    digest = _kept_digest(record, ident) if record else None
    if digest is None:
        digest, same = _hash(path, st)
        if same and record is not None:
            with contextlib.suppress(OSError):
                write_bytes(record, json.dumps({"file": list(ident), "sha256": digest}).encode())
                prune(where, KEPT["digests"], record)
    _digests[ident] = digest
    return digest


def _kept_digest(record: Path, ident: tuple) -> str | None:
    try:
        data = json.loads(read_bytes(record))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.info("Kept digest %s is not used (%s); hashing the file again.", record, err)
        return None
    if not isinstance(data, dict):
        return None
    digest = data.get("sha256")
    if data.get("file") != list(ident) or not isinstance(digest, str) or len(digest) != 64:
        return None
    try:
        bytes.fromhex(digest)
    except ValueError:
        return None
    touch(record)
    return digest


def _hash(path: Path, st: os.stat_result) -> tuple[str, bool]:
    """(the sha256 of the file, whether it stayed the same file while being read)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
        after = os.fstat(f.fileno())
    same = (after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (
        st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return h.hexdigest(), same
