"""Suggestions as text: what was shown (for type-through and acceptance), and the model's tokens turned into text
while decoding runs (only the new tokens decoded at each step) and at its end (never a broken last character)."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

TYPE_THROUGH_ENTRIES = 8
ACCEPT_CONTEXT_CHARS = 256  # text before an accepted completion stored with it, so drafts match where it goes
DECODE_OVERLAP = 4  # ids decoded again before the new ones, for tokenizers whose text depends on the neighbours


class Place(Protocol):
    """Where a suggestion goes: a document and the text on either side of the cursor (a scheduling Job is one)."""

    doc_id: str
    before: str
    after: str


@dataclass(frozen=True)
class Shown:
    """A suggestion as it was shown, for type-through and acceptance.

    It keeps the length, a hash and a short tail of the text around the cursor, never whole documents: eight
    entries of a 1 MB file would hold 16 MB.
    """

    id: int
    doc_id: str
    before_len: int
    before_hash: int
    before_tail: str  # the last ACCEPT_CONTEXT_CHARS characters before the cursor
    after_len: int
    after_hash: int
    text: str

    @classmethod
    def of(cls, id: int, place: Place, text: str) -> "Shown":
        return cls(id, place.doc_id, len(place.before), hash(place.before), place.before[-ACCEPT_CONTEXT_CHARS:],
                   len(place.after), hash(place.after), text)

    def typed_over(self, place: Place) -> str | None:
        """What the user typed since this was shown, when the place's text is this one's with it typed at the
        cursor; else None."""
        if place.doc_id != self.doc_id or len(place.after) != self.after_len or len(place.before) < self.before_len:
            return None
        shown_before = place.before[: self.before_len]
        if not shown_before.endswith(self.before_tail) or hash(shown_before) != self.before_hash:
            return None
        if hash(place.after) != self.after_hash:
            return None
        return place.before[self.before_len:]


class ShownSuggestions:
    """The last TYPE_THROUGH_ENTRIES suggestions shown (the caller serializes access)."""

    def __init__(self) -> None:
        self._entries: deque[Shown] = deque(maxlen=TYPE_THROUGH_ENTRIES)
        self._ids = itertools.count(1)
        self._retired = 0  # suggestions with ids up to this one are kept for acceptance only, not typed through

    def retire(self) -> None:
        """The model or a setting that shapes suggestions changed: what was shown so far is not typed through."""
        if self._entries:
            self._retired = self._entries[-1].id

    def add(self, place: Place, text: str) -> Shown:
        shown = Shown.of(next(self._ids), place, text)
        self._entries.append(shown)
        return shown

    def typed_through(self, place: Place) -> tuple[Shown, str] | None:
        """(the suggestion, its rest) when the user typed the start of a suggestion shown at the place's cursor."""
        for shown in reversed(self._entries):
            if shown.id <= self._retired:
                break
            typed = shown.typed_over(place)
            if typed and shown.text.startswith(typed) and shown.text[len(typed):].strip():
                return shown, shown.text[len(typed):]
        return None

    def get(self, id: int | None) -> Shown | None:
        return next((s for s in self._entries if s.id == id), None)

    def __iter__(self) -> Iterator[Shown]:
        return iter(list(self._entries))


class IncrementalText:
    """The text of a growing list of new token ids, decoding only the ids added since the last call (plus
    DECODE_OVERLAP before them: SentencePiece drops the leading space of the first id it decodes)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._final = 0  # ids whose text is final (no partial character at their end)
        self._final_text = ""

    def text(self, ids: list[int]) -> str:
        start = max(0, self._final - DECODE_OVERLAP)
        head = self._decode(ids[start : self._final]) if start < self._final else ""
        tail = self._decode(ids[start:])
        text = self._final_text + tail[len(head):] if tail.startswith(head) else self._decode(ids)
        if not text.endswith("\ufffd"):
            self._final, self._final_text = len(ids), text
        return text


def whole_characters(decode: Callable[[list[int]], str], tokens: list[int]) -> list[int]:
    """`tokens` without a last character cut in the middle (a token limit can stop inside a multi-byte
    character, which decodes to U+FFFD)."""
    for _ in range(3):  # a character has at most 4 bytes: at most 3 tokens of an unfinished one
        if not tokens or not decode(tokens).endswith("\ufffd"):
            break
        tokens = tokens[:-1]
    return tokens
