"""The server's text documents: positions and edits count LSP's line breaks only (\n, \r\n, \r)."""

from types import SimpleNamespace

import pytest
from lsprotocol import types


@pytest.mark.parametrize("sep", ["\x0c", "\u2028", "\x85", "\x0b"])
def test_positions_and_edits_follow_lsp_line_breaks_only(sep):
    from rest_lsp.lsp.server import LspTextDocument, _cursor

    uri = "file:///tmp/ff.py"
    text = f"import os\n{sep}\ndef f():\n    return 1\n\nvalue = f("
    doc = LspTextDocument(uri, text, sync_kind=types.TextDocumentSyncKind.Incremental)
    ls = SimpleNamespace(workspace=SimpleNamespace(text_documents={uri: doc}))
    lines = text.split("\n")  # what the client counts
    _, offset, pos = _cursor(ls, uri, types.Position(line=len(lines) - 1, character=len(lines[-1])))
    assert offset == len(text) and (pos.line, pos.character) == (5, len("value = f("))
    doc.apply_change(types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(2, 0), end=types.Position(2, 0)), text="@dec\n"))
    assert doc.source == text.replace("def f()", "@dec\ndef f()")
    crlf = LspTextDocument(uri, "a\r\nb\rc\nd", sync_kind=types.TextDocumentSyncKind.Incremental)
    assert crlf.lines == ["a\r\n", "b\r", "c\n", "d"]
