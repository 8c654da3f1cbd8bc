"""Suggestions kept for later, so that a request can be answered without decoding.

Two stores, with different promises:
  - `SuggestionCache`: an LRU of suggestions by document and place, as Tabby, Continue and llama.vim keep one. A
    request is matched against what was typed since: a user who typed the start of a cached suggestion gets its rest,
    one who deleted back to an earlier spot gets that spot's suggestion again. An entry is for one text of one
    document (the whole text, since that bounds every prompt window): a hit never comes from another version.
  - `Prefetch`: the suggestions computed ahead, while the user is idle, for the text that accepting the shown
    suggestion makes (and the next line of it). One is served only for exactly that document text and cursor:
    hashes and lengths of the whole prefix and suffix, so it is never returned for another version.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from rest_lsp.service.postprocess import BLOCK_OPENERS

KEY_PREFIX_CHARS = 256  # prefix characters hashed into a cache key before the whole text is compared
TYPED_SCAN_CHARS = 128  # how many typed characters a cached suggestion may lie behind the cursor (llama.vim: 128)
# prefetched suggestions kept: after the accepted text, on the next line, and at the last change (a guess)
PREFETCH_PLACES = 3
INDENT_UNIT = "    "  # one level of auto-indent after a block opener, in a file indented with spaces


def text_settings(settings) -> tuple:
    """The settings a suggestion's text depends on besides the model: a change makes every kept suggestion stale."""
    return (settings.max_new_tokens, settings.max_lines, settings.context_tokens, settings.suffix_fraction,
            settings.time_budget_ms, settings.wait_budget_ms, settings.draft_budget, settings.draft_exclude,
            settings.extra_context_tokens)


class SuggestionCache:
    """A bounded LRU of suggestions by document and place (the caller serializes access).

    A suggestion is only ever served for the text it was computed for: the entry holds the document, the cursor's
    offset, a hash of the KEY_PREFIX_CHARS before it, and length and hash of the whole text on either side (what any
    prompt window of that place can hold), never the text. An edit anywhere in the document, another document, or
    the same nearby text elsewhere is a miss."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        # (doc id, offset, hash of the nearby prefix, suffix length, suffix hash) -> (prefix hash, suggestion)
        self._entries: OrderedDict[tuple, tuple[int, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _key(doc_id: str, before: str, end: int, after: str) -> tuple:
        return doc_id, end, hash(before[max(0, end - KEY_PREFIX_CHARS): end]), len(after), hash(after)

    def put(self, doc_id: str, before: str, after: str, text: str) -> None:
        if self.capacity <= 0 or not text.strip():
            return
        key = self._key(doc_id, before, len(before), after)
        self._entries[key] = (hash(before), text)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def forget(self, doc_id: str) -> None:
        """The document closed: its suggestions go."""
        for key in [k for k in self._entries if k[0] == doc_id]:
            del self._entries[key]

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        while len(self._entries) > max(0, capacity):
            self._entries.popitem(last=False)

    def match(self, doc_id: str, before: str, after: str) -> str | None:
        """What to show at this cursor: the rest of a suggestion cached for this very text with the cursor here or up
        to TYPED_SCAN_CHARS characters back, of which the user typed the start; None when nothing (non-blank) is
        left."""
        if not self._entries:
            return None
        for typed in range(min(TYPED_SCAN_CHARS, len(before)) + 1):
            end = len(before) - typed
            key = self._key(doc_id, before, end, after)
            found = self._entries.get(key)
            if found is None or not found[1].startswith(before[end:]) or found[0] != hash(before[:end]):
                continue
            rest = found[1][typed:]
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

    def forget_document(self, doc_id: str) -> None:
        """The document closed: its wishes and prefetched suggestions go."""
        self._wanted = deque(w for w in self._wanted if w[0] != doc_id)
        self._ready = {place: text for place, text in self._ready.items() if place.doc_id != doc_id}

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
