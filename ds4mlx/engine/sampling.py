"""Token sampling: temperature, top-k, top-p, min-p on top of mlx-lm's samplers."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import make_sampler


@dataclass(frozen=True)
class SamplingOptions:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Draws one token from a row of logits; seeded once so that runs are reproducible."""

    def __init__(self, options: SamplingOptions):
        self.options = options
        self._draw = make_sampler(
            temp=options.temperature,
            top_p=options.top_p if options.top_p < 1.0 else 0.0,
            min_p=options.min_p,
            top_k=options.top_k,
        )
        if options.seed is not None:
            mx.random.seed(options.seed)

    def __call__(self, logits: mx.array) -> int:
        logits = logits.astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return int(self._draw(logprobs[None])[0])
