"""Prompt building: token budget, stable window start, FIM templates from the vocabulary."""


import pytest
from transformers import AutoTokenizer

from conftest_server import tiny_models  # noqa: F401  (fixture)
from rest_lsp.prompt import LINE_GRID, build_prompt, detect_fim


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
        assert (p.prefix, p.held) == (before, "")


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
