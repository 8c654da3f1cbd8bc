"""Text around the cursor -> prompt token ids, within a token budget.

Models trained for fill-in-the-middle get prefix and suffix in their own template
(detected from the tokenizer's vocabulary), the hole starting a few lines above the cursor
so that typing leaves the suffix's cached KV valid; other models get the prefix only.

The prefix window starts at a line start, and stays there while it can: the caller
passes the start line of the document's last prompt (`keep_line`), and as long as the
text from there to the cursor fits the budget the window starts there again, so while
the user types, consecutive prompts begin with the same tokens and the decoder reuses
its KV cache instead of paying the whole prefill again (seconds on a CPU).
When it no longer fits (or the cursor went up to just below it: KEEP_MIN), the new
start takes only FILL of the budget, on a line whose number is a multiple of LINE_GRID:
the next quarter of the budget typed keeps it.
Without a start to keep the choice depends on the text alone.

On a cursor line with only whitespace before the cursor (the editor's auto-indent
at a body start), the prompt ends at the last character with content, before the
line break and the indentation, and that whitespace is held back: the BPE of
SmolLM2 (GPT-2 pre-tokenizer) writes a line break and the next line's indentation
as one token ("\n   " then " return"), so a prompt ending inside that run, even
right after the line break, is a boundary the model rarely saw; after trailing
spaces it answers with a line break, after a bare line break with column-0 text.
The model writes the run itself, and the post-processing takes the held-back
whitespace off its text again (postprocess.py).

A FIM prompt holds that run, up to the whitespace its first word's token takes (`held_written`): a FIM
model sees where the middle ends, so without the line break the person typed it may end the middle on
the line above (`for x in xs: s += x`) or write an indentation other than theirs; the tokens the run
takes before a word are the tokens it was trained on, so the prompt still ends at a natural boundary.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

# Never tokenize more than this many characters per budgeted token: a 5 MB file
# costs the same as a small one.
CHARS_PER_TOKEN = 8
# A new prefix window starts on a line number that is a multiple of this, so that a start chosen afresh (no
# start to keep, or the kept one no longer fits) is the same for nearby cursors.
LINE_GRID = 16
# A new prefix window takes at most this share of its budget: the rest is room for the typing that keeps its start.
FILL = 0.75
# A kept start whose window would hold less than this share of the budget is replaced: the cursor went back up to
# just below it, and the text above it is worth more to the model than the reused cache.
KEEP_MIN = 0.5
# A FIM prompt's hole starts on a line whose number is a multiple of this (see build_prompt), and the text from
# there to the cursor, up to 1/MIDDLE_SHARE of the room, follows the middle marker.
MIDDLE_GRID = 4
MIDDLE_SHARE = 4


@dataclass(frozen=True)
class FimTemplate:
    name: str
    prefix: str  # token strings as they appear in the vocabulary
    suffix: str
    middle: str
    stops: tuple[str, ...]  # tokens that end the middle besides the tokenizer's eos


FIM_TEMPLATES = (
    FimTemplate("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|im_end|>")),
    FimTemplate("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
                ("<|endoftext|>", "<file_sep>", "<fim_pad>")),
    FimTemplate("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>",
                ("<｜end▁of▁sentence｜>", "<|EOT|>")),
    FimTemplate("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", ("▁<EOT>",)),
)


@dataclass(frozen=True)
class Fim:
    """A FIM template resolved to the ids of one tokenizer."""

    template: FimTemplate
    prefix_id: int
    suffix_id: int
    middle_id: int
    stop_ids: frozenset[int]


def detect_fim(hf_tokenizer: Any) -> Fim | None:
    """The FIM template whose three marker tokens are all in the vocabulary, if any."""
    vocab = hf_tokenizer.get_vocab()
    for t in FIM_TEMPLATES:
        if all(tok in vocab for tok in (t.prefix, t.suffix, t.middle)):
            stops = frozenset(vocab[s] for s in t.stops if s in vocab)
            return Fim(t, vocab[t.prefix], vocab[t.suffix], vocab[t.middle], stops)
    return None


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    prefix: str  # the text before the cursor that the prompt holds
    suffix: str  # the text after the cursor that the prompt holds ("" without FIM)
    fim: Fim | None
    held: str = ""  # whitespace before the cursor that the model writes (see `held_back`), but `held_written`
    start_line: int = 0  # the 0-based line of `before` where the prefix window starts: the next `keep_line`
    held_ids: tuple[int, ...] = ()  # the tokens the model writes for `held` before the line's text (`held_tokens`)
    held_written: str = ""  # the start of `held` that the prompt holds (FIM: `_middle_with_held`)
    # what draft sources see in place of `ids` (FIM: the suffix's ids, then the prefix's and the middle's, ending at
    # the cursor as a file does; drafts.PromptView); () without FIM, whose prompt ends at the cursor already
    view: tuple[int, ...] = ()


def held_back(before: str) -> str:
    """The whitespace that the prompt leaves out: when the cursor line holds only whitespace
    before the cursor (not nothing), the whole run of whitespace since the last character with
    content (line breaks included); else ""."""
    line = before[before.rfind("\n") + 1:]
    if not line or line.strip() or "\n" not in before:
        return ""
    body = before.rstrip()
    return before[len(body):] if body else ""


def held_tokens(hf_tokenizer: Any, held: str) -> tuple[int, ...]:
    """The tokens that write `held` (held-back whitespace) when text follows it, up to that text: the run as the
    model writes it after the prompt. A BPE that gives a word its leading space writes "\n" and eight spaces
    before `if` as "\n" and seven spaces, then " if": the tokens that end inside `held`."""
    if not held:
        return ()
    ids, offsets = _offsets(hf_tokenizer, held + "x")
    out = []
    for i, (_, end) in zip(ids, offsets):
        if end > len(held) or end == 0:
            break
        out.append(i)
    return tuple(out)


def _offsets(hf_tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = hf_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def _prefix_window(hf_tokenizer: Any, before: str, budget: int,
                   keep_line: int | None = None) -> tuple[str, list[int], int]:
    """(window, its ids, its first line's number): a tail of `before` within `budget` tokens.

    The whole of `before` when it fits. Else the window that starts at line `keep_line` when that line is before
    the cursor and the text from it fits, in KEEP_MIN of the budget at least. Else the longest tail that starts
    on a grid line and takes at most FILL of the budget, so that the typing that follows keeps that start for a
    while."""
    if budget <= 0:
        return "", [], before.count("\n")
    start = max(0, len(before) - budget * CHARS_PER_TOKEN)
    ids, offsets = _offsets(hf_tokenizer, before[start:])
    if start == 0 and len(ids) <= budget:
        return before, ids, 0
    if keep_line is not None and 0 <= keep_line <= before.count("\n"):
        kept = _line_start(before, keep_line, 0)
        if kept is not None and kept < len(before) and len(before) - kept <= budget * CHARS_PER_TOKEN:
            window = before[kept:]
            kept_ids = list(hf_tokenizer(window, add_special_tokens=False)["input_ids"])
            if budget * KEEP_MIN <= len(kept_ids) <= budget:
                return window, kept_ids, keep_line
    fill = max(1, int(budget * FILL))
    if len(ids) > fill:
        need = start + offsets[len(ids) - fill][0]  # first character the filled share allows
    else:
        need = start
    line = before.count("\n", 0, need)
    if need > 0 and before[need - 1] != "\n":
        line += 1  # `need` is mid-line: the first whole line is the next one
    cut = _line_start(before, -(-line // LINE_GRID) * LINE_GRID, need)
    if cut is None or cut >= len(before):  # too few lines left: the next line start will do
        cut = _line_start(before, line, need)
    if cut is None or cut >= len(before):
        cut = need  # one huge line: cut mid-line
    window = before[cut:]
    ids = list(hf_tokenizer(window, add_special_tokens=False)["input_ids"])
    if len(ids) > budget:  # retokenizing merged differently: the tail is always valid
        ids = ids[-budget:]
    return window, ids, before.count("\n", 0, cut)


def _line_start(text: str, line: int, at_least: int) -> int | None:
    """Offset where 0-based `line` starts, searching from `at_least` on."""
    current = text.count("\n", 0, at_least)
    pos = at_least
    if pos > 0 and text[pos - 1] != "\n":
        pos = text.find("\n", pos) + 1
        if pos == 0:
            return None
        current += 1
    while current < line:
        nl = text.find("\n", pos)
        if nl < 0:
            return None
        pos, current = nl + 1, current + 1
    return pos


def _suffix_window(hf_tokenizer: Any, after: str, budget: int) -> tuple[str, list[int]]:
    """The longest head of `after` that ends on a line end and fits in `budget` tokens."""
    if budget <= 0 or not after:
        return "", []
    head = after[: budget * CHARS_PER_TOKEN]
    ids, offsets = _offsets(hf_tokenizer, head)
    if len(ids) <= budget and len(head) == len(after):
        return after, ids
    end = offsets[min(budget, len(ids)) - 1][1] if ids else 0
    nl = head.rfind("\n", 0, end)
    if nl >= 0:
        end = nl + 1
    window = head[:end]
    ids = list(hf_tokenizer(window, add_special_tokens=False)["input_ids"])[:budget]
    return window, ids


def build_prompt(hf_tokenizer: Any, before: str, after: str, *, budget: int,
                 fim: Fim | None, suffix_fraction: float = 0.25, split_line: bool = True,
                 keep_line: int | None = None, extra: Sequence[int] = ()) -> Prompt:
    """Prompt ids for a cursor between `before` and `after`.

    With FIM: `suffix_fraction` of the budget goes to the suffix, what it leaves to the prefix. The hole starts
    at the start of a line at most MIDDLE_GRID - 1 lines above the cursor, and the text from there to the
    cursor follows the middle marker, as the start of the middle (`split_line`; else the hole starts at the
    cursor): typing then changes only the prompt's last tokens, and the decoder's cache keeps the suffix, which
    a hole at the cursor would make it prefill again at every keystroke.
    Without FIM the prompt ends before the whitespace that `held_back` names; a FIM prompt holds it up to the
    whitespace the first word's token takes (`held_written`).
    The prefix window starts at line `keep_line` (the last prompt's `start_line`) while the text from there fits;
    a line number past the cursor's, or negative, is ignored (see the module's note).
    `extra` (other files' chunks, extra_context.py) goes right after the BOS, before the file's window and the FIM
    markers, where typing never changes it; it comes on top of `budget`.
    """
    held = held_back(before)
    before = before[: len(before) - len(held)]
    bos = []
    if getattr(hf_tokenizer, "add_bos_token", False) and hf_tokenizer.bos_token_id is not None:
        bos = [hf_tokenizer.bos_token_id]
    if fim is None:
        prefix, prefix_ids, start = _prefix_window(hf_tokenizer, before, budget - len(bos), keep_line)
        return Prompt(bos + list(extra) + prefix_ids, prefix, "", None, held, start, held_tokens(hf_tokenizer, held))
    room = budget - len(bos) - 3  # the three FIM markers
    line, line_ids = _middle_so_far(hf_tokenizer, before, room // MIDDLE_SHARE) if split_line else ("", [])
    written = ""
    if held:
        line_ids, written = _middle_with_held(hf_tokenizer, line, held)
    # the suffix's share does not depend on the middle's length, so that typing leaves the suffix as it is
    suffix, suffix_ids = _suffix_window(hf_tokenizer, after, int(room * suffix_fraction))
    prefix, prefix_ids, start = _prefix_window(hf_tokenizer, before[: len(before) - len(line)],
                                               room - len(suffix_ids) - len(line_ids), keep_line)
    ids = bos + list(extra) + [fim.prefix_id] + prefix_ids + [fim.suffix_id] + suffix_ids + [fim.middle_id] + line_ids
    view = (*suffix_ids, *prefix_ids, *line_ids)
    return Prompt(ids, prefix + line + written, suffix, fim, held, start, (), written, view)


def _middle_with_held(hf_tokenizer: Any, middle: str, held: str) -> tuple[list[int], str]:
    """(ids, the start of `held` they write): the tokens of `middle` + `held` as they come before a word, so the
    ones that end inside `held`, and not the whitespace the word's token takes (see `held_tokens`)."""
    ids, offsets = _offsets(hf_tokenizer, middle + held + "x")
    kept, written = [], 0
    for i, (_, end) in zip(ids, offsets):
        if end > len(middle) + len(held):
            break
        kept.append(i)
        written = end - len(middle)
    if written < 0:  # the middle's last token takes the word too (no BPE here does): the middle alone
        return list(hf_tokenizer(middle, add_special_tokens=False)["input_ids"]), ""
    return kept, held[:written]


def _middle_so_far(hf_tokenizer: Any, before: str, budget: int) -> tuple[str, list[int]]:
    """The text from the hole's start to the cursor and its ids: the hole starts on a line whose number is a
    multiple of MIDDLE_GRID (so that it moves once per MIDDLE_GRID lines written), else at the cursor line's
    start when that takes more than `budget` tokens, else at the cursor (a huge line)."""
    line_start = before.rfind("\n") + 1
    grid_start = line_start
    for _ in range(before.count("\n") % MIDDLE_GRID):  # back to the line on the grid
        grid_start = before.rfind("\n", 0, grid_start - 1) + 1
    for start in dict.fromkeys((grid_start, line_start)):
        middle = before[start:]
        if not middle or len(middle) > budget * CHARS_PER_TOKEN:
            continue
        ids = list(hf_tokenizer(middle, add_special_tokens=False)["input_ids"])
        if len(ids) <= budget:
            return middle, ids
    return "", []


class KeptStarts:
    """Each document's prompt window start (`Prompt.start_line`, the next prompt's `keep_line`), moved by requests
    only, one after the other, so that two servers given the same requests build the same prompts whatever
    speculative work (warm-ups, guesses, prefetches) each found time for. A request notes its place (`asked`); its
    start is settled by the first prompt built for that place, or by the next request (one that was answered
    without a prompt, from a prefetch or the cache, is settled then). Bounded to the `documents` most recently
    asked."""

    def __init__(self, documents: int = 16):
        self._lock = threading.Lock()
        # doc_id -> (start line, the place (before, after) of the last request while its start is not settled)
        self._docs: OrderedDict[str, tuple[int | None, tuple[str, str] | None]] = OrderedDict()
        self._documents = documents

    def asked(self, doc_id: str, before: str, after: str,
              make: Callable[[str, str, int | None], Prompt]) -> None:
        """A request at this place; make(before, after, keep_line) -> Prompt settles the one before it, if needed."""
        with self._lock:
            start, last = self._docs.get(doc_id, (None, None))
        if last is not None:
            start = make(*last, start).start_line
        with self._lock:
            self._docs[doc_id] = (start, (before, after))
            self._docs.move_to_end(doc_id)
            while len(self._docs) > self._documents:
                self._docs.popitem(last=False)

    def forget(self, doc_id: str) -> None:
        """The document closed: its start and the last place asked (a whole text) go."""
        with self._lock:
            self._docs.pop(doc_id, None)

    def build(self, doc_id: str, before: str, after: str,
              make: Callable[[str, str, int | None], Prompt]) -> Prompt:
        """The prompt for this place, from the document's start (settled first if the last request's is not)."""
        with self._lock:
            start, last = self._docs.get(doc_id, (None, None))
        if last is not None and last != (before, after):
            start = make(*last, start).start_line
        prompt = make(before, after, start)
        if last is not None:
            settled = prompt.start_line if last == (before, after) else start
            with self._lock:
                if self._docs.get(doc_id, (None, None))[1] is last:  # no newer request meanwhile
                    self._docs[doc_id] = (settled, None)
        return prompt
