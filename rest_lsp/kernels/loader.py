"""The one way a kernel of ours is built, kept, loaded, checked and bound: `Kernel`, one per C source.

A kernel's library is built per instruction-set level (levels.py) on first use, with the system's C compiler
(`CC`, else cc or gcc), and kept in the cache folder as `{stem}-{level}-{key}.so`, the key a hash of everything the
bytes depend on (source, flags, compiler version), with the sha256 of its bytes beside it. It is loaded only from a
folder no other user may write and only when its bytes match that record (else built again), then bound (ctypes
signatures) and checked against a reference product before any step uses it. With no compiler, a failing build or
a failing check, the library is None (said once) and the caller's mode runs without it.

Why at first use and not at install time: the compiler and the CPU that matter are the user's, a wheel or an
editable install would have to build every level for every CPU anyway, and a build is a one-off cost per level
that only the levels this CPU executes pay.

`REST_LSP_KERNEL_SANITIZE=1` builds every kernel with AddressSanitizer and UndefinedBehaviorSanitizer (its own
cache entries: the flags are in the key); the process must then have libasan loaded first (`LD_PRELOAD`), as
.ci/sanitize.sh does.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable

import torch

from rest_lsp import cache_dir
from rest_lsp.cache_dir import UntrustedCache, cache_root, not_private
from rest_lsp.kernels import levels

log = logging.getLogger(__name__)

SANITIZE_ENV = "REST_LSP_KERNEL_SANITIZE"
# -O1 last (the last -O wins): AddressSanitizer's advice, and the instrumented tiles compile many times faster than at
# -O3 (docs/LOG.md); the arithmetic is the same (no fast-math, contraction off), so the tests' bits are too. -g1: the
# line tables a report's stack names file:line with, without the full debug info, much of the build's time (LOG.md)
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g1",
            "-O1")
OPENMP = ("-fopenmp",)  # tried first; the key covers it, so a library built without it is another library


def sanitizing() -> bool:
    return os.environ.get(SANITIZE_ENV, "").strip() not in ("", "0")


def kernel_folder() -> Path:
    return cache_root() / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=300, cwd=cwd)


def _key(flags: tuple[str, ...], version: str, source: str, libs: tuple[str, ...] = ()) -> str:
    """What a library depends on: its source, every flag (the level's, OpenMP's and the sanitizer's included), the
    libraries it links and the compiler's version. Not the CPU: a level's flags name the instructions it uses."""
    parts = [source, " ".join(flags), version]
    return hashlib.sha256("\0".join(parts + ([" ".join(libs)] if libs else [])).encode()).hexdigest()[:16]


def _private_folder(folder: Path) -> None:
    """Makes `folder` (mode 700) where it is missing; UntrustedCache (naming it) unless it is this user's alone, in
    a parent no one else may swap it in: rest_lsp/cache_dir.py's rule for every cache folder."""
    try:
        cache_dir.private_folder(folder)
    except UntrustedCache as err:
        raise UntrustedCache(f"{folder} {str(err).removeprefix('it ')}") from None


def _record_of(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _load_verified(target: Path) -> ctypes.CDLL | None:
    """The library at `target` if its bytes hash to the sha256 recorded beside it when it was built, both files
    this user's alone; None when it is missing or (after one log line) refused. The bytes hashed are the bytes
    loaded: the library is opened once and loaded through that descriptor where /proc shows it, which then stays
    open (dlopen takes a name it loaded before for the same library: /proc/self/fd/N must not name another)."""
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("The cached kernel %s is not loaded (%s): it is built again.", target, err.strerror or err)
        return None
    try:
        st = os.fstat(fd)
        problem = "not a regular file" if not stat.S_ISREG(st.st_mode) else not_private(st)
        if problem is None:
            with open(fd, "rb", closefd=False) as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            try:
                recorded = cache_dir.read_bytes(_record_of(target)).decode("ascii", "replace").strip()
            except OSError as err:
                recorded, problem = "", f"its sha256 record: {err.strerror or err}"
            if problem is None and not hmac.compare_digest(digest, recorded):
                problem = "its sha256 is not the one recorded when it was built"
        if problem is not None:
            log.warning("The cached kernel %s is not loaded (%s): it is built again.", target, problem)
            return None
        path = f"/proc/self/fd/{fd}"
        if not os.path.exists(path):
            return ctypes.CDLL(str(target))
        lib = ctypes.CDLL(path)
        fd = -1  # held for the life of the process, as the library is
        return lib
    finally:
        if fd >= 0:
            os.close(fd)


def _compile(cc: str, flags: tuple[str, ...], target: Path, source: str, libs: tuple[str, ...] = (),
             suffix: str = ".c") -> str | None:
    """Builds `target` from `source` with its sha256 record beside it (each written whole, then renamed into
    place: another process building the same library meanwhile is harmless); the compiler's complaint when it
    fails."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        # relative names: the library's bytes do not depend on the temporary folder, so concurrent builds agree
        Path(tmp, "kernel" + suffix).write_text(source)
        done = _run([cc, *flags, "kernel" + suffix, "-o", "kernel.so", *libs], cwd=Path(tmp))
        if done.returncode != 0:
            return done.stderr.strip()
        out, record = Path(tmp, "kernel.so"), Path(tmp, "kernel.sha256")
        os.chmod(out, 0o700)
        record.write_text(hashlib.sha256(out.read_bytes()).hexdigest() + "\n")
        os.chmod(record, 0o600)
        os.replace(record, _record_of(target))
        os.replace(out, target)
    return None


def build_and_load(cc: str, folder: Path, stem: str, source: str, variants: tuple[tuple[str, ...], ...],
                   libs: tuple[str, ...] = (), suffix: str = ".c") -> ctypes.CDLL:
    """The one way a kernel of ours is built and loaded (this one and quant_matmul's): the library of `source`,
    compiled with the first of `variants` (each a full set of flags) that builds, kept in `folder` as
    `{stem}-{key}.so` with its sha256 beside it, loaded only from a folder of this user's alone and only when its
    bytes match that record (else built again). OSError when no variant builds, UntrustedCache (an OSError) when
    the folder is not this user's alone. The caller checks the library's results before it uses it."""
    _private_folder(folder)
    version = _run([cc, "--version"]).stdout
    errors = ""
    for flags in variants:
        target = folder / f"{stem}-{_key(flags, version, source, libs)}.so"
        lib = _load_verified(target)
        if lib is None:
            errors = _compile(cc, flags, target, source, libs, suffix) or ""
            lib = None if errors else _load_verified(target)
        if lib is not None:
            lib._rest_lsp_build = target.stem  # which build (`build_name`): the library's own name is /proc's fd
            return lib
    lines = errors.splitlines()
    raise OSError(next((line for line in lines if "error" in line), lines[-1] if lines else f"{cc} failed"))


class Kernel:
    """One C kernel: its source, flags and libraries, how to bind and check a library; one library per level,
    built on first use (`library`). `purpose` ends the sentence logged when it cannot be had. `suffix`: the
    source's, which tells the compiler its language (".c", or ".cpp" for C++)."""

    def __init__(self, stem: str, flags: tuple[str, ...], libs: tuple[str, ...],
                 bind: Callable[[ctypes.CDLL], ctypes.CDLL], check: Callable[[ctypes.CDLL], ctypes.CDLL],
                 purpose: str, suffix: str = ".c"):
        self.stem, self.flags, self.libs, self._bind, self._check, self.purpose = stem, flags, libs, bind, check, purpose
        self.suffix = suffix
        self.source = (Path(__file__).parent / f"{stem}{suffix}").read_text()
        self._lock = threading.Lock()
        self._libraries: dict[str, ctypes.CDLL | None] = {}  # level -> the library once tried (None: it failed)

    def variants(self, level: str) -> tuple[tuple[str, ...], ...]:
        """The flags a build of `level` is tried with, in order: with OpenMP, then on one thread."""
        flags = self.flags + levels.compiler_flags(level) + (SANITIZE if sanitizing() else ())
        return (flags + OPENMP, flags)

    def library(self, level: str | None = None, folder: Path | None = None) -> ctypes.CDLL | None:
        """The checked library of `level` (the dispatcher's by default; LevelUnavailable for one this CPU does not
        execute), built on first use; None where it cannot be built or fails its check (said once)."""
        level = levels.chosen() if level is None else level
        if level in self._libraries:
            return self._libraries[level]
        levels.check_runnable(level)
        with self._lock:
            if level not in self._libraries:
                self._libraries[level] = self._load(level, folder or kernel_folder())
            return self._libraries[level]

    def _load(self, level: str, folder: Path) -> ctypes.CDLL | None:
        cc = _compiler()
        if cc is None:
            log.info("No C compiler here (CC, cc, gcc): %s.", self.purpose)
            return None
        try:
            lib = build_and_load(cc, folder, f"{self.stem}-{level}", self.source, self.variants(level), self.libs,
                                 self.suffix)
            return self._check(self._bind(lib))
        except UntrustedCache as err:
            log.warning("The kernel cache folder is not this user's alone (%s): %s.", err, self.purpose)
        except Exception as err:  # noqa: BLE001 - whatever went wrong, the caller's mode runs without it
            log.warning("The %s kernel (%s level) could not be built with %s (%s): %s.", self.stem, level, cc, err,
                        self.purpose)
        return None

    def forget(self) -> None:
        """Drops the libraries tried so far (the tests' fresh start; a loaded library stays mapped)."""
        with self._lock:
            self._libraries.clear()


# The ops TorchScript calls (torch.ops.rest_lsp.*): one namespace, each op defined once per process.
_ops = torch.library.Library("rest_lsp", "DEF")


def register(schema: str, fn: Callable) -> None:
    """Defines `torch.ops.rest_lsp.<name>` by `schema`, run by `fn` on the CPU."""
    _ops.define(schema)
    _ops.impl(schema.partition("(")[0], fn, "CPU")
