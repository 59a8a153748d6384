"""Sampling parameters are inputs of the compiled sampler, not constants of it: a new
temperature, top-p, min-p or top-k reuses the graph compiled for the first (issue 36, item 2:
each new value cost seconds of compiling on a busy machine).

A compiled function runs its Python body only while it is traced, so the calls the body makes
to an MLX operation count its compilations."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ds4mlx.engine.sampling import Sampler, SamplingOptions

import mlx.core as mx
import numpy as np
import pytest

VOCAB = 97  # a shape of its own, so no other test has compiled for it
LOGITS = mx.array(np.random.default_rng(0).standard_normal(VOCAB).astype(np.float32))


@pytest.fixture
def traced(monkeypatch) -> Counter[str]:
    """How often ``mx.random.categorical`` and the filters' sorts ran on the host."""
    calls: Counter[str] = Counter()

    def counting(name: str, operation: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return operation(*args, **kwargs)

        return run

    monkeypatch.setattr(mx.random, "categorical", counting("draw", mx.random.categorical))
    monkeypatch.setattr(mx, "sort", counting("sort", mx.sort))
    monkeypatch.setattr(mx, "argsort", counting("argsort", mx.argsort))
    return calls


@pytest.mark.parametrize("seed", [None, 7], ids=["global-generator", "seeded"])
def test_ten_temperatures_compile_the_sampler_once(traced, seed):
    for i in range(10):
        options = SamplingOptions(
            temperature=0.7 + 0.013 * i,
            top_p=0.9 - 0.011 * i,
            min_p=0.01 + 0.003 * i,
            top_k=20 + i,
            seed=seed,
        )
        sampler = Sampler(options)
        for _ in range(2):
            assert 0 <= sampler(LOGITS) < VOCAB
            mx.eval(sampler.draw_on_device(LOGITS))
    assert traced["draw"] <= 1, traced
    assert traced["sort"] <= 1 and traced["argsort"] <= 1, traced
