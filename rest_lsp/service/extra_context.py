"""Other files' context: chunks of the documents the person used recently (and of the current file's folder),
placed before the file's window in the prompt, as llama.vim's ring chunks and Copilot's neighbouring tabs are.

Where: right after the BOS, before the file's window and the FIM markers. Typing in the file changes only what
follows them, so the decoder's KV cache of the chunks survives every keystroke.

When: the chunks of a document are chosen once and kept while the set of candidate documents stays the same (a
set, not a recency order: switching between two files keeps both files' choices, and so their per-document KV
caches). A new document used, a candidate leaving the datastore, or another budget or template chooses again.

What: candidates are the documents used recently (opened, edited or asked in; closed ones too, as llama.vim's
ring keeps them) and the documents of the current file's folder, each only while the datastore holds it (the
workspace index and the open buffers: nothing else is ever read, and a chunk whose document left the datastore
is dropped at once). Each candidate is cut into windows of CHUNK_LINES lines; a window scores its share of the
identifiers near the cursor (Copilot's Jaccard neighbour), plus DEFINITION_BONUS for each definition
(`def NAME`, `class NAME`, `NAME =` at a line start, ...) of a name used near the cursor that the current file does
not define; a recently used document's windows score RECENT_BONUS more. The best windows, one per document
first, fill the budget; the best goes last, nearest the file.

How: Qwen2.5-Coder's repo-level format where the vocabulary has it (`<|repo_name|>NAME\\n<|file_sep|>PATH\\nTEXT`
per chunk, then `<|file_sep|>PATH\\n` of the current file before `<|fim_prefix|>`); else each chunk after a
comment line naming its path, in the current file's comment syntax.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import unquote, urlparse

# Documents remembered as recently used (the candidates besides the current file's folder).
RECENT_DOCUMENTS = 8
# Documents of the current file's folder considered besides the recent ones (the first by path).
FOLDER_DOCUMENTS = 8
# A window of a candidate document: this many lines, windows starting every CHUNK_LINES // 2 lines.
CHUNK_LINES = 32
# Lines around the cursor whose identifiers a window is compared with (above, below).
NEAR_ABOVE = 30
NEAR_BELOW = 10
# A window's score: its Jaccard similarity with the cursor's neighbourhood, plus these.
DEFINITION_BONUS = 0.25
RECENT_BONUS = 0.05
# Choices kept (per document asked in).
CHOICES = 16
# Never decode more than this many tokens of one candidate document.
MAX_DOCUMENT_TOKENS = 50_000

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORDS = frozenset(
    "and as assert async await break class continue def del elif else except False finally for from global if "
    "import in is lambda None nonlocal not or pass raise return self True try while with yield const let var "
    "function return new this int char void struct static public private fn pub impl use mut".split())
_DEFINES = re.compile(r"^[ \t]*(?:(?:async\s+)?def|class|function|fn|func|struct|type|interface|enum|const|let|var)"
                      r"\s+([A-Za-z_][A-Za-z0-9_]*)|^[ \t]*([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)", re.M)
_HASH_COMMENT = frozenset({".py", ".pyi", ".sh", ".bash", ".rb", ".pl", ".r", ".toml", ".yaml", ".yml", ".cfg",
                           ".mk", ".cmake", ".jl", ".nim", ".ex", ".exs", ".tcl", ".ps1"})


@dataclass(frozen=True)
class Chunk:
    doc_id: str  # the datastore's id of the document
    path: str  # as the prompt names it (relative to a workspace root where it is under one)
    text: str  # whole lines, ending with a line break


@dataclass(frozen=True)
class Chosen:
    ids: tuple[int, ...]  # what goes before the file's window
    chunks: tuple[Chunk, ...]


def datastore_id(doc_id: str) -> str:
    """The datastore's id of the document a request names: a file URI's real path, else the string itself."""
    if doc_id.startswith("file:"):
        path = unquote(urlparse(doc_id).path)
        if os.name == "nt" and re.match(r"^/[A-Za-z]:", path):
            path = path[1:]
        return os.path.realpath(path)
    return doc_id


def identifiers(text: str) -> set[str]:
    return {w for w in _IDENT.findall(text) if w not in _KEYWORDS and len(w) > 1}


def neighbourhood(before: str, after: str) -> str:
    """The lines around the cursor that the windows are compared with."""
    above = before.split("\n")[-NEAR_ABOVE:]
    below = after.split("\n")[:NEAR_BELOW]
    return "\n".join(above) + "".join(below[:1]) + "\n" + "\n".join(below[1:])


def defined_names(text: str, names: set[str]) -> set[str]:
    """The names out of `names` that `text` defines at a line start."""
    return {a or b for a, b in _DEFINES.findall(text)} & names


def windows(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each CHUNK_LINES window, every CHUNK_LINES // 2 lines; whole lines."""
    lines = text.splitlines(keepends=True)
    if not lines:
        return []
    if not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    step = max(1, CHUNK_LINES // 2)
    starts = range(0, max(1, len(lines) - CHUNK_LINES + step), step)
    return [(i, "".join(lines[i:i + CHUNK_LINES])) for i in starts]


def choose_chunks(current: str, before: str, after: str, candidates: Sequence[tuple[str, str, str, bool]],
                  count_tokens: Callable[[str], int], budget: int) -> list[Chunk]:
    """The chunks, within `budget` tokens, out of candidates (doc id, path, text, recently used); the best last."""
    if budget <= 0:
        return []
    near = identifiers(neighbourhood(before, after))
    if not near:
        return []
    undefined = near - defined_names(before + after, near)
    scored: list[tuple[float, int, str, Chunk]] = []  # (score, document's rank, window's line, chunk)
    for rank, (doc_id, path, text, recent) in enumerate(candidates):
        if doc_id == current or not text.strip():
            continue
        for line, window in windows(text):
            words = identifiers(window)
            if not words:
                continue
            score = len(words & near) / len(words | near)
            score += DEFINITION_BONUS * len(defined_names(window, undefined & words))
            score += RECENT_BONUS if recent else 0.0
            if score > 0:
                scored.append((score, -rank, f"{line:09d}", Chunk(doc_id, path, window)))
    scored.sort(key=lambda s: (s[0], s[1], s[2]), reverse=True)
    # one window per document first, then the next best ones; never two overlapping windows of one document
    picked: list[tuple[float, Chunk, int]] = []
    used = 0
    taken: dict[str, list[int]] = {}
    for round_ in (0, 1):
        for score, _, line_key, chunk in scored:
            line = int(line_key)
            lines_taken = taken.get(chunk.doc_id, [])
            if round_ == 0 and lines_taken:
                continue
            if any(abs(line - other) < CHUNK_LINES for other in lines_taken):
                continue
            cost = count_tokens(chunk.path) + count_tokens(chunk.text) + 3
            if used + cost > budget:
                continue
            used += cost
            taken.setdefault(chunk.doc_id, []).append(line)
            picked.append((score, chunk, line))
    picked.sort(key=lambda p: p[0])  # the best last: nearest the file
    return [chunk for _, chunk, _ in picked]


class PromptHead:
    """How chunks are written before the file: Qwen2.5-Coder's repo-level tokens, or a comment line each."""

    def __init__(self, hf_tokenizer: Any, encode: Callable[[str], list[int]], repo_name: str = "project"):
        vocab = hf_tokenizer.get_vocab()
        self.repo_id = vocab.get("<|repo_name|>")
        self.sep_id = vocab.get("<|file_sep|>")
        self.encode = encode
        self.repo_name = repo_name

    @property
    def repo_level(self) -> bool:
        return self.repo_id is not None and self.sep_id is not None

    def ids(self, chunks: Sequence[Chunk], current_path: str) -> list[int]:
        if not chunks:
            return []
        if self.repo_level:
            out = [self.repo_id] + self.encode(self.repo_name + "\n")
            for c in chunks:
                out += [self.sep_id] + self.encode(f"{c.path}\n{c.text}")
            return out + [self.sep_id] + self.encode(current_path + "\n")
        mark = "#" if os.path.splitext(current_path)[1].lower() in _HASH_COMMENT else "//"
        text = "".join(f"{mark} {c.path}\n{c.text}\n" for c in chunks) + f"{mark} {current_path}\n"
        return self.encode(text)


class ExtraContext:
    """The recently used documents, and each document's chosen chunks (see the module's note). Thread-safe."""

    def __init__(self, recent: int = RECENT_DOCUMENTS):
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, None] = OrderedDict()  # datastore ids, most recent last
        self._limit = recent
        self._choices: OrderedDict[str, tuple[tuple, Chosen]] = OrderedDict()
        self.choices_made = 0  # how often chunks were chosen (the rest reused a choice)

    def used(self, doc_id: str) -> None:
        """A document (its datastore id) was opened, edited or asked in."""
        with self._lock:
            if doc_id in self._recent and next(reversed(self._recent)) == doc_id:
                return
            self._recent[doc_id] = None
            self._recent.move_to_end(doc_id)
            while len(self._recent) > self._limit:
                self._recent.popitem(last=False)

    def recent(self) -> list[str]:
        with self._lock:
            return list(self._recent)

    def prompt_ids(self, doc_id: str, before: str, after: str, budget: int, datastore, head: PromptHead,
                   decode: Callable[[Sequence[int]], str], roots: Sequence[str] = ()) -> list[int]:
        """The ids that go before the file's window for a request in `doc_id` (at most `budget` of them)."""
        if budget <= 0 or datastore is None:
            return []
        current = datastore_id(doc_id)
        recent = [d for d in self.recent() if d != current and d in datastore]
        folder = os.path.dirname(current)
        siblings = sorted(d for d in datastore.doc_ids() if d != current and os.path.dirname(d) == folder
                          and folder and d not in recent)[:FOLDER_DOCUMENTS]
        key = (frozenset(recent), tuple(siblings), budget, head.repo_level)
        with self._lock:
            kept = self._choices.get(doc_id)
        if kept is not None and kept[0] == key and all(c.doc_id in datastore for c in kept[1].chunks):
            return list(kept[1].ids)
        candidates = []
        for d in sorted(recent) + siblings:
            tokens = datastore.document_tokens(d)
            if tokens is None:
                continue
            candidates.append((d, _shown_path(d, roots), decode(tokens[:MAX_DOCUMENT_TOKENS].tolist()),
                               d in recent))
        path = _shown_path(current, roots)
        chunks = choose_chunks(current, before, after, candidates, lambda t: len(head.encode(t)),
                               budget - len(head.ids([Chunk("", "", "")], path)))
        ids = head.ids(chunks, path)
        while chunks and len(ids) > budget:  # the pieces tokenized apart were shorter: the worst goes first
            chunks = chunks[1:]
            ids = head.ids(chunks, path)
        chosen = Chosen(tuple(ids), tuple(chunks))
        with self._lock:
            self.choices_made += 1
            self._choices[doc_id] = (key, chosen)
            self._choices.move_to_end(doc_id)
            while len(self._choices) > CHOICES:
                self._choices.popitem(last=False)
        return list(ids)

    def forget(self, doc_id: str) -> None:
        """The document closed: its choice goes (it stays among the recently used, as llama.vim's ring keeps it)."""
        with self._lock:
            self._choices.pop(doc_id, None)


def _shown_path(doc_id: str, roots: Sequence[str]) -> str:
    for root in roots:
        root = os.path.realpath(str(root))
        if doc_id.startswith(root + os.sep):
            return os.path.relpath(doc_id, root).replace(os.sep, "/")
    if doc_id.startswith("buffer:"):
        return doc_id[len("buffer:"):]
    return os.path.basename(doc_id) or doc_id
