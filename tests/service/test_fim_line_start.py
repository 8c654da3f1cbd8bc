"""FIM at an auto-indented line start: the prompt holds the line break and indentation the person typed (up to the
whitespace the first word's token takes), and the stop rules read the model's text after it, for every template."""

import time

import pytest
from support import chain_model
from transformers import AutoTokenizer

from rest_lsp.service.completion import CompletionService
from rest_lsp.service.postprocess import stop_context, trim
from rest_lsp.service.prompt import FIM_TEMPLATES, build_prompt, detect_fim
from rest_lsp.settings import Settings

BEFORE = "def f(x):\n    y = x * 2\n    "
AFTER = "\n\nprint(f(1))\n"


def fim_tokenizer(tiny_models, template):
    hf = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    hf.add_special_tokens({"additional_special_tokens": [template.prefix, template.suffix, template.middle]})
    return hf


@pytest.fixture(params=FIM_TEMPLATES, ids=lambda t: t.name)
def fim_hf(request, tiny_models):
    hf = fim_tokenizer(tiny_models, request.param)
    fim = detect_fim(hf)
    assert fim is not None and fim.template is request.param
    return hf, fim


@pytest.mark.parametrize("indent", ["    ", "\t", "\n    ", "        "])
def test_the_prompt_holds_the_typed_line_start_as_the_model_writes_it_before_a_word(fim_hf, indent):
    hf, fim = fim_hf
    before = "def f(x):\n" + indent
    p = build_prompt(hf, before, AFTER, budget=256, fim=fim)
    middle = p.ids[p.ids.index(fim.middle_id) + 1:]
    # the middle's tokens are those of the whole line with its first word, up to that word's token
    whole = hf(hf.decode(middle) + p.held[len(p.held_written):] + "return y", add_special_tokens=False)["input_ids"]
    assert whole[: len(middle)] == middle
    assert hf.decode(middle).endswith(p.held_written) and p.held_written.startswith("\n")
    assert p.held == "\n" + indent and indent.endswith(p.held[len(p.held_written):])
    assert p.prefix.endswith("def f(x):" + p.held_written) and p.held_ids == ()


def test_without_fim_the_line_start_stays_held_back(tiny_models):
    hf = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    p = build_prompt(hf, BEFORE, AFTER, budget=256, fim=None)
    assert p.prefix == BEFORE.rstrip() and p.held_written == "" and p.held_ids


def test_the_stop_rules_read_the_model_text_after_what_the_prompt_wrote(fim_hf):
    hf, fim = fim_hf
    p = build_prompt(hf, BEFORE, AFTER, budget=256, fim=fim)
    ctx = stop_context(BEFORE, AFTER, 1, p.held_written)
    rest = p.held[len(p.held_written):]  # the whitespace the first word's token takes
    assert rest in ("", " ") and trim(rest + "return y\n", ctx, final=True) == ("return y", True)
    # the model writes the whole line start again (a blank line first): the code still goes on the cursor line
    assert trim("\n    return y", ctx, final=True)[0] == "return y"
    assert trim("\n        return y", ctx, final=True)[0] == "    return y"
    # only whitespace so far: nothing yet
    assert trim("", ctx, final=False) == ("", False)


def test_an_indentation_of_the_other_kind_gives_way_to_the_typed_one():
    """The person's editor wrote a tab, the model (having seen no tab) writes spaces, or the other way round."""
    tabbed = stop_context("def f(x):\n\t", "\n", 1)
    assert trim("\n    return x\n", tabbed, final=True)[0] == "return x"
    spaced = stop_context("def f(x):\n    ", "\n", 1)
    assert trim("\n\treturn x\n", spaced, final=True)[0] == "return x"
    # a dedent or the previous line continued still cannot be written at the cursor
    assert trim("\nreturn x", tabbed, final=True) == ("", True)
    assert trim(" * 2", spaced, final=False) == ("", True)


@pytest.fixture(scope="module")
def fim_writer(tiny_models, tmp_path_factory):
    """A FIM model (Qwen markers) whose greedy output is ` return y` and a line break, over and over."""
    template = next(t for t in FIM_TEMPLATES if t.name == "qwen")
    hf = fim_tokenizer(tiny_models, template)
    chain = [hf.convert_tokens_to_ids(t) for t in ("Ġreturn", "Ġy", "Ċ")]
    return chain_model(tmp_path_factory.mktemp("fim-writer"), hf, chain)


@pytest.mark.parametrize("budget", [0, 16])
def test_the_service_shows_a_fim_models_line_after_the_typed_indentation(fim_writer, tmp_path, budget):
    settings = Settings(model=str(fim_writer), dtype="float32", max_new_tokens=8, draft_budget=budget,
                        debounce_ms=0, index_workspace=False, prefetch=False, cache_dir=str(tmp_path))
    service = CompletionService(settings)
    try:
        service.start([])
        assert service.wait_ready(120), service.load_error
        assert service.stats()["fim"] == "qwen"
        c = service.submit("mem://f.py", BEFORE + AFTER, len(BEFORE)).future.result(120)
        assert c is not None and c.text == "return y"
    finally:
        service.close()


@pytest.mark.parametrize("before", [BEFORE, "def f(x):\n    y = x * 2\n    return y", "a = 1\nb = 2\nc = 3\nd = 4\n"])
def test_the_drafts_view_of_a_fim_prompt_ends_at_the_cursor_as_the_file_does(fim_hf, before):
    """What the draft sources see in place of a FIM prompt: the text after the cursor, then the text before it up to
    the cursor, with no marker: a file's text, as the workspace and the model's outputs hold it."""
    hf, fim = fim_hf
    p = build_prompt(hf, before, AFTER, budget=256, fim=fim)
    assert not {fim.prefix_id, fim.suffix_id, fim.middle_id} & set(p.view)
    assert hf.decode(list(p.view)) == p.suffix + p.prefix
    assert before.startswith(p.prefix) and before[len(p.prefix):].strip() == ""
    assert build_prompt(hf, before, AFTER, budget=256, fim=None).view == ()


def test_the_workspace_drafts_a_fim_models_first_token(fim_writer, tmp_path):
    """At a line start where the prompt's middle is empty (the context ends with the middle marker), the workspace
    file holding the line the model writes drafts it from the first step: one step for the whole line."""
    before = "a = 1\nb = 2\nc = 3\nd = 4\n"  # the fifth line: the middle starts at the cursor
    settings = Settings(model=str(fim_writer), dtype="float32", max_new_tokens=8, draft_budget=16, debounce_ms=0,
                        index_workspace=False, prefetch=False, suggestion_cache_size=0, cache_dir=str(tmp_path),
                        draft_exclude=("context", "outputs", "recycle", "suffix"))
    service = CompletionService(settings)
    try:
        service.start([])
        assert service.wait_ready(120), service.load_error
        service.open_buffer(str(tmp_path / "other.py"), before + " return y\n")
        deadline = time.monotonic() + 60
        while not service.drafts("d = 4\n") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.drafts("d = 4\n"), "the buffer never reached the datastore"
        steps = service.stats()["decode_steps"]
        c = service.submit("mem://f.py", before + "\n", len(before)).future.result(120)
        assert c is not None and c.text.strip() == "return y"
        assert service.stats()["decode_steps"] - steps == 1
    finally:
        service.close()
