"""LSP positions <-> character offsets, with str and codec operations only: no Python loop over a line's characters.

LSP counts lines at \\r\\n, \\r and \\n only, and columns in the code units of the negotiated encoding (UTF-16 unless
the client chose UTF-8 or UTF-32). A column inside a character (half of a surrogate pair, part of a UTF-8 sequence)
goes to the end of that character, as pygls' own codec does.
"""

from __future__ import annotations

import codecs
import re

LINE_BREAK = re.compile(r"\r\n|\r|\n")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")  # two UTF-16 units each
_CODECS = {"utf-16": ("utf-16-le", 2), "utf-8": ("utf-8", 1)}  # (codec, bytes per code unit); utf-32: characters


def line_bounds(text: str, line: int) -> tuple[int, int] | None:
    """(start, end) offsets of 0-based `line`'s content (its line break left out), or None past the last line."""
    if line < 0:
        return None
    if "\r" in text and text.count("\r") != text.count("\r\n"):  # a lone CR: the regex (rare, and slower)
        parts = LINE_BREAK.split(text, maxsplit=line) if line else [text]
        if len(parts) <= line:
            return None
        start = len(text) - len(parts[-1])
        found = LINE_BREAK.search(text, start)
        return start, found.start() if found else len(text)
    start = _after_newline(text, line)  # every break ends with \n
    if start is None:
        return None
    end = text.find("\n", start)
    if end < 0:
        return start, len(text)
    return start, end - 1 if end > start and text[end - 1] == "\r" else end


def _after_newline(text: str, line: int) -> int | None:
    """Where the text after the `line`-th \\n starts (0 for line 0), or None when there are fewer; split from the
    nearer end, so that typing near the end of a long file splits off only its last lines."""
    if line == 0:
        return 0
    total = text.count("\n")
    if line > total:
        return None
    if line <= total - line:
        return len(text) - len(text.split("\n", line)[-1])
    return len(text.rsplit("\n", total - line + 1)[0]) + 1


def last_line(text: str) -> int:
    """The 0-based number of the last line (the empty one after a final line break counts)."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")


def offset_at(text: str, line: int, character: int, encoding="utf-16") -> int:
    """The offset of an LSP position: its column clamped to its line's content, a line past the last one at the end
    of the text (as pygls places an edit there)."""
    bounds = line_bounds(text, line)
    if bounds is None:
        return len(text)
    start, end = bounds
    return start + characters(text[start:end], character, encoding)


def _codec(encoding) -> tuple[str, int] | None:
    """(codec, bytes per unit) of a position encoding (a name or lsprotocol's enum); None for UTF-32."""
    name = str(getattr(encoding, "value", encoding) or "utf-16").lower()
    return None if name == "utf-32" else _CODECS.get(name, _CODECS["utf-16"])


def units(content: str, encoding="utf-16") -> int:
    """How many code units `content` takes in the position encoding."""
    codec = _codec(encoding)
    if codec is None or content.isascii():
        return len(content)
    name, width = codec
    return len(content.encode(name, "surrogatepass")) // width


def characters(content: str, count: int, encoding="utf-16") -> int:
    """How many characters of `content` its first `count` code units hold, a character cut in two counting whole;
    at most len(content)."""
    codec = _codec(encoding)
    if codec is None or content.isascii():
        return max(0, min(count, len(content)))
    name, width = codec
    try:
        data = content.encode(name)
    except UnicodeEncodeError:  # a lone surrogate: decoding would pair a lone high one with a lone low one after it
        data = None
    if data is not None and len(data) == len(content) * width:  # one unit per character
        return max(0, min(count, len(content)))
    if data is None and width == 2:
        return _utf16_characters(content, count)
    if data is None:
        data = content.encode(name, "surrogatepass")  # UTF-8 keeps each surrogate apart
    if count * width >= len(data):
        return len(content)
    head = codecs.getincrementaldecoder(name)("surrogatepass").decode(data[: max(0, count) * width], final=False)
    return len(head) + (len(head.encode(name, "surrogatepass")) < count * width)  # a cut character counts whole


def _utf16_characters(content: str, count: int) -> int:
    """characters() in UTF-16 for a text with lone surrogates: one unit per character but two for each one beyond
    the BMP (a loop over those only; a lone surrogate is one unit, even next to another)."""
    extra = 0  # units so far beyond one per character
    for found in _ASTRAL.finditer(content, 0, count):
        at = found.start() + extra  # the unit where this character starts
        if at >= count:
            break
        if at + 1 == count:  # its second unit: the character counts whole
            return found.start() + 1
        extra += 1
    return max(0, min(count - extra, len(content)))
