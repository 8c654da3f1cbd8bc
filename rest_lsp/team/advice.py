"""What the editor is told when the team server cannot be used: one sentence that names the real cause (a refusal
by its HTTP status, a TLS failure by the certificate's fault) and the fix that matches it."""

from __future__ import annotations

from rest_lsp.team.http import Refused, Untrusted


def untrusted(url: str, err: Untrusted, ca_file: str | None) -> str:
    """A certificate that did not verify: expired, not valid yet, made for another host, or from an unknown CA
    (only then is --remote-ca-file the fix)."""
    where, why = f"the team server at {url}", str(err).rstrip(".")
    if err.cause == "expired":
        return f"{where} has an expired certificate ({why}): the team must renew it (rest-lsp serve --tls-cert)"
    if err.cause == "not_yet_valid":
        return (f"{where} has a certificate that is not valid yet ({why}): check this computer's clock, or the "
                "certificate's start date")
    if err.cause == "wrong_host":
        return (f"{where} has a certificate made for another host name ({why}): use the name the certificate "
                "was made for in --remote, or have the team add this one to it")
    if err.cause == "unknown_ca" and ca_file:
        return (f"{where} has a certificate not signed by the CA in --remote-ca-file {ca_file} ({why}): give the "
                "CA certificate the server's certificate was made with")
    if err.cause == "unknown_ca":
        return (f"{where} has a certificate this editor does not trust ({why}): give its CA certificate with "
                "--remote-ca-file")
    return f"{where} has a certificate that does not verify ({why})"


def refused(url: str, err: Refused) -> str:
    """A refusal of the workspace or of the token, by its status."""
    where = f"the team server at {url}"
    detail = _sentence(err.detail)
    if err.status == 401:
        return (f"{where} refused the token in --token-file: it may have been replaced; ask the team for the "
                "current one")
    if err.status == 403:
        return f"{where} forbids this editor's requests: {detail}"
    if err.status == 413:
        return (f"{where} takes no workspace this large: {detail} (leave big files out with the ignore or "
                "maxFileBytes settings)")
    if err.status == 409:
        return f"{where} refused the workspace: {detail}"
    return f"{where} refused the workspace (HTTP {err.status}): {detail}"


def _sentence(detail: str) -> str:
    """The server's own sentence, on one line and bounded."""
    text = " ".join(str(detail).split())
    return text if len(text) <= 300 else text[:299] + "…"
