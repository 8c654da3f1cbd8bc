"""The Ray cluster under a team's server, kept to its machine and its user.

`rest-lsp serve` runs a one-machine cluster of its own: nothing of Ray needs to be reached from elsewhere (editors
reach Serve's HTTP proxy alone, on --host). So every Ray port (GCS, raylet, workers, agents, metrics) listens on
loopback: Ray's own switch for a node that is no cluster's member (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read when
ray is imported, so set before that), the dashboard is off, and Ray's control-plane token, unless the operator gave
one (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH), is a new one in a folder only this user can open (mode 0700, the file
0600), removed when the server stops. The server's files (logs, sessions, tokens) are made with umask 077, and
Ray's sessions go under a folder only this user opens (RAY_TMPDIR: the operator's, else a 0700 one of this user's
in the temp folder) whose `ray` folder is closed once Ray has opened it to all (seal_sessions).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
PRIVATE_UMASK = 0o077


def keep_private() -> Path | None:
    """Set this process (and the Ray processes it starts) up: files only its user reads, Ray on loopback, Ray's
    token private. Returns the folder of a token made here (the caller removes it), or None. Call before
    importing ray."""
    os.umask(PRIVATE_UMASK)
    os.environ.update(LOOPBACK_ONLY)
    if not os.environ.get("RAY_TMPDIR"):
        os.environ["RAY_TMPDIR"] = str(private_folder(Path(tempfile.gettempdir()) / f"rest-lsp-{os.getuid()}"))
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    folder = Path(tempfile.mkdtemp(prefix="rest-lsp-ray-"))  # mode 0700
    token = folder / "auth_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    return folder


def private_folder(path: Path) -> Path:
    """`path`, a folder of this user's that only it opens (made if missing); a UserError if it is another's."""
    from rest_lsp.errors import UserError

    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
        raise UserError(f"{path} is not a folder of this user's: set RAY_TMPDIR to one.")
    path.chmod(0o700)
    return path


def seal_sessions() -> None:
    """Ray's session folders, under RAY_TMPDIR/ray, closed to other users (after ray.init: Ray opens the folders it
    makes to every user, 0777, for several people sharing one machine's Ray; a team's server is no such Ray)."""
    root = Path(os.environ["RAY_TMPDIR"]) / "ray" if os.environ.get("RAY_TMPDIR") else None
    if root is not None and root.is_dir() and not root.is_symlink() and root.stat().st_uid == os.getuid():
        root.chmod(0o700)


def forget(folder: Path | None) -> None:
    """Remove the token folder keep_private made."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get("RAY_AUTH_TOKEN_PATH", "").startswith(str(folder)):
            del os.environ["RAY_AUTH_TOKEN_PATH"]
