"""`rest-lsp generate` end to end, in a subprocess: its JSON report, and one clear sentence for bad input (most
cases through `main` in this process)."""

import io
import json
import logging
import shutil
import subprocess
import sys

import pytest
import torch

from support import EXACT_MODES, modes_here
from rest_lsp.engine.model import load_model

FIELDS = {"text", "token_ids", "new_tokens", "steps", "tokens_per_step", "prefill_ms", "decode_ms", "ms_per_token", "mode"}


def rest_lsp(*args, stdin=None, timeout=300):
    proc = subprocess.run(
        [sys.executable, "-m", "rest_lsp.cli", *map(str, args)],
        input=stdin, capture_output=True, text=True, timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def models(tiny_models, tmp_path_factory):
    dirs = tiny_models  # the suite's own tiny models (tests/conftest.py), built once and kept
    short = tmp_path_factory.mktemp("short") / "short"
    shutil.copytree(dirs["random"], short)
    config = json.loads((short / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (short / "config.json").write_text(json.dumps(config))
    return {"random": dirs["random"], "short": short}


@pytest.mark.quiet  # the CLI sizes trees by the step cost it measures: beside another test, no tree may pay
@pytest.mark.parametrize("dtype", modes_here())
def test_generate_json_rest_equals_plain_and_model_generate(models, tmp_path, dtype):
    """In each mode this machine runs: REST writes what plain decoding of the same mode writes where the mode
    claims it (float32 and float16-weights), and float32 writes what transformers' `generate` does."""
    prompt = tmp_path / "p.py"
    prompt.write_text("def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "lib.py").write_text("def add(a, b):\n    return a + b + 1\n" * 3)
    code, out, err = rest_lsp("generate", prompt, "--model", models["random"], "--workspace", ws, "--json",
                              "--max-new-tokens", 24, "--dtype", dtype)
    assert code == 0, err
    rest = json.loads(out)
    assert FIELDS <= rest.keys() and rest["mode"] == "rest" and rest["new_tokens"] == 24
    assert rest["dtype"] == dtype  # the mode asked for runs: no fallback on this machine
    code, out, err = rest_lsp("generate", prompt, "--model", models["random"], "--no-rest", "--json",
                              "--max-new-tokens", 24, "--dtype", dtype)
    assert code == 0, err
    plain = json.loads(out)
    assert plain["mode"] == "ar" and plain["steps"] == 24 and plain["tokens_per_step"] == 1.0
    assert plain["dtype"] == dtype
    if dtype not in EXACT_MODES:
        return  # bfloat16: a tree step rounds differently from a one-token step, so no equality is claimed
    assert rest["token_ids"] == plain["token_ids"]
    assert rest["steps"] < plain["steps"]  # the repeated text gave drafts that were accepted
    if dtype != "float32":
        return
    loaded = load_model(str(models["random"]), "cpu", "float32")
    ids = torch.tensor([loaded.tokenizer.encode(prompt.read_text())])
    ref = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24,
                                do_sample=False)[0, ids.shape[1]:].tolist()
    assert rest["token_ids"] == ref


def test_generate_text_mode_reads_stdin(models):
    code, out, err = rest_lsp("generate", "-", "--model", models["random"], "--max-new-tokens", 5, stdin="x = 1\n")
    assert code == 0, err
    assert "tokens/step" in err and out.strip() != ""


def test_sampling_is_reproducible_with_a_seed(models, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("for i in range(10):\n")
    runs = [rest_lsp("generate", prompt, "--model", models["random"], "--json", "--temperature", "0.8",
                     "--top-p", "0.9", "--seed", 3, "--max-new-tokens", 12) for _ in range(2)]
    assert all(code == 0 for code, _, _ in runs), [err for _, _, err in runs]
    sampled = json.loads(runs[0][1])["token_ids"]
    assert sampled == json.loads(runs[1][1])["token_ids"]
    # a sampler that silently went greedy would also be reproducible: it must not give the greedy text.
    # The random model's next-token distributions are nearly flat over 49k tokens, so 12 sampled tokens equal
    # to the argmax ones by chance is out of the question.
    code, out, err = rest_lsp("generate", prompt, "--model", models["random"], "--json", "--max-new-tokens", 12)
    assert code == 0, err
    greedy = json.loads(out)["token_ids"]
    assert len(sampled) == len(greedy) == 12
    assert sampled != greedy


def test_long_prompt_keeps_the_tail_and_says_so(models, tmp_path):
    prompt = tmp_path / "long.py"
    prompt.write_text("value = compute(value)\n" * 200)
    code, out, err = rest_lsp("generate", prompt, "--model", models["short"], "--json", "--max-new-tokens", 8,
                              "--budget", 4)
    assert code == 0, err
    assert "longer than the model's context" in err and "Traceback" not in err
    report = json.loads(out)
    assert report["prompt_tokens"] == 64 - 8 - 4 - 1 and report["new_tokens"] == 8


@pytest.mark.parametrize(
    "args, stdin, message",
    [
        (["generate", "{empty}"], None, "The prompt is empty"),
        (["generate", "-"], "   \n", "The prompt is empty"),
        (["generate", "/nonexistent/prompt.py"], None, "does not exist"),
        (["generate", "{prompt}", "--max-new-tokens", "0"], None, "--max-new-tokens must be at least 1"),
        (["generate", "{prompt}", "--model", "no-such-org/no-such-model"], None, "Could not load model"),
        (["generate", "{prompt}", "--model", "/nonexistent/model.gguf"], None, "does not exist"),
        (["generate", "{prompt}", "--workspace", "/nonexistent/ws"], None, "is not a folder"),
        (["generate", "{prompt}", "--top-p", "0"], None, "--top-p"),
    ],
)
def test_bad_input_is_one_clear_sentence(tmp_path, capsys, caplog, monkeypatch, args, stdin, message):
    """In this process (a fresh interpreter per case would repeat the imports; the entry point as a person runs it
    is the subprocess case below): the sentence is all of stderr, and nothing is logged beside it."""
    from rest_lsp.cli import main

    (tmp_path / "empty.py").write_text("")
    (tmp_path / "prompt.py").write_text("x = 1\n")
    args = [a.format(empty=tmp_path / "empty.py", prompt=tmp_path / "prompt.py") for a in args]
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin or ""))
    caplog.set_level(logging.WARNING)
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not caplog.records, caplog.text  # a warning would be a second line on a person's terminal


def test_bad_input_through_the_entry_point_is_one_sentence_and_exit_2(tmp_path):
    (tmp_path / "prompt.py").write_text("x = 1\n")
    code, out, err = rest_lsp("generate", tmp_path / "prompt.py", "--model", "/nonexistent/model.gguf", timeout=120)
    assert code == 2 and out == ""
    assert "does not exist" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("temperature", ["1e-40", "nan", "inf", "-1"])
def test_generate_refuses_temperatures_that_break_sampling(tmp_path, capsys, temperature):
    from rest_lsp.cli import main

    prompt = tmp_path / "p.txt"
    prompt.write_text("def add(a, b):\n")
    assert main(["generate", str(prompt), "--model", str(tmp_path / "never-loaded"),
                 f"--temperature={temperature}"]) == 2
    err = capsys.readouterr().err
    assert "--temperature must be 0 (greedy) or from" in err and "Traceback" not in err
