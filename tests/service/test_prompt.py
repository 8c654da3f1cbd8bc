"""Prompt building: token budget, a window start that moves rarely, FIM templates from the vocabulary."""


import pytest
from transformers import AutoTokenizer


from rest_lsp.service.prompt import FILL, LINE_GRID, build_prompt, detect_fim, held_tokens


@pytest.fixture(scope="module")
def hf(tiny_models):
    return AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)


def source(n_lines: int) -> str:
    return "".join(f"value_{i} = compute({i}, name='item {i}')\n" for i in range(n_lines))


def test_short_prefix_is_whole_and_default_model_has_no_fim(hf):
    assert detect_fim(hf) is None
    p = build_prompt(hf, "def f(x):\n    return", "\n", budget=256, fim=None)
    assert p.prefix == "def f(x):\n    return"
    assert p.ids == hf("def f(x):\n    return", add_special_tokens=False)["input_ids"]


def test_whitespace_before_the_cursor_is_held_back(hf):
    # a body start: the prompt ends where the text does, before the line break and the indentation,
    # which this BPE writes as one token ("\n   " + " return")
    p = build_prompt(hf, "def f(x):\n    ", "\n", budget=256, fim=None)
    assert (p.prefix, p.held) == ("def f(x):", "\n    ")
    assert p.ids == hf("def f(x):", add_special_tokens=False)["input_ids"]
    assert hf("def f(x):\n    return", add_special_tokens=False)["input_ids"][: len(p.ids)] == p.ids
    # text before the cursor on its line, column 0, or only whitespace: nothing held back
    for before in ("def f(x):\n    return ", "x = 1\n", "    ", "\n  "):
        p = build_prompt(hf, before, "", budget=256, fim=None)
        assert (p.prefix, p.held, p.held_ids) == (before, "", ())


@pytest.mark.parametrize("held", ["\n    ", "\n        ", "\n\n    ", "\n\t\t"])
def test_the_held_back_whitespace_comes_as_the_tokens_the_model_writes_before_the_text(hf, held):
    """The tokens of the held-back run as they come before a line's text, which may take the run's last space:
    the start of every useful completion there (a draft source proposes it)."""
    p = build_prompt(hf, "def f(x):" + held, "\n", budget=256, fim=None)
    assert p.held == held and p.held_ids == held_tokens(hf, held) and p.held_ids
    for text in ("return x", "if x:", "# note", '"""Doc."""'):
        whole = hf("def f(x):" + held + text, add_special_tokens=False)["input_ids"]
        assert whole[: len(p.ids) + len(p.held_ids)] == p.ids + list(p.held_ids)
        written = hf.decode(whole[len(p.ids) + len(p.held_ids):])
        assert held.startswith(hf.decode(list(p.held_ids))) and (hf.decode(list(p.held_ids)) + written).endswith(text)
    assert held_tokens(hf, "") == ()


def test_long_prefix_fits_budget_and_starts_on_a_grid_line(hf):
    text = source(400)
    p = build_prompt(hf, text, "", budget=800, fim=None)
    assert 0 < len(p.ids) <= 800
    assert text.endswith(p.prefix)
    start = len(text) - len(p.prefix)
    assert text[start - 1] == "\n" and text.count("\n", 0, start) % LINE_GRID == 0


def test_typing_keeps_the_window_start(hf):
    text = source(400)
    a = build_prompt(hf, text + "val", "", budget=800, fim=None)
    b = build_prompt(hf, text + "valu", "", budget=800, fim=None)
    assert len(text) - len(a.prefix) == len(text) + 1 - len(b.prefix)  # same start
    common = 0
    while common < min(len(a.ids), len(b.ids)) and a.ids[common] == b.ids[common]:
        common += 1
    assert common >= len(a.ids) - 3


def _tokens(hf, text: str) -> int:
    return len(hf(text, add_special_tokens=False)["input_ids"])


def _line_start(text: str, line: int) -> int:
    return sum(len(t) for t in text.splitlines(keepends=True)[:line])


def test_a_new_window_fills_three_quarters_of_the_budget(hf):
    text = source(400)
    p = build_prompt(hf, text, "", budget=800, fim=None)
    longest_line = max(_tokens(hf, line) for line in text.splitlines(keepends=True))
    # on a grid line: at most LINE_GRID lines short of the share
    assert 600 - LINE_GRID * longest_line < len(p.ids) <= 600  # 3/4 of 800
    assert p.start_line == text.count("\n", 0, len(text) - len(p.prefix)) and p.start_line % LINE_GRID == 0
    assert build_prompt(hf, "x = 1\ny = ", "", budget=800, fim=None).start_line == 0  # all of it fits


def test_typing_line_after_line_keeps_the_start_until_it_no_longer_fits(hf):
    text, budget = source(100), 800
    start, starts = None, []
    for i in range(40):
        text += f"typed_{i} = compute({i}, name='line {i}')\n"
        p = build_prompt(hf, text, "", budget=budget, fim=None, keep_line=start)
        assert 0 < len(p.ids) <= budget and text.endswith(p.prefix)
        assert p.start_line == text.count("\n", 0, len(text) - len(p.prefix))
        if start is not None and p.start_line != start:
            assert _tokens(hf, text[_line_start(text, start):]) > budget  # it moved only when it had to
            assert len(p.ids) <= FILL * budget  # ... to a start that leaves room
        start = p.start_line
        starts.append(start)
    moves = len(set(starts)) - 1
    # a quarter of the budget typed per move at least: 40 lines of ~15 tokens are 600 tokens
    assert 1 <= moves <= 600 // (budget // 4) + 1, starts
    # without a start to keep, the window moves on the grid, while the kept one still fits
    fresh = [build_prompt(hf, source(100) + "".join(f"typed_{j} = compute({j}, name='line {j}')\n"
                                                     for j in range(i + 1)), "", budget=budget, fim=None).start_line
             for i in range(40)]
    assert fresh != starts


def test_a_kept_start_that_no_longer_fits_or_is_not_above_the_cursor_is_replaced(hf):
    text = source(400)
    fresh = build_prompt(hf, text, "", budget=800, fim=None)
    for keep in (0, 10, -3, text.count("\n") + 5, text.count("\n")):  # too far up, past the cursor, negative, empty
        p = build_prompt(hf, text, "", budget=800, fim=None, keep_line=keep)
        assert (p.start_line, p.ids) == (fresh.start_line, fresh.ids), keep
    near = text.count("\n") - 30  # 30 lines fit, and fill more than half the budget: kept
    assert 400 <= _tokens(hf, text[_line_start(text, near):]) <= 800
    p = build_prompt(hf, text, "", budget=800, fim=None, keep_line=near)
    assert p.start_line == near and p.prefix == text[_line_start(text, near):]
    # the cursor went up to a few lines below the kept start: the text above is worth more than the cache
    up = text[:_line_start(text, near + 5)]
    p = build_prompt(hf, up, "", budget=800, fim=None, keep_line=near)
    assert p.start_line < near and len(p.ids) > 400


def test_a_fim_prompt_keeps_its_start_too(tiny_models):
    hf = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    hf.add_special_tokens({"additional_special_tokens": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]})
    fim = detect_fim(hf)
    before, after = source(300), "\n" + source(50)
    first = build_prompt(hf, before, after, budget=400, fim=fim)
    typed = build_prompt(hf, before + source(3), after, budget=400, fim=fim, keep_line=first.start_line)
    assert len(typed.ids) <= 400 and typed.start_line == first.start_line
    assert typed.ids[: len(first.ids) // 2] == first.ids[: len(first.ids) // 2]


def test_huge_single_line_and_binary_text_stay_in_budget(hf):
    p = build_prompt(hf, "x" * 200_000, "", budget=128, fim=None)
    assert 0 < len(p.ids) <= 128
    p = build_prompt(hf, "\x00\x01\xff" * 1000 + "abc", "", budget=64, fim=None)
    assert 0 < len(p.ids) <= 64


@pytest.mark.parametrize("markers", [
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
])
def test_fim_detected_and_budget_split(tiny_models, markers):
    hf = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    hf.add_special_tokens({"additional_special_tokens": list(markers)})
    fim = detect_fim(hf)
    assert fim is not None
    ids = hf.convert_tokens_to_ids(list(markers))
    before, after = source(300), "\n" + source(300)
    p = build_prompt(hf, before, after, budget=400, fim=fim, suffix_fraction=0.25)
    assert len(p.ids) <= 400
    assert p.ids[0] == ids[0] and p.ids[-1] == ids[2] and ids[1] in p.ids
    n_suffix = len(p.ids) - p.ids.index(ids[1]) - 2
    assert 0 < n_suffix <= 100 and after.startswith(p.suffix) and p.suffix.endswith("\n")


def test_requests_alone_move_a_documents_start(hf):
    """Two servers given the same requests build the same prompts, whatever speculative prompts (warm-ups,
    guesses, prefetches) one of them also built: only requests move the kept start, and a request answered without
    a prompt (from a prefetch or the cache) moves it too."""
    from rest_lsp.service.prompt import KeptStarts

    def make(before, after, keep):
        return build_prompt(hf, before, after, budget=600, fim=None, keep_line=keep)

    text = source(400)
    places = [_line_start(text, line) for line in range(40, 400, 3)]
    quiet, busy = KeptStarts(), KeptStarts()
    starts = []
    for i, at in enumerate(places):
        before, after = text[:at], text[at:]
        quiet.asked("a.py", before, after, make)
        busy.asked("a.py", before, after, make)
        busy.build("a.py", text[: places[-1]], "", make)  # a speculative prompt far below: moves nothing
        if i % 3:  # the others answered at once, without a prompt: settled by the next build
            continue
        one, two = quiet.build("a.py", before, after, make), busy.build("a.py", before, after, make)
        assert one.ids == two.ids
        starts.append(one.start_line)
    assert len(set(starts)) < len(starts)  # kept while it fits
    assert starts == sorted(starts) and starts[-1] > starts[0]  # and moved down with the requests
