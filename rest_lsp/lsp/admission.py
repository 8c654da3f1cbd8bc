"""Who the server answers: one `initialize` a process, and on TCP only a first `initialize` holding the token."""

from __future__ import annotations

import logging
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidRequest
from pygls.protocol import LanguageServerProtocol

from rest_lsp.auth import token_matches

log = logging.getLogger(__name__)

TOKEN_OPTION = "token"  # where a TCP client presents the token: initializationOptions.token
SECOND_INITIALIZE = "rest-lsp is already initialized: a second initialize is refused (the first one is kept)."
BUSY = "This rest-lsp already serves another client: start another server (another port) for another editor."
NOT_FIRST = "The first message on a rest-lsp connection must be an initialize request."
NO_TOKEN = ("This rest-lsp needs a token: put the one in its --token-file into initializationOptions.token of "
            "the initialize request.")
WRONG_TOKEN = "The token in initializationOptions.token is not this server's."


def strip_token(options: Any) -> None:
    """Take the token out of initializationOptions (a dict), so it reaches no setting and no log."""
    if isinstance(options, dict):
        options.pop(TOKEN_OPTION, None)


def admit(message: Any, token: str | None) -> str | None:
    """None when `message` (a decoded JSON-RPC message) is an initialize request that presents `token` (any
    initialize when the token is None); else the one sentence that says why the connection is refused."""
    if not (isinstance(message, dict) and message.get("method") == types.INITIALIZE and "id" in message):
        return NOT_FIRST
    if token is None:
        return None
    params = message.get("params")
    options = params.get("initializationOptions") if isinstance(params, dict) else None
    presented = options.get(TOKEN_OPTION) if isinstance(options, dict) else None
    if presented is None:
        return NO_TOKEN
    return None if token_matches(token, presented) else WRONG_TOKEN


class OnceInitializedProtocol(LanguageServerProtocol):
    """pygls' protocol, but a second `initialize` is answered InvalidRequest before pygls would replace its
    workspace and the server build a second service, and only the first `initialized` after it passes (another
    would start the service again: a second model load); the token never reaches the settings."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initialize_seen = False
        self.initialized_seen = False

    def handle_message(self, message) -> None:
        method = getattr(message, "method", None)
        if method == types.INITIALIZE and getattr(message, "id", None) is not None:
            if self.initialize_seen:
                log.warning("%s", SECOND_INITIALIZE)
                self._send_response(message.id, None, JsonRpcInvalidRequest(SECOND_INITIALIZE).to_response_error())
                return
            self.initialize_seen = True
            strip_token(getattr(message.params, "initialization_options", None))
        elif method == types.INITIALIZED:
            if self.initialized_seen or not self.initialize_seen:
                log.warning("An initialized notification %s is ignored.",
                            "before initialize" if not self.initialize_seen else "after the first")
                return
            self.initialized_seen = True
        super().handle_message(message)
