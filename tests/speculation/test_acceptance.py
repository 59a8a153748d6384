"""Acceptance rules: greedy prefix, exact rejection sampling (distribution-preserving), and the
documented bias of opportunistic acceptance."""

from __future__ import annotations

from ds4mlx.engine.sampling import Sampler, SamplingOptions
from ds4mlx.speculation.acceptance import AcceptanceMode, accept, exact_acceptance

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

DRAWS = 100_000


def exact_draws(probs: mx.array, draft: int, seed: int) -> np.ndarray:
    """Output tokens of DRAWS independent exact-acceptance steps on the same row."""
    mx.random.seed(seed)
    rows = mx.broadcast_to(probs[None], (DRAWS, probs.shape[0]))
    accepted, replacement = exact_acceptance(rows, mx.full((DRAWS,), draft, dtype=mx.int32))
    return np.array(mx.where(accepted, draft, replacement))


def assert_matches(draws: np.ndarray, probs: np.ndarray) -> None:
    support = probs > 0
    assert np.all(np.isin(draws, np.flatnonzero(support))), "drew a token of probability 0"
    observed = np.bincount(draws, minlength=len(probs))[support]
    support_probs = probs[support].astype(np.float64)
    expected = support_probs / support_probs.sum() * len(draws)
    assert chisquare(observed, expected).pvalue > 0.001


@pytest.mark.parametrize("draft", [0, 3, 7])
def test_exact_acceptance_preserves_a_fixed_distribution(draft):
    probs = np.array([0.4, 0.2, 0.1, 0.1, 0.08, 0.07, 0.05, 0.0], dtype=np.float32)
    assert_matches(exact_draws(mx.array(probs), draft, seed=draft), probs)


def test_exact_acceptance_preserves_real_model_sampling(ds4_model):
    logits = mx.array(ds4_model.logits([115, 78, 104, 2, 65])[-1])
    sampler = Sampler(SamplingOptions(temperature=0.9, top_p=0.95, top_k=40, min_p=0.01))
    probs = sampler.probabilities(logits[None])[0]
    draft = int(mx.argmax(logits))
    draws = exact_draws(probs, draft, seed=1)
    assert_matches(draws, np.array(probs))
    # And ordinary sampling from the same options draws from the same distribution.
    mx.random.seed(2)
    ordinary = np.array(
        mx.random.categorical(
            sampler.filtered_logprobs(mx.broadcast_to(logits[None], (DRAWS, logits.shape[0])))
            / sampler.options.temperature
        )
    )
    assert_matches(ordinary, np.array(probs))


def test_accept_exact_mode_end_to_end():
    # Row 0 puts 0.7 on the draft token 2: about 70% of the verifies accept it.
    logits = mx.log(mx.array([[0.1, 0.2, 0.7], [0.3, 0.3, 0.4]]))
    sampler = Sampler(SamplingOptions(temperature=1.0, seed=3))
    outcomes = [accept(logits, [2], sampler, AcceptanceMode.EXACT) for _ in range(2000)]
    accepted = sum(v.accepted for v in outcomes) / len(outcomes)
    assert 0.66 < accepted < 0.74
    rejected_tokens = {v.next_token for v in outcomes if v.accepted == 0}
    assert rejected_tokens <= {0, 1}  # never the rejected draft itself


def test_greedy_accepts_the_longest_matching_prefix():
    logits = mx.array(np.eye(6, dtype=np.float32)[[1, 2, 5, 4]])  # argmax: 1, 2, 5, 4
    sampler = Sampler(SamplingOptions())
    verdict = accept(logits, [1, 2, 3], sampler)
    assert (verdict.accepted, verdict.next_token) == (2, 5)
    verdict = accept(logits, [1, 2, 5], sampler)
    assert (verdict.accepted, verdict.next_token) == (3, 4)  # bonus token
    verdict = accept(logits, [0, 2, 5], sampler)
    assert (verdict.accepted, verdict.next_token) == (0, 1)
    with pytest.raises(ValueError):
        accept(logits, [1], sampler)


def test_opportunistic_bias_is_towards_greedy():
    # The greedy draft is always accepted (probability 1 instead of p(greedy) = 0.5) ...
    logits = mx.log(mx.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    sampler = Sampler(SamplingOptions(temperature=1.0, seed=4))
    assert all(accept(logits, [0], sampler).accepted == 1 for _ in range(200))
    # ... while a non-greedy draft is never accepted: the row is sampled normally instead.
    tokens = [accept(logits, [1], sampler) for _ in range(3000)]
    assert all(v.accepted == 0 for v in tokens)
    counts = np.bincount([v.next_token for v in tokens], minlength=3)
    assert chisquare(counts, np.array([0.5, 0.3, 0.2]) * len(tokens)).pvalue > 0.001
