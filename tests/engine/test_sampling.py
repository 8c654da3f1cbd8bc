"""Sampling, with REST or without, must draw from exactly the model's (temperature, top-p) distribution.

A small-vocabulary model makes the exact distribution of a 3-token continuation computable (5^3 outcomes). The
samples of a fixed seed are judged by one test, `judge`: an outcome of probability 0 must never be drawn, and a
chi-square test over the others must not reject. The same test is shown to reject deliberately broken samplers
(temperature ignored, top-p off by one token, a greedy fallback at draft nodes), so it can fail.
"""

import itertools
import random

import pytest
import torch

from rest_lsp.engine.decoding import DecodeConfig, Decoder
from rest_lsp.drafting.drafts import NgramDrafts, NoDrafts

from support import tiny_model

VOCAB, LENGTH = 5, 3
RUNS = 2500  # REST, the claim itself
PLAIN_RUNS = 1200  # the plain path
# A broken sampler is rejected with far fewer samples (by a factor of 4 to 50 over the threshold), and more
# samples only make a rejection surer: fewer keep the suite short.
BROKEN_RUNS = 600
PROMPT = [1, 3, 0, 2]


def chi2_quantile_999(df: int) -> float:
    # Wilson-Hilferty approximation of the 0.999 quantile (z = 3.0902); within 1% for df >= 10
    z = 3.0902
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def reference_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p written the plain way: keep the most likely tokens until their mass reaches top_p."""
    order = sorted(range(len(probs)), key=lambda i: -float(probs[i]))
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += float(probs[i])
        if mass >= top_p:
            break
    out = torch.zeros_like(probs)
    out[kept] = probs[kept]
    return out / out.sum()


@torch.inference_mode()
def exact_distribution(loaded, temperature, top_p):
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        ids = torch.tensor([PROMPT + list(seq)])
        logits = loaded.model(ids).logits[0, len(PROMPT) - 1 : -1].float()  # [LENGTH, V]
        p = 1.0
        for k, t in enumerate(seq):
            probs = reference_filter(torch.softmax(logits[k] / temperature, -1), top_p)
            p *= float(probs[t])
        dist[seq] = p
    return dist


def chi_square(counts, dist, runs):
    """Over the outcomes of positive probability; cells expected below 5 are pooled, as the test requires."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for seq, p in dist.items():
        if p == 0:
            continue  # judged apart: a single draw of one is a failure
        exp, obs = p * runs, counts.get(seq, 0)
        if exp < 5:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
            continue
        stat += (obs - exp) ** 2 / exp
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    return stat, cells - 1


def judge(counts, dist, runs) -> list[str]:
    """Why the samples are not draws from `dist` (empty: no evidence against it)."""
    reasons = []
    impossible = {seq: n for seq, n in counts.items() if dist.get(seq, 0.0) == 0}
    if impossible:
        reasons.append(f"{sum(impossible.values())} draws of outcomes of probability 0, e.g. {next(iter(impossible))}")
    stat, df = chi_square(counts, dist, runs)
    assert df >= 10, f"too few cells for the chi-square test ({df + 1}): the test would have no power"
    if stat >= chi2_quantile_999(df):
        reasons.append(f"chi-square {stat:.1f} >= {chi2_quantile_999(df):.1f} (df {df})")
    return reasons


@pytest.fixture(scope="module")
def peaky():
    loaded = tiny_model("llama", vocab_size=VOCAB, seed=3)
    with torch.no_grad():
        loaded.model.lm_head.weight.mul_(6.0)  # a sharper distribution: some outcomes likely, some rare
    return loaded


@pytest.fixture(scope="module")
def branchy():
    rnd = random.Random(0)
    # every continuation of every short context, so trees have many siblings on each level
    return NgramDrafts([[rnd.randrange(VOCAB) for _ in range(400)] for _ in range(5)])


def sample(decoder, drafts, temperature, top_p, runs, budget=8):
    """`runs` seeded draws of LENGTH tokens: (counts per outcome, drafts accepted in all)."""
    counts, accepted_drafts = {}, 0
    for run in range(runs):
        result = decoder.generate(
            PROMPT,
            drafts,
            # whole trees, never cut by the cost curve: siblings on every level are what this test is about
            DecodeConfig(max_new_tokens=LENGTH, temperature=temperature, top_p=top_p, budget=budget, seed=run,
                         fit_to_cost=False),
        )
        counts[tuple(result.tokens)] = counts.get(tuple(result.tokens), 0) + 1
        accepted_drafts += len(result.tokens) - result.steps
    return counts, accepted_drafts


@pytest.mark.parametrize("temperature, top_p", [(1.0, 0.8), (0.7, 0.9)])
def test_rest_sampling_matches_exact_distribution(peaky, branchy, temperature, top_p):
    counts, accepted_drafts = sample(Decoder(peaky), branchy, temperature, top_p, RUNS)
    assert accepted_drafts > RUNS // 4  # drafts were really accepted, not just the model's own tokens
    dist = exact_distribution(peaky, temperature, top_p)
    if top_p < 1.0:
        assert sum(p == 0 for p in dist.values()) >= 10, "top-p cuts nothing here: pick another top_p"
    assert judge(counts, dist, RUNS) == []

    # the test has power: the same samples against a slightly different distribution are rejected
    assert judge(counts, exact_distribution(peaky, temperature * 1.3, top_p), RUNS)


def test_plain_sampling_matches_exact_distribution(peaky):
    # the --no-rest path: empty trees, one model draw per step
    counts, accepted_drafts = sample(Decoder(peaky), NoDrafts(), 0.7, 0.9, PLAIN_RUNS, budget=0)
    assert accepted_drafts == 0
    assert judge(counts, exact_distribution(peaky, 0.7, 0.9), PLAIN_RUNS) == []


# -- deliberately broken samplers: the same test must reject each -------------------------------------------------


class TemperatureIgnored(Decoder):
    def _choose(self, logits, config, gen):
        return super()._choose(logits, DecodeConfig(temperature=1.0 if config.temperature > 0 else 0.0,
                                                    top_p=config.top_p), gen)


class TopPOneTokenShort(Decoder):
    """Drops the token whose mass crosses top_p (keeps one token fewer than the smallest prefix reaching it)."""

    def _choose(self, logits, config, gen):
        probs = torch.softmax(logits / config.temperature, dim=-1)
        sorted_p, order = torch.sort(probs, descending=True)
        drop = torch.cumsum(sorted_p, dim=-1) >= config.top_p
        drop[0] = False
        sorted_p[drop] = 0.0
        return int(torch.multinomial(torch.zeros_like(probs).scatter_(0, order, sorted_p), 1, generator=gen))


class TopPOneTokenOver(Decoder):
    """Keeps one token more than the smallest prefix reaching top_p."""

    def _choose(self, logits, config, gen):
        probs = torch.softmax(logits / config.temperature, dim=-1)
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop = torch.cat([torch.tensor([False]), cum[:-1] >= config.top_p])  # shifted by one
        sorted_p[drop] = 0.0
        return int(torch.multinomial(torch.zeros_like(probs).scatter_(0, order, sorted_p), 1, generator=gen))


class GreedyAtDrafts(Decoder):
    """Takes the argmax wherever a draft could continue (a 'verify greedily' shortcut), samples elsewhere."""

    def accept(self, tree, logits_at, config, gen):
        kids = tree.children()
        node, path, new = 0, [0], []
        while True:
            greedy = DecodeConfig(temperature=0.0) if kids[node] else config
            token = self._choose(logits_at(node), greedy, gen)
            new.append(token)
            child = kids[node].get(token)
            if child is None:
                return new, path
            node = child
            path.append(node)


@pytest.mark.parametrize(
    "broken, temperature, top_p, rest",
    [
        (TemperatureIgnored, 0.7, 1.0, False),
        (TopPOneTokenShort, 1.0, 0.8, False),
        (TopPOneTokenOver, 1.0, 0.8, False),
        (GreedyAtDrafts, 0.7, 0.9, True),
    ],
    ids=["temperature-ignored", "top-p-one-short", "top-p-one-over", "greedy-at-drafts"],
)
def test_broken_samplers_are_rejected(peaky, branchy, broken, temperature, top_p, rest):
    drafts, budget = (branchy, 8) if rest else (NoDrafts(), 0)
    counts, _ = sample(broken(peaky), drafts, temperature, top_p, BROKEN_RUNS, budget=budget)
    reasons = judge(counts, exact_distribution(peaky, temperature, top_p), BROKEN_RUNS)
    assert reasons, f"{broken.__name__} passed the test"
