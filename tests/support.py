"""Small real models and the LSP test client for the service and language-server tests (imported by the test
files of tests/service, tests/server and tests/commands; the `tiny_models` fixture is in tests/conftest.py).

Both use the default model's real tokenizer and are saved as ordinary model folders,
so they go through the same `load_model` path as any user model, in well under a second:
  - `random`: a 2-layer Llama with seeded random weights (some greedy continuation);
  - `constant`: a model that writes "x" after anything, forever: a completion that only
    ends at max_new_tokens (for cancellation tests).
They are built once and kept in pytest's cache folder.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import torch
from lsprotocol import types
from pytest_lsp import client_capabilities, make_test_lsp_client
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rest_lsp.engine.model import LoadedModel

REPO = Path(__file__).resolve().parents[1]
CAPABILITIES = REPO / "tests" / "data"
VERSION = "1"  # bump when the recipe below changes


def _tokenizer(cache: Path):
    from transformers import AutoTokenizer

    folder = cache / "tokenizer"
    if not (folder / "tokenizer_config.json").is_file():
        from rest_lsp.engine.model import DEFAULT_MODEL

        gguf = Path(DEFAULT_MODEL)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _build(kind: str, folder: Path, tok) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    if kind == "constant":
        # Every token embeds to the same vector and no layer adds anything to the residual
        # stream, so the last hidden state is the same after any context; the head maps it to "x".
        x = tok.convert_tokens_to_ids("x")
        with torch.no_grad():
            model.model.embed_tokens.weight.fill_(1.0)
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            model.lm_head.weight.zero_()
            model.lm_head.weight[x] = 1.0
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def tiny_model_dirs(cache: Path) -> dict[str, Path]:
    cache.mkdir(parents=True, exist_ok=True)
    tok = None
    out = {}
    for kind in ("random", "constant"):
        folder = cache / f"{kind}-v{VERSION}"
        if not (folder / "config.json").is_file():
            tok = tok or _tokenizer(cache)
            _build(kind, folder, tok)
        out[kind] = folder
    return out


def chain_model(folder: Path, tok, chain: list[int]) -> Path:
    """Greedy writes chain[0], chain[1], ... after any text (embeddings pick a direction, the layers add nothing,
    the head maps direction i to chain[i+1])."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    with torch.no_grad():
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        emb.zero_()
        emb[:, 63] = 1.0
        head.zero_()
        for i, t in enumerate(chain):
            emb[t].zero_()
            emb[t, i] = 1.0
            head[chain[(i + 1) % len(chain)], i] = 1.0
        head[chain[0], 63] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# The modes a model runs in (README, "Use"): float32 is the exact mode everywhere; bfloat16 runs where the CPU
# computes it in hardware and claims no equality with plain decoding; float16-weights runs where the lean engine
# packs fp16 weights and writes what plain decoding in that mode writes.
EXACT_MODES = ("float32", "float16-weights")


def modes_here() -> list[str]:
    """The modes this machine runs natively, float32 first (a test parametrized by them runs each one)."""
    import torch

    try:
        from rest_lsp.engine.runmode import native_bf16
    except ImportError:  # where runmode does not have it yet
        from rest_lsp.engine.calibration import native_bf16
    from rest_lsp.engine.matmuls import fp16_packs

    modes = ["float32"]
    if native_bf16():
        modes.append("bfloat16")
    if fp16_packs(torch.float32, torch.device("cpu")):
        modes.append("float16-weights")
    return modes


def server_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rest_lsp.cli", "--stdio", *args]


def greedy(model_dir: Path, before: str, after: str, n: int, budget: int = 1024) -> str:
    """The reference completion of a model folder (see `greedy_of`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, local_files_only=True)
    return greedy_of(model, hf, before, after, n, budget)


def greedy_of(model, hf, before: str, after: str, n: int, budget: int = 1024) -> str:
    """The reference completion: transformers' own greedy `generate` on the same prompt, then the
    same post-processing (prefix-only models). Both come from the server's own functions: the prompt
    leaves out the whitespace before a cursor at a body start (`Prompt.held`), and `finish_text` takes
    it off the model's text again, so the comparison checks the decoder on the prompt the server sends."""
    import torch

    from rest_lsp.service.completion import finish_text
    from rest_lsp.service.postprocess import stop_context
    from rest_lsp.service.prompt import build_prompt

    prompt = build_prompt(hf, before, after, budget=budget, fim=None)
    out = model.generate(torch.tensor([prompt.ids]), attention_mask=torch.ones(1, len(prompt.ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False)[0, len(prompt.ids):]
    return finish_text(hf.decode(out.tolist(), skip_special_tokens=True), stop_context(before, after))


# -- the client side of the e2e tests over stdio ------------------------------------------------------------------


def capabilities(name: str) -> types.ClientCapabilities:
    caps = client_capabilities(name)
    # neither capture advertises inline completion (VS Code added it later, Neovim 0.12)
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    return caps


async def start(command, root: Path, client_name: str, options: dict, env: dict | None = None):
    client = make_test_lsp_client()
    await client.start_io(*command, env=env)
    result = await client.initialize_session(types.InitializeParams(
        capabilities=capabilities(client_name),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
        initialization_options=options,
    ))
    return client, result


async def command(client, name: str, *args):
    return await client.workspace_execute_command_async(types.ExecuteCommandParams(command=name, arguments=list(args)))


def wait_for(check, timeout: float = 60.0, what: str = "the condition"):
    """Poll `check` until it is true and return its value; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


async def wait_until(check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)


def open_doc(client, uri: str, text: str, version: int = 1):
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)))


def inline(client, uri: str, line: int, character: int, **kw):
    return client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)), **kw)


def cursor_at_end(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines) - 1, len(lines[-1])


TEAM_TOKEN = "s3cret-token-for-tests-0123456789"  # the team server tests' bearer token

# Files that share one pytest-xdist worker, one after the other, never side by side (conftest.py's scheduler): each
# starts a Ray cluster.
SAME_WORKER = {"tests/team/test_serve_cluster.py": "ray-cluster", "tests/team/test_serve_process.py": "ray-cluster"}

# Where the model fixtures run: the CPU, unless a GPU run of the exactness tests asks for another device
# (REST_LSP_TEST_DEVICE=cuda; see benchmarks/gpu_check.sh).
TEST_DEVICE = torch.device(os.environ.get("REST_LSP_TEST_DEVICE", "cpu"))


def tiny_model(arch: str, vocab_size: int = 97, seed: int = 0, max_positions: int = 512) -> LoadedModel:
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(arch)
    model.eval().to(TEST_DEVICE)
    return LoadedModel(model=model, tokenizer=None, device=TEST_DEVICE, dtype=torch.float32, name=arch)


def tiny_folder(path: Path) -> Path:
    """A one-layer random Llama and a word-level tokenizer saved as a local model folder."""
    from tokenizers import Tokenizer as RawTokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=64)).save_pretrained(path)
    raw = RawTokenizer(models.WordLevel({f"w{i}": i for i in range(31)} | {"[UNK]": 31}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="w0", unk_token="[UNK]").save_pretrained(path)
    return path


class Said:
    """The service's events as a list: (level, text) of every message; indexing progress ignored."""

    def __init__(self):
        self.messages = []

    def message(self, level, text):
        self.messages.append((level, text))

    def index_begin(self, root):
        pass

    def index_progress(self, root, done, total):
        pass

    def index_end(self, root, stats):
        pass


def cache_with_kernels(folder: Path) -> Path:
    """`folder` as a fresh rest-lsp cache root for a server or CLI of one test's own, holding only the native kernels
    this session has built (built now if not yet): a fresh cache would compile them again at every start (half a
    minute and more on a slow CPU), and nothing a test of the server checks depends on compiling them. The loader
    checks the copies (owner, modes, recorded hash) as it checks any library it finds. Kernels already there are
    left as they are (a running server may have them mapped)."""
    import shutil

    from rest_lsp.kernels import levels, loader, panel_matmul, quant_matmul, row_attention, step_ops

    session = loader.kernel_folder()  # the session's own cache in this process (conftest.py)
    level = levels.chosen()
    for kernel in (panel_matmul.KERNEL, quant_matmul.KERNEL, row_attention.KERNEL, step_ops.KERNEL):
        if not any(session.glob(f"{kernel.stem}-{level}-*.so")):
            kernel._load(level, session)  # built where the session's own steps find it
    folder.mkdir(parents=True, exist_ok=True)
    if session.is_dir() and not (folder / "kernels").exists():
        shutil.copytree(session, folder / "kernels")  # modes kept: 700 and 600
    return folder
