"""Suggestions kept for later, so that a request can be answered without decoding.

Two stores, with different promises:
  - `SuggestionCache`: an LRU of suggestions keyed by the text around the cursor (the tail of the prefix, the rest of
    the cursor line and the next non-blank line), as Tabby, Continue and llama.vim keep one. A request is matched
    against what was typed since: a user who typed the start of a cached suggestion gets its rest, one who deleted
    back to an earlier spot gets that spot's suggestion again. The key is the nearby text only, so a hit may come from
    another version of the document (that is the point: the text around the cursor is what the model looked at most).
  - `Prefetch`: the one suggestion computed ahead, while the user is idle, for the text that accepting the shown
    suggestion makes. It is served only for exactly that document text and cursor: hashes and lengths of the whole
    prefix and suffix, so it is never returned for another version.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

KEY_PREFIX_CHARS = 256  # prefix characters in a cache key: enough to tell two places of one file apart
KEY_SUFFIX_CHARS = 4096  # how far the suffix is searched for the next non-blank line (the suffix may be megabytes)
TYPED_SCAN_CHARS = 128  # how many typed characters a cached suggestion may lie behind the cursor (llama.vim: 128)


def _suffix_key(after: str) -> tuple[str, str]:
    """The rest of the cursor line and the next non-blank line: what the stop rules read of the suffix."""
    nl = after.find("\n")
    if nl < 0:
        return after, ""
    for line in after[nl + 1: nl + 1 + KEY_SUFFIX_CHARS].splitlines():
        if line.strip():
            return after[:nl], line
    return after[:nl], ""


class SuggestionCache:
    """A bounded LRU of suggestions by the text around their cursor (the caller serializes access)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _key(before: str, end: int, suffix_key: tuple[str, str]) -> int:
        return hash((before[max(0, end - KEY_PREFIX_CHARS): end], suffix_key))

    def put(self, before: str, after: str, text: str) -> None:
        if self.capacity <= 0 or not text.strip():
            return
        key = self._key(before, len(before), _suffix_key(after))
        self._entries[key] = text
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        while len(self._entries) > max(0, capacity):
            self._entries.popitem(last=False)

    def match(self, before: str, after: str) -> str | None:
        """What to show at this cursor: the rest of a suggestion cached here or up to TYPED_SCAN_CHARS characters
        back, of which the user typed the start; None when nothing (non-blank) is left."""
        if not self._entries:
            return None
        suffix_key = _suffix_key(after)
        for typed in range(min(TYPED_SCAN_CHARS, len(before)) + 1):
            end = len(before) - typed
            key = self._key(before, end, suffix_key)
            text = self._entries.get(key)
            if text is None or not text.startswith(before[end:]):
                continue
            rest = text[typed:]
            if rest.strip():
                self._entries.move_to_end(key)
                return rest
        return None


@dataclass(frozen=True)
class Place:
    """A cursor in one version of one document: lengths and hashes of the text on both sides, never the text."""

    doc_id: str
    before_len: int
    before_hash: int
    after_len: int
    after_hash: int

    @classmethod
    def of(cls, doc_id: str, before: str, after: str) -> "Place":
        return cls(doc_id, len(before), hash(before), len(after), hash(after))


class Prefetch:
    """The suggestion that follows accepting the shown one: which text to compute it for next, and the one computed
    (the caller serializes access; the computing happens on the decoder's thread)."""

    def __init__(self) -> None:
        self._wanted: tuple[str, str, str] | None = None  # (doc_id, before, after) to compute while idle
        self._ready: tuple[Place, str] | None = None

    def want(self, doc_id: str, before: str, after: str, shown: str) -> None:
        """A suggestion is shown: the next prefetch is for the text with it inserted, cursor after it (replaces an
        older wish; the text is the whole document, held until the worker takes it)."""
        self._wanted = (doc_id, before + shown, after)

    def take_wanted(self) -> tuple[str, str, str] | None:
        wanted, self._wanted = self._wanted, None
        if wanted is not None and self._ready is not None and self._ready[0] == Place.of(*wanted):
            return None  # computed already
        return wanted

    def forget(self) -> None:
        self._wanted = None
        self._ready = None

    def store(self, doc_id: str, before: str, after: str, text: str) -> None:
        self._ready = (Place.of(doc_id, before, after), text)

    def serve(self, doc_id: str, before: str, after: str) -> str | None:
        """The prefetched text ("" = the model had nothing to show) when it was computed for exactly this text and
        cursor; else None. Served once."""
        if self._ready is None:
            return None
        place, text = self._ready
        if place != Place.of(doc_id, before, after):
            return None
        self._ready = None
        return text
