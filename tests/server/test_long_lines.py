"""Positions in long lines: a keystroke in a 1 MB line maps its positions with str and codec operations, never a Python
loop over the line's characters, and lands where pygls' own codec puts it."""

import random
from types import SimpleNamespace

import pytest
from lsprotocol import types
from pygls.workspace import TextDocument
from pygls.workspace.position_codec import PositionCodec, UnitCounter

from rest_lsp.lsp.positions import characters, line_bounds, units
from rest_lsp.lsp.server import LspTextDocument, _changed_at, _cursor, lsp_lines

ENCODINGS = [types.PositionEncodingKind.Utf16, types.PositionEncodingKind.Utf8, types.PositionEncodingKind.Utf32]
# one character of each width, lone surrogates (valid JSON), and LSP's three line breaks
ALPHABET = ["a", " ", "é", "中", "😋", "\ud83d", "\ude00", "\r", "\n", "\r\n"]
URI = "file:///tmp/long.py"


def _texts(seed: int, n: int = 1500):
    rnd = random.Random(seed)
    for _ in range(n):
        yield "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 10)))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_columns_count_as_pygls_counts_them(encoding):
    codec = PositionCodec(encoding)
    for text in _texts(1):
        content = text.replace("\r", "").replace("\n", "")
        assert units(content, encoding) == codec.client_num_units(content), repr(content)
        for column in range(units(content, encoding) + 1):
            expected = codec.position_from_client_units([content], types.Position(0, column)).character
            assert characters(content, column, encoding) == (expected if content else 0), (repr(content), column)


def test_lines_are_lsp_lines():
    for text in _texts(2):
        lines = lsp_lines(text)
        ends_with_break = bool(lines) and lines[-1] != lines[-1].rstrip("\r\n")
        for line in range(len(lines) + 2):
            start = sum(len(x) for x in lines[:line])
            if line < len(lines):
                expected = (start, start + len(lines[line].rstrip("\r\n")))
            elif line == len(lines) and (ends_with_break or not lines):
                expected = (len(text), len(text))  # the empty line after a final break (or of an empty text)
            else:
                expected = None
            assert line_bounds(text, line) == expected, (repr(text), line)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_an_edit_lands_where_pygls_puts_it(encoding):
    rnd = random.Random(3)
    for text in _texts(4, 800):
        ours = LspTextDocument(URI, text, position_codec=PositionCodec(encoding))
        theirs = TextDocument(URI, text, position_codec=PositionCodec(encoding))
        lines = lsp_lines(text) or [""]
        line = rnd.randrange(len(lines))
        content = lines[line].rstrip("\r\n")
        a, b = sorted(rnd.randint(0, units(content, encoding)) for _ in range(2))
        change = types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line, a), end=types.Position(line, b)), text="x😋\n")
        ours.apply_change(change)
        theirs.apply_change(change)
        assert ours.source == theirs.source, (repr(text), line, a, b)


@pytest.fixture
def walked(monkeypatch) -> list:
    """Characters that pygls' codec looked at one by one (a Python loop each)."""
    seen = []
    for counter in {type(PositionCodec(e).impl) for e in ENCODINGS}:
        original = counter.code_units_for_char

        def counted(self, char, original=original):
            seen.append(char)
            return original(self, char)

        monkeypatch.setattr(counter, "code_units_for_char", counted)
    monkeypatch.setattr(UnitCounter, "num_units", lambda self, chars: sum(self.code_units_for_char(c) for c in chars))
    return seen


def test_a_keystroke_in_a_one_megabyte_line_walks_no_character(walked):
    line = "😋" + "a" * 1_000_000  # one character beyond the BMP: the non-ASCII path
    doc = LspTextDocument(URI, line)
    ls = SimpleNamespace(workspace=SimpleNamespace(text_documents={URI: doc}))
    end = units(line)
    change = types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(0, end), end=types.Position(0, end)), text="b")])
    doc.apply_change(change.content_changes[0])
    assert doc.source == line + "b"
    assert _changed_at(ls, URI, change) == len(line) + 1  # where typing goes on
    _, offset, pos = _cursor(ls, URI, types.Position(0, 2 + 500_000))  # a cursor hint mid-line
    assert (offset, pos.character) == (1 + 500_000, 2 + 500_000)
    _, offset, pos = _cursor(ls, URI, types.Position(0, 10**9))  # past the end: clamped
    assert (offset, pos.character) == (len(line) + 1, end + 1)
    assert walked == []  # the old code: every character of the line, several times a keystroke
