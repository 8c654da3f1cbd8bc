"""The bearer token of a team's server: read from a file, compared in constant time."""

from __future__ import annotations

import hmac
from pathlib import Path

from rest_lsp.errors import UserError

MIN_TOKEN_CHARS = 16


def read_token(path: str | Path) -> str:
    """The token in `path` (surrounding whitespace dropped); a missing, empty or short one is a UserError."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read the token file {str(path)!r}: {err}") from err
    if len(token) < MIN_TOKEN_CHARS:
        raise UserError(f"the token in {str(path)!r} is shorter than {MIN_TOKEN_CHARS} characters.")
    return token


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries `token`; the comparison takes the same time wherever they differ."""
    scheme, _, given = (header or "").partition(" ")
    return hmac.compare_digest(given.strip().encode(), token.encode()) and scheme.lower() == "bearer"
