"""The bearer token of a team's server: rest_lsp.auth's token file and constant-time compare, for HTTP headers."""

from __future__ import annotations

from pathlib import Path

from rest_lsp.auth import TokenError, read_token as _read_token, token_matches
from rest_lsp.errors import UserError


def read_token(path: str | Path) -> str:
    """The token in `path` (one line, a file only its owner can read); a UserError that says what is wrong."""
    try:
        return _read_token(path)
    except TokenError as err:
        raise UserError(str(err)) from None


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries `token`; the comparison takes the same time wherever they differ."""
    scheme, _, given = (header or "").partition(" ")
    return token_matches(token, given.strip()) and scheme.lower() == "bearer"
