"""Acceptance notes a log-probability for every committed token, the target's own included."""

from __future__ import annotations

from ds4mlx.engine.sampling import Sampler, SamplingOptions
from ds4mlx.speculation.acceptance import accept

import mlx.core as mx
import pytest


@pytest.mark.parametrize(
    "draft, accepted, committed", [([1, 2], 2, [1, 2, 3]), ([1, 0], 1, [1, 2])]
)
def test_each_committed_token_has_a_log_probability_in_order(draft, accepted, committed):
    sampler = Sampler(SamplingOptions(logprobs=0))
    logits = mx.log(mx.array([[0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.6, 0.2], [0.1, 0.1, 0.2, 0.6]]))
    verdict = accept(logits, draft, sampler)
    assert (verdict.accepted, verdict.next_token) == (accepted, committed[-1])
    noted = [sampler.take_logprob() for _ in committed]
    assert [n.token for n in noted] == committed
    assert noted[0].logprob == pytest.approx(float(mx.log(mx.array(0.7))))
    assert sampler.take_logprob() is None
