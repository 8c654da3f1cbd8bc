"""The server's limits on what one completion may cost: an editor's settings may ask for less, never for more.

`rest-lsp serve` sets them (--max-new-tokens, --completion-ms, --kv-cache-mb); each workspace's settings are
clamped to them whenever the editor sends its own, and the decoder ends any completion that reaches the time limit
(shared_model.LockedDecoder), so no editor's settings hold a replica's decoder longer than that for the others.
"""

from __future__ import annotations

import dataclasses

from rest_lsp.settings import Settings

MAX_NEW_TOKENS = 64  # the language server's own default
COMPLETION_MS = 2000
KV_CACHE_MB = 256  # the language server's own default documentCacheMb


@dataclasses.dataclass(frozen=True)
class Limits:
    max_new_tokens: int = MAX_NEW_TOKENS
    completion_ms: int = COMPLETION_MS  # one completion's decoding, from the moment it holds the decoder
    kv_cache_mb: int = KV_CACHE_MB  # KV caches of recently used documents a replica keeps

    def clamp(self, settings: Settings) -> Settings:
        """`settings` with every cost-bearing value at most the server's (a 0 that means "no limit" becomes it)."""
        return dataclasses.replace(
            settings, max_new_tokens=min(settings.max_new_tokens, self.max_new_tokens),
            time_budget_ms=_at_most(settings.time_budget_ms, self.completion_ms, zero_is_none=True),
            wait_budget_ms=_at_most(settings.wait_budget_ms, self.completion_ms, zero_is_none=False),
            document_cache_mb=min(settings.document_cache_mb, self.kv_cache_mb))

    @property
    def completion_s(self) -> float:
        return self.completion_ms / 1e3


def _at_most(value: int, most: int, zero_is_none: bool) -> int:
    if value == 0:
        return most if zero_is_none else 0
    return min(value, most)
