"""Who a workspace is on a team's server, as its editor names it: an id that is safe in a URL and a header whatever
the folder is called, and the key that proves the editor made it.

The id is a label for logs (user@host:folder, every character outside [A-Za-z0-9._@:-] replaced by `_`, cut short),
a digest of the folders' paths and a random part: two editors on one folder never share it. It always travels
percent-encoded (`quoted`). The key is a secret made with the id (a new id, a new key), sent on every call under
the workspace (KEY_HEADER) and nowhere else: never logged, never in an error message. A server that does not know
the id with that key answers as for a workspace that does not exist, and the editor sends a snapshot.
"""

from __future__ import annotations

import getpass
import hashlib
import re
import secrets
import socket
from pathlib import Path
from urllib.parse import quote

from rest_lsp.team.protocol import KEY_HEADER  # noqa: F401 - the header the workspace's key travels in

LABEL_CHARS = 48  # the readable part of an id; the server takes ids of up to 200 characters
_UNSAFE = re.compile(r"[^A-Za-z0-9._@:-]+")


def workspace_id(roots: list[Path]) -> str:
    """user@host:folder-<digest of the folders>-<random>, in ASCII whatever the names hold."""
    paths = sorted(str(r) for r in roots)
    name = Path(paths[0]).name if paths else "no-folder"
    digest = hashlib.sha256(",".join(paths).encode("utf-8", "surrogatepass")).hexdigest()[:8]
    label = _UNSAFE.sub("_", f"{_user()}@{socket.gethostname()}:{name}")[:LABEL_CHARS]
    return f"{label}-{digest}-{secrets.token_hex(8)}"


def new_key() -> str:
    """A workspace's key: 256 random bits, URL-safe base64 (43 characters of [A-Za-z0-9_-])."""
    return secrets.token_urlsafe(32)


def quoted(workspace: str) -> str:
    """The id as it goes into a URL path or a header: percent-encoded, `/` and `#` included."""
    return quote(workspace, safe="")


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in the environment or the password database
        return "someone"
