"""`rest-lsp generate` as a plain function: text in, text and decoding statistics out."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.errors import UserError
from rest_lsp.drafting.acceptance import AcceptanceModel, table_location
from rest_lsp.drafting.drafts import DraftSource, NoDrafts, SuccessorTable, rest_drafts
from rest_lsp.engine.model import LoadedModel, cache_root, load_model

log = logging.getLogger(__name__)


def default_budget(loaded: LoadedModel) -> int:
    # A GPU verifies 64 tokens for about the price of one; a CPU pays more per token (engine/runmode.py, PACKINGS).
    return 64 if loaded.device.type == "cuda" else 16


@dataclass
class GenerateRequest:
    prompt: str
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    workspace: Path | None = None
    rest: bool = True
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    budget: int | None = None


def workspace_drafts(root: Path, loaded: LoadedModel) -> DraftSource:
    """The persistent workspace index of `root`, built or brought up to date."""
    from rest_lsp.datastore import Datastore, WorkspaceIndex

    store = Datastore()
    tok = loaded.tokenizer
    WorkspaceIndex(root, store, tok.encode_batch, tok.key).build()
    return store


def fit_prompt(ids: list[int], room: int) -> tuple[list[int], bool]:
    """Keep the tail of a prompt that does not fit: the end is what the model continues."""
    return (ids[-room:], True) if len(ids) > room else (ids, False)


def run_generate(request: GenerateRequest, warn: Callable[[str], None]) -> dict:
    loaded = load_model(request.model, request.device, request.dtype)
    tok = loaded.tokenizer
    budget = default_budget(loaded) if request.budget is None else request.budget
    if not request.rest:
        budget = 0
    ids = tok.encode(request.prompt)
    room = loaded.max_context - request.max_new_tokens - budget - 1
    if room < 1:
        raise UserError(f"--max-new-tokens {request.max_new_tokens} leaves no room for a prompt in the model's "
                         f"context of {loaded.max_context} tokens.")
    ids, cut = fit_prompt(ids, room)
    if cut:
        warn(f"the prompt is longer than the model's context allows; keeping its last {room} tokens.")

    drafts: DraftSource = NoDrafts()
    if request.rest:
        workspace = workspace_drafts(request.workspace, loaded) if request.workspace is not None else None
        drafts = rest_drafts(workspace, recycle=SuccessorTable())

    config = DecodeConfig(
        max_new_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        budget=budget,
        seed=request.seed,
    )
    # what this model accepted before, saved beside the index: later runs start from it
    table, key = table_location(cache_root(), loaded.name, str(loaded.dtype), loaded.device.type)
    decoder = Decoder(loaded, AcceptanceModel.load(table, key))
    if request.rest:
        try:
            decoder.calibrate()  # this machine's step-cost curve: measured once, then read from the cache
        except Exception as err:  # noqa: BLE001 - a model too small to time (short context): the built-in curve
            log.info("no step-cost measurement (%s); tree sizes follow the built-in curve", err)
    result = decoder.generate(ids, drafts, config)
    if request.rest:
        try:
            decoder.acceptance.save(table, key)
        except OSError as err:
            warn(f"could not save what REST learned ({err}); the next run starts afresh.")
    return {
        "text": tok.decode(result.tokens),
        "token_ids": result.tokens,
        "new_tokens": len(result.tokens),
        "prompt_tokens": len(ids),
        "steps": result.steps,
        "tokens_per_step": round(result.tokens_per_step, 3),
        "prefill_ms": round(result.prefill_ms, 1),
        "decode_ms": round(result.decode_ms, 1),
        "ms_per_token": round(result.ms_per_token, 2),
        "mode": "rest" if request.rest else "ar",
        "finish": result.finish,
        "budget": budget,
        "model": loaded.name,
        "device": str(loaded.device),
        "dtype": decoder.mode,
    }
