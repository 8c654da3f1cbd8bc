"""The model the completion service serves: what loading one produces, and the settings it can take.

A ServingModel is loaded whole in a background thread (weights, decoder, a second tokenizer for background work,
its FIM template and stop ids) and swapped in with one assignment, so a request always sees one consistent model.
The service keeps the previous model serving until the next one is ready, and keeps it when loading fails.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from rest_lsp.service.prompt import Fim, detect_fim
from rest_lsp.settings import Settings

log = logging.getLogger(__name__)

MIN_PROMPT_TOKENS = 16  # maxNewTokens and draftBudget must leave at least this much of the context to the prompt


@dataclass(frozen=True)
class ServingModel:
    loaded: object  # model.LoadedModel
    decoder: object  # decoding.Decoder: keeps its KV cache between requests
    background: object  # model.Tokenizer: a copy for indexing and buffers, so prompts never wait for them
    fim: Fim | None
    stop_ids: frozenset[int]
    # what REST learns about this model as it serves: its own recent outputs (drafts.OutputStore), its habits
    # (drafts.SuccessorTable), and how often it accepts each source's drafts (the decoder's acceptance table,
    # loaded from and saved to `acceptance_file`: (path, key))
    outputs: object
    recycle: object
    acceptance_file: tuple[Path, str]
    # the KV caches of recently used documents besides the decoder's own (document_caches.DocumentCaches)
    documents: object
    # what each token's text does to lines (drafts.TokenLines): where a one-line suggestion's drafts end
    lines: object

    def save_learned(self) -> None:
        """Save what the decoder learned as it served: its acceptance table and its step-cost curve; a failure
        costs only what was learned."""
        path, key = self.acceptance_file
        try:
            self.decoder.acceptance.save(path, key)
        except OSError as err:
            log.warning("rest-lsp: could not save the learned acceptance table %s: %s", path, err)
        self.decoder.save_learned()

    @property
    def tokenizer_key(self) -> str:
        return self.loaded.tokenizer.key

    @property
    def max_context(self) -> int:
        return self.decoder.max_context


def load_serving_model(settings: Settings) -> ServingModel:
    """Load the model the settings name (slow; raises ModelLoadError or whatever loading raised)."""
    from rest_lsp.drafting.acceptance import AcceptanceModel, table_location
    from rest_lsp.engine.decoding import Decoder
    from rest_lsp.service.document_caches import DocumentCaches
    from rest_lsp.drafting.drafts import OutputStore, SuccessorTable, TokenLines
    from rest_lsp.engine.model import Tokenizer, cache_root, load_model

    loaded = load_model(settings.model, settings.device, settings.dtype)
    cache_dir = Path(settings.cache_dir) if settings.cache_dir else cache_root()
    table = table_location(cache_dir, loaded.name, str(loaded.dtype), loaded.device.type)
    decoder = Decoder(loaded, AcceptanceModel.load(*table))
    # this machine's step-cost curve when one was measured here before (`rest-lsp generate`, bench_rest): reading
    # it is free, while measuring now would take the cores from the first requests
    decoder.calibrate(cache_dir, measure=False)
    background = Tokenizer(copy.deepcopy(loaded.tokenizer.hf))
    hf = loaded.tokenizer.hf
    fim = detect_fim(hf)
    special = {i for i, t in getattr(hf, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    fim_markers = {fim.prefix_id, fim.suffix_id, fim.middle_id} if fim else set()
    stop_ids = frozenset((special - fim_markers) | loaded.eos_token_ids | (fim.stop_ids if fim else set()))
    tokenizer = loaded.tokenizer
    return ServingModel(loaded, decoder, background, fim, stop_ids, OutputStore(), SuccessorTable(), table,
                        DocumentCaches(), TokenLines(lambda t: tokenizer.decode([t])))


def fits(settings: Settings, context: int) -> bool:
    return settings.max_new_tokens + settings.draft_budget + 1 + MIN_PROMPT_TOKENS <= context


def clamped(settings: Settings, context: int) -> Settings:
    """`settings` with maxNewTokens, then draftBudget, cut until a prompt fits the context."""
    budget = max(0, min(settings.draft_budget, context - 2 - MIN_PROMPT_TOKENS))
    new = max(1, min(settings.max_new_tokens, context - budget - 1 - MIN_PROMPT_TOKENS))
    return dataclasses.replace(settings, max_new_tokens=new, draft_budget=budget)


def fit_context(new: Settings, fallback: Settings, context: int) -> tuple[Settings, list[str]]:
    """`new`, or `new` with fallback's maxNewTokens and draftBudget (cut to fit) when its own leave no room for a
    prompt in `context` tokens, with the sentence that says so."""
    if fits(new, context):
        return new, []
    kept = fallback if fits(fallback, context) else clamped(fallback, context)
    text = (f"rest-lsp: maxNewTokens {new.max_new_tokens} with draftBudget {new.draft_budget} leaves no room for a "
            f"prompt in the model's context of {context} tokens; using maxNewTokens {kept.max_new_tokens} and "
            f"draftBudget {kept.draft_budget}.")
    return dataclasses.replace(new, max_new_tokens=kept.max_new_tokens, draft_budget=kept.draft_budget), [text]
