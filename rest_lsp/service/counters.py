"""The completion service's counters: one dataclass, each field a key of `rest-lsp.stats` with what it counts."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class ServiceCounters:
    """Running totals since the service started; a client measures an interval by differences.

    Decoding totals (generated_tokens .. draft_ms) count the decoding that requests waited for; prefetches put
    aside are left out, so that tokens/step and ms/token describe what a person waited for.
    """

    completions_served: int = 0  # answers given, from any source
    completions_decoded: int = 0  # answers decoded for their request
    type_through: int = 0  # answers that were the rest of the suggestion shown, after typed characters matched it
    cache_hits: int = 0  # answers from the suggestion cache
    prefetched: int = 0  # suggestions computed in full before they were asked for
    prefetch_hits: int = 0  # requests answered by a prefetch (done, or joined while it ran)
    prefetch_cancelled: int = 0  # prefetches stopped by a request elsewhere or an edit that cannot lead there
    guessed: int = 0  # suggestions computed in full at the last change, before any request
    cancelled: int = 0  # requests whose decoding was stopped (cancelled, superseded)
    generated_tokens: int = 0
    decode_steps: int = 0
    decode_ms: float = 0.0
    draft_ms: float = 0.0  # of decode_ms: retrieval and tree building
    last_latency_ms: float | None = None  # arrival to answer, of the last request answered
    prefill_tokens: int = 0  # prompt tokens computed for requests
    prewarm_tokens: int = 0  # prompt tokens computed ahead of requests while idle
    prewarm_chunks: int = 0

    def as_stats(self) -> dict:
        """The counters, and the two means derived from them, as `rest-lsp.stats` reports them."""
        out = asdict(self)
        out["mean_tokens_per_step"] = self.generated_tokens / self.decode_steps if self.decode_steps else None
        out["mean_ms_per_token"] = self.decode_ms / self.generated_tokens if self.generated_tokens else None
        return out
