"""Other files' context (service/extra_context.py): chunks of recently used documents before the file's window, the
same tokens while the person types in the file, within their budget, only from what the datastore holds."""

from pathlib import Path

import pytest
from support import wait_for
from transformers import AutoTokenizer

from rest_lsp.service.completion import CompletionService
from rest_lsp.service.extra_context import Chunk, PromptHead, choose_chunks, datastore_id
from rest_lsp.service.prompt import build_prompt
from rest_lsp.settings import Settings

HELPERS = (
    "import math\n\n\n"
    "def compute_total(items, rate):\n"
    "    \"\"\"The sum of the items' prices with the rate applied.\"\"\"\n"
    "    return sum(item.price * rate for item in items)\n\n\n"
    + "".join(f"def unrelated_{i}(a, b):\n    return a ** {i} - b\n\n\n" for i in range(40))
)
MAIN = "from helpers import compute_total\n\n\ndef checkout(cart, rate):\n    total = "
SECRET = "def leaked_marker_xyzzy(cart, rate):\n    return 'qwertyuiop'\n"


def _service(tiny_models, root: Path, extra: int) -> CompletionService:
    svc = CompletionService(Settings(dtype="float32", model=str(tiny_models["random"]), max_new_tokens=8,
                                     debounce_ms=0, extra_context_tokens=extra, cache_dir=str(root / ".cache-x")))
    svc.start([root])
    assert svc.wait_ready(120), svc.load_error
    assert svc.wait_indexed(120)
    return svc


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "helpers.py").write_text(HELPERS)
    (root / "main.py").write_text(MAIN + "\n")
    return root.resolve()


def _prompt(svc, uri: str, before: str, after: str = "\n"):
    with svc._lock:
        model, s = svc._model, svc.settings
    return svc._prompt(model, s, uri, before, after)


def _decode(svc, ids) -> str:
    return svc._loaded.tokenizer.decode(ids)


def test_the_chunks_come_before_the_window_and_stay_while_the_person_types(tiny_models, workspace):
    svc = _service(tiny_models, workspace, 256)
    try:
        svc.open_buffer(str(workspace / "helpers.py"), HELPERS)  # the person looked at the helpers
        uri = (workspace / "main.py").as_uri()
        svc.open_buffer(str(workspace / "main.py"), MAIN)
        first = _prompt(svc, uri, MAIN)
        window = svc._loaded.tokenizer.encode(first.prefix)
        assert first.ids[-len(window):] == window  # the file's window ends the prompt (no FIM here)
        head = first.ids[: len(first.ids) - len(window)]
        text = _decode(svc, head)
        assert 0 < len(head) <= 256
        assert "def compute_total(items, rate):" in text and text.startswith("# helpers.py\n")
        assert text.endswith("# main.py\n")  # then the current file
        made = svc._extra.choices_made
        typed = MAIN
        for ch in "compute_total(cart, rate)\n    return total":
            typed += ch
            p = _prompt(svc, uri, typed)
            assert p.ids[: len(head)] == head  # the KV cache of everything before the window survives
        assert svc._extra.choices_made == made  # chosen once, not per keystroke
        # a document the person opens next is a new candidate: chosen again (at that slow cadence only)
        (workspace / "sub").mkdir()
        svc.open_buffer(str(workspace / "sub" / "other.py"), "def checkout_rate(rate):\n    return rate\n")
        wait_for(lambda: str(workspace / "sub" / "other.py") in svc._datastore, what="the new buffer fed")
        _prompt(svc, uri, typed)
        assert svc._extra.choices_made == made + 1
    finally:
        svc.close()


def test_zero_turns_it_off(tiny_models, workspace):
    svc = _service(tiny_models, workspace, 0)
    try:
        svc.open_buffer(str(workspace / "helpers.py"), HELPERS)
        uri = (workspace / "main.py").as_uri()
        p = _prompt(svc, uri, MAIN)
        plain = build_prompt(svc._loaded.tokenizer.hf, MAIN, "\n", budget=svc.settings.context_tokens, fim=None)
        assert p.ids == plain.ids
        assert svc._extra.choices_made == 0
    finally:
        svc.close()


def test_a_closed_buffer_outside_the_workspace_never_reaches_a_prompt(tiny_models, workspace, tmp_path):
    svc = _service(tiny_models, workspace, 512)
    try:
        outside = tmp_path / "elsewhere" / "notes.py"
        outside.parent.mkdir()
        outside.write_text(SECRET)
        svc.open_buffer(str(outside), SECRET)
        wait_for(lambda: str(outside) in svc._datastore, what="the buffer fed")
        uri = (workspace / "main.py").as_uri()
        before = MAIN + "leaked_marker_xyzzy(cart, rate)\n    "
        assert "qwertyuiop" in _decode(svc, _prompt(svc, uri, before).ids)  # open: it may be used
        svc.close_buffer(str(outside))
        wait_for(lambda: str(outside) not in svc._datastore, what="the closed buffer gone from the datastore")
        for after in ("\n", "\n# more\n"):
            assert "qwertyuiop" not in _decode(svc, _prompt(svc, uri, before, after).ids)
    finally:
        svc.close()


@pytest.fixture(scope="module")
def hf(tiny_models):
    return AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)


def test_the_budget_is_respected(hf):
    encode = lambda t: list(hf(t, add_special_tokens=False)["input_ids"])
    head = PromptHead(hf, encode)
    candidates = [(f"/ws/m{i}.py", f"m{i}.py", HELPERS, i % 2 == 0) for i in range(6)]
    for budget in (16, 64, 200, 700, 3000):
        chunks = choose_chunks("/ws/main.py", MAIN, "\n", candidates, lambda t: len(encode(t)), budget)
        ids = head.ids(chunks, "main.py")
        assert len(ids) <= budget + len(encode("# main.py\n")) + 4
    from rest_lsp.service.extra_context import ExtraContext

    class Store:
        def __init__(self):
            self.docs = {d: encode(text) for d, _, text, _ in candidates}

        def __contains__(self, d):
            return d in self.docs

        def doc_ids(self):
            return list(self.docs)

        def document_tokens(self, d):
            import numpy as np
            return np.array(self.docs[d]) if d in self.docs else None

    extra = ExtraContext()
    for budget in (16, 64, 200, 700, 3000):
        ids = extra.prompt_ids("/ws/main.py", MAIN, "\n", budget, Store(), head, hf.decode)
        assert len(ids) <= budget
        if budget >= 200:
            assert "compute_total" in hf.decode(ids)


def test_qwen_coder_gets_its_repo_level_format(tiny_models):
    hf = AutoTokenizer.from_pretrained(str(tiny_models["random"]), local_files_only=True)
    hf.add_special_tokens({"additional_special_tokens": ["<|repo_name|>", "<|file_sep|>"]})
    encode = lambda t: list(hf(t, add_special_tokens=False)["input_ids"])
    head = PromptHead(hf, encode, "shop")
    assert head.repo_level
    ids = head.ids([Chunk("/ws/helpers.py", "helpers.py", "def f():\n    pass\n")], "main.py")
    repo, sep = hf.convert_tokens_to_ids(["<|repo_name|>", "<|file_sep|>"])
    assert ids[0] == repo and ids.count(sep) == 2
    assert hf.decode(ids) == "<|repo_name|>shop\n<|file_sep|>helpers.py\ndef f():\n    pass\n<|file_sep|>main.py\n"


def test_a_file_uri_names_the_datastore_document(tmp_path):
    f = (tmp_path / "a b.py").resolve()
    assert datastore_id(f.as_uri()) == str(f)
    assert datastore_id("untitled:1") == "untitled:1"
