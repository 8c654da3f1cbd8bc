"""What the completion service feeds REST: its own outputs, the text after the cursor, the learned acceptance
table kept across restarts, and the draft-source setting."""

import pytest
from support import greedy

from rest_lsp.drafting.acceptance import AcceptanceModel, table_location
from rest_lsp.service.completion import CompletionService
from rest_lsp.settings import Settings

BEFORE = "def scale(values, factor):\n    out = []\n    for v in values:\n        out.append(v *"
AFTER = "\n    return out\n"


def start(model_dir, cache, **kw) -> CompletionService:
    # every request decodes (no suggestion cache) and only requests decode (no prefetch): these tests count steps
    settings = Settings(model=str(model_dir), dtype="float32", max_new_tokens=16, debounce_ms=0, cache_dir=str(cache),
                        index_workspace=False, suggestion_cache_size=0, prefetch=False, **kw)
    svc = CompletionService(settings)
    svc.start([])
    assert svc.wait_ready(120), svc.load_error
    return svc


def decode_delta(svc, doc, text, offset):
    before = svc.stats()
    c = svc.submit(doc, text, offset).future.result(120)
    after = svc.stats()
    return c, after["generated_tokens"] - before["generated_tokens"], after["decode_steps"] - before["decode_steps"]


def test_the_models_own_output_drafts_the_next_request_at_the_same_place(tiny_models, tmp_path):
    svc = start(tiny_models["random"], tmp_path, draft_exclude=("suffix", "recycle"))
    try:
        truth = greedy(tiny_models["random"], BEFORE, AFTER, 16)
        first, tokens, steps = decode_delta(svc, "mem://a.py", BEFORE + AFTER, len(BEFORE))
        assert first is not None and first.text == truth
        assert len(svc._model.outputs) == 1  # stored whether or not the user takes it
        # the same place again (another document, so nothing is type-through): the output is the draft
        again, tokens2, steps2 = decode_delta(svc, "mem://b.py", BEFORE + AFTER, len(BEFORE))
        assert again.text == truth
        assert tokens2 == tokens and steps2 < steps and tokens2 / steps2 >= 3
    finally:
        svc.close()


def test_the_learned_acceptance_table_survives_a_restart(tiny_models, tmp_path):
    svc = start(tiny_models["random"], tmp_path)
    try:
        for doc in ("mem://a.py", "mem://b.py", "mem://c.py"):
            assert svc.submit(doc, BEFORE + AFTER, len(BEFORE)).future.result(120) is not None
        learned = svc._decoder.acceptance.observations
        assert learned > 0 and svc.stats()["acceptance_observations"] == learned
        loaded = svc._loaded
    finally:
        svc.close()
    path, key = table_location(tmp_path, loaded.name, str(loaded.dtype), loaded.device.type)
    assert AcceptanceModel.load(path, key).observations == learned  # saved at close
    again = start(tiny_models["random"], tmp_path)
    try:
        assert again._decoder.acceptance.observations == learned  # and loaded at start
    finally:
        again.close()


def test_draft_exclude_setting():
    s, errors = Settings().update({"draftExclude": ["outputs", "recycle"]})
    assert s.draft_exclude == ("outputs", "recycle") and not errors
    s2, errors = s.update({"draftExclude": ["nonsense"]})
    assert s2.draft_exclude == ("outputs", "recycle") and len(errors) == 1 and "draft sources" in errors[0]
    assert Settings().update({"draftExclude": "context, suffix"})[0].draft_exclude == ("context", "suffix")


def test_stats_name_the_sources_in_use(tiny_models, tmp_path):
    svc = start(tiny_models["random"], tmp_path, draft_exclude=("workspace",))
    try:
        assert svc.stats()["draft_sources"] == ["context", "suffix", "outputs", "recycle", "held"]
    finally:
        svc.close()
    plain = start(tiny_models["random"], tmp_path, draft_budget=0)
    try:
        assert plain.stats()["draft_sources"] == []
        c = plain.submit("mem://a.py", BEFORE + AFTER, len(BEFORE)).future.result(120)
        assert c.steps == c.tokens  # plain decoding: one token a step
    finally:
        plain.close()


def test_at_a_line_start_the_first_drafts_begin_with_the_held_back_indentation(tiny_models, tmp_path, monkeypatch):
    """The prompt ends before an auto-indented line start's whitespace (the model writes it): the service hands the
    decoder that start, so the first step drafts it and hangs the sources' drafts below it; exact all the same."""
    from rest_lsp.service.prompt import held_tokens

    made = []
    real = CompletionService._draft_source

    def spy(self, *args, **kwargs):
        drafts = real(self, *args, **kwargs)
        made.append((args[5] if len(args) > 5 else kwargs.get("held"), drafts))
        return drafts

    monkeypatch.setattr(CompletionService, "_draft_source", spy)
    svc = start(tiny_models["random"], tmp_path, max_lines=0)  # the whole greedy text, as the reference has it
    try:
        # the line above ends a loop header, as one does earlier in the prompt: the context says what follows
        head = ("def scale(values, factor):\n    out = []\n    for v in values:\n        out.append(v)\n"
                "    for v in values:")
        before, after = head + "\n        ", "\n    return out\n"
        truth = greedy(tiny_models["random"], before, after, 16)
        c = svc.submit("mem://a.py", before + after, len(before)).future.result(120)
        assert (c.text if c is not None else "") == truth
        (at, start_ids), drafts = made[-1]
        hf = svc._loaded.tokenizer.hf
        assert start_ids == held_tokens(hf, "\n        ") and start_ids
        prompt = hf(head, add_special_tokens=False)
        assert at == len(prompt["input_ids"])
        first = drafts.propose(prompt["input_ids"])
        assert first[0].source == "held" and first[0].tokens == start_ids
        assert len(first) > 1 and all(p.under == start_ids for p in first[1:])
        assert any(p.source == "context" and p.match_length > len(start_ids) for p in first[1:])
        # mid-line there is nothing held back: the sources as they are
        svc.submit("mem://b.py", BEFORE + AFTER, len(BEFORE)).future.result(120)
        assert made[-1][0][1] == ()
    finally:
        svc.close()


def test_a_one_line_suggestions_drafts_end_at_its_first_line(tiny_models, tmp_path, monkeypatch):
    """Mid-line (or with one line at most) the suggestion ends at its first line break after text: the service cuts
    the drafts there (nothing below is ever shown); where several lines may come, it does not. Exact either way."""
    from rest_lsp.drafting.drafts import FirstLine

    made = []
    real = CompletionService._draft_source

    def spy(self, *args, **kwargs):
        drafts = real(self, *args, **kwargs)
        made.append(drafts)
        return drafts

    monkeypatch.setattr(CompletionService, "_draft_source", spy)
    svc = start(tiny_models["random"], tmp_path)
    try:
        truth = greedy(tiny_models["random"], BEFORE, AFTER, 16)
        c = svc.submit("mem://a.py", BEFORE + AFTER, len(BEFORE)).future.result(120)
        assert (c.text if c is not None else "") == truth.split("\n")[0].rstrip()
        hf = svc._loaded.tokenizer.hf
        assert isinstance(made[-1], FirstLine) and made[-1].at == len(hf(BEFORE, add_special_tokens=False)["input_ids"])
        assert made[-1].lines is svc._model.lines  # one memo of token texts per model
        assert made[-1].any_break  # mid-line, nothing held back: its first line break ends it
        # a line start (the indentation held back) with one line at most, the default: cut after text only
        line_start = "def f(values):\n    "
        svc.submit("mem://c.py", line_start + "\n", len(line_start)).future.result(120)
        assert isinstance(made[-1], FirstLine) and not made[-1].any_break
        # an empty line where any number of lines may come: not cut
        svc.update_settings(Settings(**{**svc.settings.__dict__, "max_lines": 0}))
        svc.submit("mem://b.py", "def f():\n    \n", len("def f():\n    ")).future.result(120)
        assert not isinstance(made[-1], FirstLine)
    finally:
        svc.close()
