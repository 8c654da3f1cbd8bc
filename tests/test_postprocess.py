"""Stop rules: where a completion ends, and that what is left is never blank."""

from rest_lsp.postprocess import stop_context, trim


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
    assert final("y = x + 1\n    return y\n\nprint(f(2))\n", before) == "y = x + 1\n    return y"


def test_block_after_opener_takes_indent_of_first_written_line():
    assert final("\n    return 1\nclass B:\n    pass", "def f():") == "\n    return 1"


def test_closing_bracket_at_opener_level_belongs_to_the_block():
    before = "function f() {\n  "
    assert final("return 1;\n}\nfunction g() {}", before) == "return 1;\n}"
    # ... unless the suffix already closes it
    assert final("return 1;\n}\n", before, "\n}\n") == "return 1;"


def test_rest_of_line_is_not_written_twice():
    assert final('"hello")\n', "print(", ")\n") == '"hello"'


def test_next_suffix_line_is_not_repeated():
    before = "def f(x):\n    "
    after = "\n    return y\n"
    assert final("y = x * 2\n    return y\n", before, after) == "y = x * 2"


def test_stopped_only_once_a_rule_fired():
    ctx = stop_context("def f(x):\n    ", "")
    assert trim("y = 1\n    z", ctx, final=False) == ("y = 1\n    z", False)
    # a partial line whose indent is already known to be smaller ends the block now
    assert trim("y = 1\npr", ctx, final=False) == ("y = 1", True)


def test_two_blank_lines_end_top_level_code():
    assert final("import os\n\n\ndef main():\n    pass", "") == "import os"


def test_never_blank():
    assert final("   \n\t\n", "def f():\n    ") == ""
    assert final("\nprint(1)", "x = 1") == ""  # single line: nothing before the line break
    before = "def f():\n    "
    assert final("return 1", before, "\n    return 1\n") == ""  # only the next line again


def test_trailing_whitespace_dropped():
    assert final("foo  \n", "x = ") == "foo"
