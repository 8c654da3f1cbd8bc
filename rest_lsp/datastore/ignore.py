"""Which workspace paths are not indexed: git's ignore files, folders no one wants drafts from, credentials.

Git's rule: the deepest .gitignore with a matching pattern decides (its last match wins), then the
shallower ones, then .git/info/exclude. A folder that is ignored hides everything below it.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import threading
from pathlib import Path
from typing import Sequence
from urllib.parse import unquote, urlsplit

import pathspec

log = logging.getLogger(__name__)

# Version control, virtual environments, dependency and build folders, tool caches.
ALWAYS_SKIPPED_DIRS = frozenset({
    ".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", "target",
    ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".eggs", ".cache",
})

# Credentials, at any depth and whatever an ignore file or setting says: a workspace may be a home folder, and
# what is indexed is drafted. Folders (a path of one to three names) and file names (shell patterns, any case).
SECRET_DIRS = frozenset({
    ".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".password-store", ".terraform.d", ".vault",
    ".config/gcloud", ".config/gh", ".config/hub", ".local/share/keyrings",
})
SECRET_FILES = re.compile("|".join(fnmatch.translate(p) for p in (
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore",
    "*.kdbx", "*.tfstate", "*.tfstate.*", ".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".pgpass",
    ".my.cnf", ".git-credentials", ".npmrc", ".pypirc", ".vault-token", ".htpasswd", "credentials*",
)), re.IGNORECASE)


def is_secret(rel: str, is_dir: bool) -> bool:
    """True for a folder of credentials or a path below one, and for a file named like a key or a credential."""
    parts = rel.split("/")
    folders = parts if is_dir else parts[:-1]
    if any("/".join(folders[i:i + n]) in SECRET_DIRS for n in (1, 2, 3) for i in range(len(folders) - n + 1)):
        return True
    return not is_dir and SECRET_FILES.match(parts[-1]) is not None


def is_secret_path(path: str, is_dir: bool = False) -> bool:
    """`is_secret` for an absolute path (either separator) or a document id: an open buffer's id is its file's path,
    or `buffer:<uri>` for a document that is not a file on disk (its URI's path then). The service never feeds such
    a buffer, the team mirror never sends one, and a workspace root inside a folder of secrets is not indexed."""
    if path.startswith("buffer:"):
        path = unquote(urlsplit(path[len("buffer:"):]).path)
    rel = path.replace("\\", "/").strip("/")
    return bool(rel) and is_secret(rel, is_dir)


class IgnoreRules:
    """Answers `ignored(relative_posix_path, is_dir)` for one workspace root; thread-safe."""

    def __init__(self, root: Path, extra: Sequence[str] = ()):
        self.root = root
        self._extra = spec_of(list(extra), "the ignore setting") if extra else None
        self._specs: dict[str, pathspec.GitIgnoreSpec | None] = {}
        self._dirs: dict[str, bool] = {}
        self._lock = threading.Lock()

    def invalidate(self) -> None:
        """Forget cached ignore files (call when a .gitignore or .git/info/exclude changes)."""
        with self._lock:
            self._specs.clear()
            self._dirs.clear()

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """True if `rel` or any folder above it is excluded."""
        if is_secret(rel, is_dir):
            return True
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if self._dir_ignored("/".join(parts[:i])):
                return True
        return self._dir_ignored(rel) if is_dir else self._self_ignored(rel, False)

    def _dir_ignored(self, rel: str) -> bool:
        with self._lock:
            cached = self._dirs.get(rel)
        if cached is None:
            name = rel.rsplit("/", 1)[-1]
            cached = (name in ALWAYS_SKIPPED_DIRS or name.endswith(".egg-info")
                      or (self.root / rel / "pyvenv.cfg").exists()      # any virtual environment
                      or self._self_ignored(rel, True))
            with self._lock:
                self._dirs[rel] = cached
        return cached

    def _self_ignored(self, rel: str, is_dir: bool) -> bool:
        suffix = "/" if is_dir else ""
        if self._extra is not None and self._extra.check_file(rel + suffix).include is not None:
            return bool(self._extra.check_file(rel + suffix).include)
        parts = rel.split("/")
        for depth in range(len(parts) - 1, -1, -1):        # deepest .gitignore first
            base = "/".join(parts[:depth])
            spec = self._spec(base)
            if spec is None:
                continue
            verdict = spec.check_file("/".join(parts[depth:]) + suffix).include
            if verdict is not None:
                return verdict
        exclude = self._spec(".git/info/exclude")
        if exclude is not None:
            verdict = exclude.check_file(rel + suffix).include
            if verdict is not None:
                return verdict
        return False

    def _spec(self, base: str) -> pathspec.GitIgnoreSpec | None:
        with self._lock:
            if base in self._specs:
                return self._specs[base]
        if base == ".git/info/exclude":
            path = self.root / ".git" / "info" / "exclude"
        else:
            path = self.root / base / ".gitignore"
        spec = None
        try:
            if path.is_file() and not path.is_symlink():
                spec = spec_of(path.read_text("utf-8", errors="replace").splitlines(), str(path))
        except (OSError, ValueError) as err:
            log.warning("Ignoring unreadable ignore file %s: %s", path, err)
        with self._lock:
            self._specs[base] = spec
        return spec


def bad_patterns(lines: Sequence[str]) -> list[str]:
    """The patterns of `lines` that pathspec cannot compile."""
    bad = []
    for line in lines:
        try:
            pathspec.GitIgnoreSpec.from_lines([line])
        except Exception:  # noqa: BLE001 - pathspec raises ValueError or re.error, depending on the mistake
            bad.append(line)
    return bad


def spec_of(lines: list[str], where: str) -> pathspec.GitIgnoreSpec:
    """The spec of `lines`; a pattern that does not compile is left out (one log line), never the others."""
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except Exception:  # noqa: BLE001 - ValueError or re.error: find the culprits
        bad = bad_patterns(lines)
    log.warning("Skipping invalid ignore pattern(s) %s in %s.", ", ".join(map(repr, bad)), where)
    return pathspec.GitIgnoreSpec.from_lines([line for line in lines if line not in bad])


def is_ignore_file(rel: str) -> bool:
    return rel == ".git/info/exclude" or rel.rsplit("/", 1)[-1] == ".gitignore"


def relative(root: Path, path: str) -> str | None:
    """`path` relative to `root` in POSIX form, or None if it lies outside (symlinks count as outside)."""
    root_s = str(root)
    if path != root_s and not path.startswith(root_s + os.sep):
        return None
    if os.path.realpath(path) != path:                     # a symlink somewhere on the way
        return None
    return path[len(root_s) + 1:].replace(os.sep, "/") if path != root_s else ""
