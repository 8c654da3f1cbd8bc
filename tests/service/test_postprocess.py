"""Stop rules: where a completion ends, and that what is left is never blank."""

from rest_lsp.service.completion import finish_text
from rest_lsp.service.postprocess import stop_context, trim


def final(text, before, after=""):
    return trim(text, stop_context(before, after), final=True)[0]


def test_mid_line_is_single_line():
    ctx = stop_context("x = foo(", ")\n")
    assert not ctx.multiline
    assert trim("a, b)\nprint(x)", ctx, final=False) == ("a, b", True)


def test_empty_line_and_block_opener_are_multi_line():
    assert stop_context("def f():\n    ", "").multiline
    assert stop_context("def f():", "\n").multiline
    assert stop_context("if (x) {", "\n}").multiline
    assert not stop_context("    ", "return 1\n").multiline  # code follows the cursor on its line


def test_dedent_ends_the_block():
    before = "def f(x):\n    "
    assert final("\n    y = x + 1\n    return y\n\nprint(f(2))\n", before) == "y = x + 1\n    return y"


def test_block_after_opener_takes_indent_of_first_written_line():
    assert final("\n    return 1\nclass B:\n    pass", "def f():") == "\n    return 1"


def test_closing_bracket_at_opener_level_belongs_to_the_block():
    before = "function f() {\n  "
    assert final("\n  return 1;\n}\nfunction g() {}", before) == "return 1;\n}"
    # ... unless the suffix already closes it
    assert final("\n  return 1;\n}\n", before, "\n}\n") == "return 1;"


def test_rest_of_line_is_not_written_twice():
    assert final('"hello")\n', "print(", ")\n") == '"hello"'


def test_next_suffix_line_is_not_repeated():
    before = "def f(x):\n    "
    after = "\n    return y\n"
    assert final("\n    y = x * 2\n    return y\n", before, after) == "y = x * 2"


def test_stopped_only_once_a_rule_fired():
    ctx = stop_context("def f(x):\n    ", "")
    assert trim("\n    y = 1\n    z", ctx, final=False) == ("y = 1\n    z", False)
    # a partial line whose indent is already known to be smaller ends the block now
    assert trim("\n    y = 1\npr", ctx, final=False) == ("y = 1", True)


def test_two_blank_lines_end_top_level_code():
    assert final("import os\n\n\ndef main():\n    pass", "") == "import os"


def test_never_blank():
    assert final("   \n\t\n", "def f():\n    ") == ""
    assert final("\nprint(1)", "x = 1") == ""  # single line: nothing before the line break
    before = "def f():\n    "
    assert final("\n    return 1", before, "\n    return 1\n") == ""  # only the next line again


def test_trailing_whitespace_dropped():
    assert final("foo  \n", "x = ") == "foo"


def test_held_back_whitespace_is_taken_off_the_model_text():
    before = "def f(x):\n    "
    ctx = stop_context(before, "\n")
    assert ctx.held == "\n    "  # the prompt ends after "def f(x):", the model writes the line break and indent
    assert final("\n    return x\n", before) == "return x"
    assert final("\n        x += 1", before) == "    x += 1"  # deeper: the rest of the indentation stays
    # blank lines first: the code goes on the cursor line, never after a line of only spaces
    assert final("\n\n  \n    return x", before) == "return x"
    # only whitespace so far: wait for more, nothing to show yet
    assert trim("\n   ", ctx, final=False) == ("", False)
    assert trim("\n    ret", ctx, final=False) == ("ret", False)
    assert stop_context("def f():\n\n  ", "").held == "\n\n  "  # blank lines before the cursor are held too


def test_text_that_cannot_be_inserted_at_the_cursor_is_not_shown():
    before = "def f(x):\n    y = x\n    "
    ctx = stop_context(before, "")
    # inserting at the cursor keeps the line break and the four spaces: a dedent or more of the
    # previous line cannot be written there (tabs for spaces can: test_fim_line_start.py)
    assert trim("\ndef g():", ctx, final=False) == ("", True)
    assert trim(" * 2\n    return y", ctx, final=False) == ("", True)
    assert trim("\n  ", ctx, final=True) == ("", True)


def test_nothing_held_mid_line_or_at_column_zero():
    assert stop_context("x = foo(", ")").held == ""
    assert stop_context("    return ", "").held == ""
    assert stop_context("def f():\n", "").held == ""  # column 0: a lone line break is a natural boundary
    assert stop_context("    ", "").held == ""  # nothing before the cursor but whitespace
    assert stop_context("\n\n    ", "").held == ""
    assert final("\nprint(1)", "x = 1\n", "") == "\nprint(1)"  # the model's text as it is


def test_max_lines_caps_a_multi_line_completion_at_its_last_whole_line():
    one = stop_context("def f(x):\n    ", "\n", max_lines=1)
    assert trim("\n    y = x + 1", one, final=False) == ("y = x + 1", False)  # the line may still grow
    assert trim("\n    y = x + 1\n    return y", one, final=False) == ("y = x + 1", True)  # once whole: stop
    assert trim("\n    y = x + 1\n", one, final=True) == ("y = x + 1", True)
    # blank lines do not count; a block opener's rest of the cursor line (here a break) neither
    two = stop_context("def f(x):", "\n", max_lines=2)
    assert trim("\n    y = 1\n\n    z = 2\n    w = 3", two, final=False) == ("\n    y = 1\n\n    z = 2", True)
    # the cap comes after the other rules: a dedent before it still ends the block there
    assert trim("\n    return 1\nclass B:\n    pass\n", two, final=True) == ("\n    return 1", True)
    # a cursor line with text of its own before a break counts as the first line
    assert trim("a, b)\n    c = 2\n", stop_context("x = f(", "\n", max_lines=1), final=False) == ("a, b)", True)
    # no cap: the block rules alone
    free = stop_context("def f(x):\n    ", "\n")
    assert trim("\n    y = 1\n    z = 2\n    w", free, final=False) == ("y = 1\n    z = 2\n    w", False)


def test_where_a_one_line_completion_ends():
    """Mid-line the first line break ends it (after text only when the prompt held whitespace back); on an empty
    line one line at most ends it at the break after text; with more lines allowed it is not one line."""
    mid = stop_context("x = f(", ")\n")
    assert mid.one_line and mid.any_break_ends
    start = stop_context("def f():\n    ", "\n", max_lines=1)
    assert start.held and start.one_line and not start.any_break_ends
    assert not stop_context("def f():\n    ", "\n", max_lines=0).one_line


def test_a_line_that_merely_starts_with_end_does_not_close_a_block():
    before, after = "import time\n\ndef elapsed(start):\n    ", "\n"
    text = "\n    return time.time() - start\nend_time = elapsed(0)\nprint(end_time)\n"
    assert finish_text(text, stop_context(before, after)) == "return time.time() - start"
    ruby = finish_text("\n  x = 1\nend\nputs x\n", stop_context("def f\n  ", "\n"))
    assert ruby == "x = 1\nend"  # the word `end` still closes the block
