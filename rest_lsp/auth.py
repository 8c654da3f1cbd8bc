"""Who may talk to a network mode (`--tcp`, `serve`, `--remote`): the token file, its constant-time compare (an LSP
option or an HTTP bearer header), and the one rule for which hosts are loopback.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import stat
from pathlib import Path

from rest_lsp.errors import UserError

MIN_TOKEN_CHARS = 16  # shorter ones can be guessed; `secrets.token_urlsafe(32)` gives 43
MAKE_ONE = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE && chmod 600 FILE"


class TokenError(UserError, ValueError):
    """A token file that cannot be used; str(err) is one sentence for the user."""


def read_token(path: str | os.PathLike) -> str:
    """The token in `path` (its one line, whitespace stripped).

    Refused: a file others may read or write (mode & 0o077, as ssh refuses a private key), an empty one, one
    of several lines, or a token shorter than MIN_TOKEN_CHARS.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise TokenError(f"The token file {path} is not a regular file.")
            if mode & 0o077:
                raise TokenError(f"The token file {path} can be read or written by other users (mode "
                                 f"{stat.S_IMODE(mode):o}): run `chmod 600 {path}`.")
            raw = f.read(4096)
    except OSError as err:
        raise TokenError(f"Cannot read the token file {path} ({err.strerror or err}).") from None
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenError(f"The token file {path} must hold one line of ASCII text.") from None
    if not token or any(c.isspace() for c in token) or not token.isprintable():
        raise TokenError(f"The token file {path} must hold one token on one line; make one with: {MAKE_ONE}")
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"The token in {path} is shorter than {MIN_TOKEN_CHARS} characters; make a longer "
                         f"one with: {MAKE_ONE}")
    return token


def token_matches(expected: str, presented: object) -> bool:
    """True when `presented` is `expected`, compared in constant time (a str of another length or type: False)."""
    if not isinstance(presented, str):
        return False
    return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), expected.encode("utf-8"))


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries `token`; the comparison takes the same time wherever they differ."""
    scheme, _, given = (header or "").partition(" ")
    return token_matches(token, given.strip()) and scheme.lower() == "bearer"


def is_loopback(host: str) -> bool:
    """True for 'localhost' and loopback IP literals (127.0.0.0/8, ::1); any other name may resolve to anything, so
    it is not. Where this holds, a network mode may go without a token (`--tcp`) or without TLS (`serve`,
    `--remote`)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
