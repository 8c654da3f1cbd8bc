"""Where a completion ends: the stop rules applied to the text the model wrote.

The same `trim` runs after every decoding step (to stop early: `stopped` is True once
a rule has fired, so decoding more cannot change the answer) and once on the final
text. Rules, in the spirit of Tabby and Continue:
  - single line when the cursor is mid-line, multi-line when the cursor line is empty
    or ends with a block opener;
  - end of the current block: the first line indented less than the block;
  - text that repeats what follows the cursor (the rest of the cursor line, or the
    next non-blank line of the suffix);
  - at top level, two blank lines end the completion;
  - at most `max_lines` lines with text where several may come (0: no limit): the person reads the first
    line first, and the next comes computed when they accept it. A length set by the text alone makes a
    suggestion the same however fast it was decoded;
  - never an empty or whitespace-only completion (returned as "").
The model's end-of-text is the caller's: it cuts the token ids there.

When the prompt held back the whitespace before the cursor (prompt.held_back: the line
breaks and the indentation since the last text), the model writes that run itself and
its text must be turned into what goes after the cursor: at least as many line breaks
(extra blank lines are dropped: the code goes on the cursor line, never below a line of
only spaces), then the held-back indentation, which is taken off. A text that continues
the previous line or starts with other indentation (a dedent, tabs for spaces) cannot be
written by inserting at the cursor, so nothing is shown; but an indentation of the other kind
(tabs for spaces, or spaces for tabs) is the model's guess at a style the person's editor has
already chosen, so it is dropped and the line's text goes after theirs (llama.vim does the same).
A FIM prompt holds the start of that run itself (`written`): the model's text follows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rest_lsp.service.prompt import held_back

BLOCK_OPENERS = (":", "{", "(", "[", "=>", "->", " do", " then", "begin")
# A line that closes a block: a bracket, or the word `end` (Ruby, Lua, shell's `end`-style languages); `end_time`
# or `endpoint` is a name, not a closer.
_CLOSER = re.compile(r"[)\]}]|end(?!\w)")


@dataclass(frozen=True)
class StopContext:
    line_before: str  # the cursor line up to the cursor
    line_after: str  # the cursor line after the cursor, line ending excluded
    next_line: str  # the first non-blank line after the cursor line, stripped ("" if none)
    multiline: bool
    held: str = ""  # the cursor line's whitespace that the prompt left out; the model writes it
    max_lines: int = 0  # lines with text a multi-line completion keeps at most (0: no limit)
    written: str = ""  # the start of `held` that the prompt holds (prompt.Prompt.held_written)

    @property
    def one_line(self) -> bool:
        """The completion ends at its first line break after text (single line, or a cap of one line)."""
        return not self.multiline or self.max_lines == 1

    @property
    def any_break_ends(self) -> bool:
        """Its first line break ends it, text before it or not (single line, nothing held back: `_cut`)."""
        return not self.multiline and not self.held


def stop_context(before: str, after: str, max_lines: int = 0, written: str = "") -> StopContext:
    line_before = before[before.rfind("\n") + 1:]
    nl = after.find("\n")
    line_after = (after if nl < 0 else after[:nl]).rstrip("\r")
    next_line = ""
    if nl >= 0:
        # Only look a little way ahead: the suffix may be megabytes long.
        for line in after[nl + 1: nl + 1 + 4096].splitlines():
            if line.strip():
                next_line = line.strip()
                break
    opener = line_before.rstrip().endswith(BLOCK_OPENERS)
    multiline = not line_after.strip() and (not line_before.strip() or opener)
    held = held_back(before)
    return StopContext(line_before, line_after, next_line, multiline, held, max_lines, written if held else "")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def trim(text: str, ctx: StopContext, *, final: bool) -> tuple[str, bool]:
    """(the part of `text` to show, whether a stop rule fired).

    `final` says no more text will come, so the last line is complete.
    The shown part is "" when nothing but whitespace is left.
    """
    if ctx.held:
        text, stopped = _after_held(ctx.written + text, ctx.held, final)
        if text is None:
            return "", stopped
    kept, stopped = _cut(text, ctx, final)
    kept = kept.rstrip()
    if not kept.strip():
        kept = ""
    return kept, stopped


def _after_held(text: str, held: str, final: bool) -> tuple[str | None, bool]:
    """The model's `text`, written after the prompt that `held` was left out of, as the text
    after the cursor; None while it is unknown yet (False) or for good (True) whether it fits."""
    body = text.lstrip()
    if not body:  # only whitespace so far
        return None, final
    run = text[: len(text) - len(body)]
    indent = run[run.rfind("\n") + 1:]
    held_indent = held[held.rfind("\n") + 1:]
    if run.count("\n") < held.count("\n"):
        return None, True
    if indent.startswith(held_indent):
        return indent[len(held_indent):] + body, False
    if indent and _other_kind(indent, held_indent):
        return body, False
    return None, True


def _other_kind(indent: str, held_indent: str) -> bool:
    """Whether one indentation holds tabs and the other does not (both non-empty)."""
    return bool(held_indent) and ("\t" in indent) != ("\t" in held_indent)


def _cut(text: str, ctx: StopContext, final: bool) -> tuple[str, bool]:
    lines = text.split("\n")  # lines[0] continues the cursor line
    complete = len(lines) - (0 if final else 1)  # lines[:complete] will not grow any more

    # The rest of the cursor line already follows the cursor: do not write it again.
    rest = ctx.line_after.strip()
    if rest and complete >= 1 and lines[0].rstrip().endswith(rest):
        return lines[0].rstrip()[: -len(rest)], True

    if not ctx.multiline:
        if len(lines) > 1:
            return lines[0], True
        return text, False

    capped = _line_cap(lines, complete, ctx.max_lines)
    if capped is not None:  # the lines after the cap are never shown: the rules below read only those kept
        lines = lines[:capped]
        complete, text = capped, "\n".join(lines)
    full = [ctx.line_before + lines[0]] + lines[1:]  # whole lines, cursor line included
    # The block is set by the first line with content that the model wrote a line start for.
    first = 0 if not ctx.line_before.strip() else 1
    block = None
    blanks = 0
    for i in range(first, len(full)):
        line = full[i]
        if not line.strip():
            if i < complete:
                blanks += 1
                if block == 0 and blanks >= 2 and i > first:
                    return "\n".join(lines[:i]), True
            continue
        blanks = 0
        if block is None:
            block = _indent(line)
        elif _indent(line) < block:
            stripped = line.strip()
            # A closing bracket at the opener's level belongs to the block, unless it is already there.
            closer = _CLOSER.match(stripped)
            if closer and not ctx.next_line.startswith(closer.group()):
                if i < complete:
                    return "\n".join(lines[: i + 1]), True
                return text, False
            return "\n".join(lines[:i]), True
        written = i >= 1 or not ctx.line_before.strip()  # the model wrote this whole line
        if written and i < complete and ctx.next_line and line.strip() == ctx.next_line:
            return "\n".join(lines[:i]), True
    return text, capped is not None


def _line_cap(lines: list[str], complete: int, max_lines: int) -> int | None:
    """How many of `lines` a cap of `max_lines` lines with text keeps, once the last of them is complete; None
    while the cap has not been reached (or there is none)."""
    if max_lines <= 0:
        return None
    seen = 0
    for i in range(complete):
        if lines[i].strip():
            seen += 1
            if seen == max_lines:
                return i + 1
    return None
