"""The wire format between an editor's language server and a team's replicas (pydantic models, JSON over HTTP).

A workspace travels as token ids: a snapshot (every document, with the tokenizer's key, under a new epoch the
client chooses), then deltas (puts and removes) numbered 1, 2, ... within that epoch. A replica that misses one
(a gap, an unknown epoch, a workspace it never saw) answers `need_snapshot` and the client sends a new snapshot.
Edits and cursor moves are hints (warm-up, prefetch, typing pace) in numbered batches: a batch older than one
already applied is dropped. A completion carries the hints not yet sent, so they are applied before it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

API = "/v1"
WORKSPACE_HEADER = "x-session-id"  # Serve's session header: the request router keeps a workspace on one replica
# The session header's suffix on a workspace's last request (its DELETE): routed as the workspace's, after which the
# router forgets it, so closed workspaces never count against their replica when new ones are placed
CLOSING = "#closing"
MAX_ID_CHARS = 4096

# Editor settings a client may set for its workspace on the replica: every one that shapes a suggestion. The
# model is the server's (SERVER_SETTINGS); what is indexed, the editor's (LOCAL_SETTINGS: its files stay there).
# Each field of settings.Settings is in exactly one of the three (tests/team/test_replica_app.py checks).
CLIENT_SETTINGS = frozenset({
    "maxNewTokens", "maxLines", "draftBudget", "draftExclude", "contextTokens", "suffixFraction",
    "extraContextTokens", "debounceMs", "debounceMaxMs", "timeBudgetMs", "waitBudgetMs", "suggestionCacheSize",
    "prefetch", "documentCacheMb"})
SERVER_SETTINGS = frozenset({"model", "device", "dtype"})
LOCAL_SETTINGS = frozenset({"ignore", "indexWorkspace", "maxFileBytes", "cacheDir"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Doc(_Strict):
    doc_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    tokens: list[int]
    source: Literal["workspace", "buffer"] = "workspace"


class Snapshot(_Strict):
    epoch: str = Field(min_length=1, max_length=64)
    tokenizer_key: str = Field(min_length=1, max_length=64)
    docs: list[Doc] = []
    settings: dict = {}


class Delta(_Strict):
    epoch: str = Field(min_length=1, max_length=64)
    seq: int = Field(ge=1)
    puts: list[Doc] = []
    removes: list[str] = []


class SyncReply(_Strict):
    epoch: str | None
    seq: int
    need_snapshot: bool = False
    reason: str | None = None
    replica: str = ""


class Event(_Strict):
    kind: Literal["change", "cursor", "cancel", "close"]
    doc_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    text: str | None = None
    offset: int | None = Field(default=None, ge=0)


class Events(_Strict):
    seq: int = Field(ge=1)
    events: list[Event] = []


class CompleteRequest(_Strict):
    request_id: str = Field(min_length=1, max_length=64)
    doc_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    text: str
    offset: int = Field(ge=0)
    events: Events | None = None
    settings: dict | None = None  # the editor's (CLIENT_SETTINGS): a replica new to the workspace answers alike


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
    request_id: str = Field(min_length=1, max_length=64)


class AcceptRequest(_Strict):
    id: int | None = None
    text: str


class DraftsRequest(_Strict):
    text: str


class TokenizerReply(_Strict):
    key: str
    tokenizer: str  # the serialized Rust tokenizer (saved_tokenizer.SavedTokenizer reads it)
    split_special_tokens: bool
    vocab_size: int


class Problem(_Strict):
    """The body of a refusal the client acts on (HTTP 409)."""
    detail: str
    kind: Literal["tokenizer", "snapshot"]
