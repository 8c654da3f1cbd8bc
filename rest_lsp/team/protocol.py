"""The wire format between an editor's language server and a team's replicas (pydantic models, JSON over HTTP).

A workspace travels as token ids: a snapshot (every document, with the tokenizer's key, under a new epoch the
client chooses), then deltas (puts and removes) numbered 1, 2, ... within that epoch. A replica that misses one
(a gap, an unknown epoch, a workspace it never saw) answers `need_snapshot` and the client sends a new snapshot.
Edits and cursor moves are hints (warm-up, prefetch, typing pace) in numbered batches: a batch older than one
already applied is dropped. A completion carries the hints not yet sent, so they are applied before it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict

API = "/v1"
WORKSPACE_HEADER = "x-session-id"  # Serve's session header: the request router keeps a workspace on one replica
# The session header's suffix on a workspace's last request (its DELETE): routed as the workspace's, after which the
# router forgets it, so closed workspaces never count against their replica when new ones are placed
CLOSING = "#closing"
MAX_ID_CHARS = 4096
WORKSPACE_ID_CHARS = (1, 200)  # a workspace id in the path (percent-decoded)
# The secret of a workspace's editor, made once per workspace (128 random bits or more): every route under the
# workspace wants it; the first call that creates the workspace binds its sha256 to it
KEY_HEADER = "X-Rest-Lsp-Workspace-Key"
KEY_PATTERN = r"^[A-Za-z0-9_-]{32,128}$"
TEXT_CHARS = 4 << 20  # a document's text or an accepted suggestion, in characters
TOKEN_ID_LIMIT = 1 << 31  # ids past any vocabulary; the replica checks the real vocabulary (workspaces._checked)
MAX_DOCS = 200_000  # documents in one snapshot or delta
MAX_EVENTS = 1024  # hints in one batch
MAX_SETTINGS = 64  # entries of an editor's settings

# Editor settings a client may set for its workspace on the replica: every one that shapes a suggestion. The
# model is the server's (SERVER_SETTINGS); what is indexed, the editor's (LOCAL_SETTINGS: its files stay there).
# Each field of settings.Settings is in exactly one of the three (tests/team/test_replica_app.py checks).
CLIENT_SETTINGS = frozenset({
    "maxNewTokens", "maxLines", "draftBudget", "draftExclude", "contextTokens", "suffixFraction",
    "extraContextTokens", "debounceMs", "debounceMaxMs", "timeBudgetMs", "waitBudgetMs", "suggestionCacheSize",
    "prefetch", "documentCacheMb"})
SERVER_SETTINGS = frozenset({"model", "device", "dtype"})
LOCAL_SETTINGS = frozenset({"ignore", "indexWorkspace", "maxFileBytes", "cacheDir"})


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("it holds a lone surrogate, which is not valid UTF-8") from None
    return text


def _text(most: int, least: int = 0):
    """A string of `least` to `most` characters that encodes as UTF-8 (a JSON "\\ud800" alone does not)."""
    return Annotated[str, Strict(), Field(min_length=least, max_length=most), AfterValidator(_utf8)]


def _count(least: int = 0, most: int = 1 << 53):
    """An integer from `least` to `most` (JSON numbers only: not 1.0, not "1", not true)."""
    return Annotated[int, Strict(), Field(ge=least, le=most)]


Id = _text(MAX_ID_CHARS, 1)
Name = _text(64, 1)
TokenId = _count(0, TOKEN_ID_LIMIT - 1)
SETTING_CHARS = 4096


def _setting(value: Any) -> Any:
    """What settings.Settings may take (it checks each name's own type and range): null, true or false, a finite
    number, a bounded string or a bounded list of them."""
    def fits(v) -> bool:
        if isinstance(v, str):
            return len(v) <= SETTING_CHARS and _utf8(v) is v
        if isinstance(v, float):
            return math.isfinite(v)
        return v is None or isinstance(v, bool) or (isinstance(v, int) and abs(v) < 1 << 53)

    if fits(value) or (isinstance(value, list) and len(value) <= 1024 and all(isinstance(v, str) and fits(v)
                                                                              for v in value)):
        return value
    raise ValueError("a setting must be null, true or false, a finite number, a string or a list of strings")


# An editor's settings by name (CLIENT_SETTINGS; the replica ignores the rest, Settings checks each value)
Settings = Annotated[dict[_text(64, 1), Annotated[Any, AfterValidator(_setting)]], Field(max_length=MAX_SETTINGS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Doc(_Strict):
    doc_id: Id
    tokens: list[TokenId]
    source: Literal["workspace", "buffer"] = "workspace"


class Snapshot(_Strict):
    epoch: Name
    tokenizer_key: Name
    docs: Annotated[list[Doc], Field(max_length=MAX_DOCS)] = []
    settings: Settings = {}


class Delta(_Strict):
    epoch: Name
    seq: _count(1)
    puts: Annotated[list[Doc], Field(max_length=MAX_DOCS)] = []
    removes: Annotated[list[Id], Field(max_length=MAX_DOCS)] = []


class SyncReply(_Strict):
    epoch: str | None
    seq: int
    need_snapshot: bool = False
    reason: str | None = None
    replica: str = ""


class Event(_Strict):
    kind: Literal["change", "cursor", "cancel", "close"]
    doc_id: Id
    text: _text(TEXT_CHARS) | None = None
    offset: _count() | None = None


class Events(_Strict):
    seq: _count(1)
    events: Annotated[list[Event], Field(max_length=MAX_EVENTS)] = []


class CompleteRequest(_Strict):
    request_id: Name
    doc_id: Id
    text: _text(TEXT_CHARS)
    offset: _count()
    events: Events | None = None
    settings: Settings | None = None  # the editor's (CLIENT_SETTINGS): a replica new to the workspace answers alike


class CompleteReply(_Strict):
    text: str | None = None
    id: int | None = None
    source: str | None = None
    tokens: int = 0
    steps: int = 0
    latency_ms: float = 0.0
    need_snapshot: bool = False
    replica: str = ""


class CancelRequest(_Strict):
    request_id: Name


class AcceptRequest(_Strict):
    id: _count(-(1 << 53)) | None = None
    text: _text(TEXT_CHARS)


class DraftsRequest(_Strict):
    text: _text(TEXT_CHARS)


class ChunkCommit(_Strict):
    """The end of a snapshot sent in chunks: how many, and the sha256 of the JSON they decompress to."""
    count: _count(1, 1 << 16)
    sha256: Annotated[str, Strict(), Field(pattern=r"^[0-9a-fA-F]{64}$")]


class ChunksReceived(_Strict):
    received: list[int]


class TokenizerReply(_Strict):
    key: str
    tokenizer: str  # the serialized Rust tokenizer (saved_tokenizer.SavedTokenizer reads it)
    split_special_tokens: bool
    vocab_size: int


class Problem(_Strict):
    """The body of a refusal the client acts on (HTTP 409)."""
    detail: str
    kind: Literal["tokenizer", "snapshot"]
