"""Sampling with REST must draw from exactly the distribution of plain sampling.

A small-vocabulary model makes the exact distribution of a 3-token continuation computable (5^3 outcomes); REST
samples with a fixed seed are compared with it by a chi-square test that can fail, and does fail when the
distribution is wrong.
"""

import itertools
import random

import pytest
import torch

from rest_lsp.decoding import DecodeConfig, Decoder
from rest_lsp.drafts import NgramDrafts

from conftest import tiny_model

VOCAB, LENGTH, RUNS = 5, 3, 2500
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
    # cells expected below 5 are pooled, as the test requires
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for seq, p in dist.items():
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


@pytest.fixture(scope="module")
def peaky():
    loaded = tiny_model("llama", vocab_size=VOCAB, seed=3)
    with torch.no_grad():
        loaded.model.lm_head.weight.mul_(6.0)  # a sharper distribution: some outcomes likely, some rare
    return loaded


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_rest_sampling_matches_exact_distribution(peaky, top_p):
    rnd = random.Random(0)
    # branchy drafts: every continuation of every short context, so trees have many siblings on each level
    drafts = NgramDrafts([[rnd.randrange(VOCAB) for _ in range(400)] for _ in range(5)])
    decoder = Decoder(peaky)
    counts, accepted_drafts = {}, 0
    for run in range(RUNS):
        result = decoder.generate(
            PROMPT,
            drafts,
            # whole trees, never cut by the cost curve: siblings on every level are what this test is about
            DecodeConfig(max_new_tokens=LENGTH, temperature=1.0, top_p=top_p, budget=8, seed=run, fit_to_cost=False),
        )
        counts[tuple(result.tokens)] = counts.get(tuple(result.tokens), 0) + 1
        accepted_drafts += len(result.tokens) - result.steps
    assert accepted_drafts > RUNS // 4  # drafts were really accepted, not just the model's own tokens

    stat, df = chi_square(counts, exact_distribution(peaky, 1.0, top_p), RUNS)
    assert df >= 10
    assert stat < chi2_quantile_999(df), (stat, df)

    # the test has power: the same samples against a slightly different distribution are rejected
    wrong, wrong_df = chi_square(counts, exact_distribution(peaky, 1.3, top_p), RUNS)
    assert wrong > chi2_quantile_999(wrong_df), (wrong, wrong_df)
