"""Suggestions kept for later, so that a request can be answered without decoding.

Two stores, with different promises:
  - `SuggestionCache`: an LRU of suggestions keyed by the text around the cursor (the tail of the prefix, the rest of
    the cursor line and the next non-blank line), as Tabby, Continue and llama.vim keep one. A request is matched
    against what was typed since: a user who typed the start of a cached suggestion gets its rest, one who deleted
    back to an earlier spot gets that spot's suggestion again. The key is the nearby text only, so a hit may come from
    another version of the document (that is the point: the text around the cursor is what the model looked at most).
  - `Prefetch`: the suggestions computed ahead, while the user is idle, for the text that accepting the shown
    suggestion makes (and the next line of it). One is served only for exactly that document text and cursor:
    hashes and lengths of the whole prefix and suffix, so it is never returned for another version.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from rest_lsp.service.postprocess import BLOCK_OPENERS

KEY_PREFIX_CHARS = 256  # prefix characters in a cache key: enough to tell two places of one file apart
KEY_SUFFIX_CHARS = 4096  # how far the suffix is searched for the next non-blank line (the suffix may be megabytes)
TYPED_SCAN_CHARS = 128  # how many typed characters a cached suggestion may lie behind the cursor (llama.vim: 128)
# prefetched suggestions kept: after the accepted text, on the next line, and at the last change (a guess)
PREFETCH_PLACES = 3
INDENT_UNIT = "    "  # one level of auto-indent after a block opener, in a file indented with spaces


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
    """The suggestions that follow accepting the shown one: which texts to compute them for next, and the ones
    computed (the caller serializes access; the computing happens on the decoder's thread).

    Two places are wished for, in order: the cursor right after the accepted text (where the editor asks at once),
    and, when that is a line end, the start of the next line after the user presses Enter (where a suggestion
    that ended with its line is continued; at a line end the stop rules show nothing more). The next line's
    indentation is the editor's auto-indent guessed: the line's own, one level deeper after a block opener."""

    def __init__(self) -> None:
        self._wanted: deque[tuple[str, str, str]] = deque()  # (doc_id, before, after) to compute while idle
        self._ready: dict[Place, str] = {}  # at most PREFETCH_PLACES

    def want(self, doc_id: str, before: str, after: str, shown: str) -> None:
        """A suggestion is shown: the next prefetches are for the text with it inserted (replaces older wishes;
        the texts are whole documents, held until the worker takes them)."""
        accepted = before + shown
        self._wanted = deque([(doc_id, accepted, after)])
        line = accepted[accepted.rfind("\n") + 1:]
        rest = after.split("\n", 1)[0]
        if line.strip() and not rest.strip():
            self._wanted.append((doc_id, accepted + "\n" + _next_indent(line), after))

    def take_wanted(self) -> tuple[str, str, str] | None:
        while self._wanted:
            wanted = self._wanted.popleft()
            if Place.of(*wanted) not in self._ready:  # else computed already
                return wanted
        return None

    def keep_wishes_after(self, doc_id: str, before: str, after: str) -> None:
        """The document changed, the cursor now after `before`: a wish for the document survives only if that text
        still leads to it (the shown suggestion being accepted, or typed over), else it is computing for text the
        person did not write."""
        self._wanted = deque(w for w in self._wanted if w[0] != doc_id or leads_to(before, after, w[1], w[2]))

    def drop_wishes(self) -> None:
        self._wanted.clear()

    def forget(self) -> None:
        self._wanted.clear()
        self._ready.clear()

    def store(self, doc_id: str, before: str, after: str, text: str) -> None:
        self._ready[Place.of(doc_id, before, after)] = text
        while len(self._ready) > PREFETCH_PLACES:
            del self._ready[next(iter(self._ready))]  # the oldest

    def has(self, doc_id: str, before: str, after: str) -> bool:
        return Place.of(doc_id, before, after) in self._ready

    def serve(self, doc_id: str, before: str, after: str) -> str | None:
        """The prefetched text ("" = the model had nothing to show) when it was computed for exactly this text and
        cursor; else None. Served once."""
        if not self._ready:
            return None
        return self._ready.pop(Place.of(doc_id, before, after), None)


def leads_to(before: str, after: str, to_before: str, to_after: str) -> bool:
    """Whether typing on from the cursor between `before` and `after` can reach the place between `to_before` and
    `to_after`."""
    return to_after == after and to_before.startswith(before)


def _next_indent(line: str) -> str:
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    if line.rstrip().endswith(BLOCK_OPENERS):
        indent += "\t" if indent.startswith("\t") else INDENT_UNIT
    return indent
