"""Token sampling: temperature, top-k, top-p, min-p built from mlx-lm's sampler pieces.

The filtered distribution is exposed (``probabilities``) because exact speculative acceptance
needs the very distribution that ordinary sampling draws from.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, categorical_sampling


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
    """Draws tokens from rows of logits; seeded once so that runs are reproducible.

    Filters apply to the untempered log-probabilities in mlx-lm's order (top-p, min-p, top-k),
    then the temperature scales what is left.
    """

    def __init__(self, options: SamplingOptions):
        self.options = options
        # A seeded sampler draws from its own key, so that its tokens do not depend on other
        # generations drawing in between (batched sessions interleave). The global seed still
        # makes speculative acceptance, which draws from the global generator, reproducible.
        self._key: mx.array | None = None
        if options.seed is not None:
            mx.random.seed(options.seed)
            self._key = mx.random.key(options.seed)

    def filtered_logprobs(self, logits: mx.array) -> mx.array:
        """Log-probabilities [..., vocab] with filtered-out tokens at -inf (untempered)."""
        logits = logits.astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        o = self.options
        if 0.0 < o.top_p < 1.0:
            logprobs = apply_top_p(logprobs, o.top_p)
        if o.min_p > 0.0:
            logprobs = apply_min_p(logprobs, o.min_p)
        if o.top_k > 0:
            logprobs = apply_top_k(logprobs, o.top_k)
        return logprobs

    def probabilities(self, logits: mx.array) -> mx.array:
        """The distribution ``__call__`` samples from (point mass on the argmax when greedy)."""
        if self.options.greedy:
            best = mx.argmax(logits, axis=-1, keepdims=True)
            return mx.put_along_axis(mx.zeros(logits.shape), best, mx.array(1.0), axis=-1)
        return mx.softmax(self.filtered_logprobs(logits) / self.options.temperature, axis=-1)

    def __call__(self, logits: mx.array) -> int:
        """One token from a single row of logits [vocab]."""
        if self.options.greedy:
            return int(mx.argmax(logits))
        row = self.filtered_logprobs(logits[None])
        if self._key is None:
            return int(categorical_sampling(row, self.options.temperature)[0])
        self._key, key = mx.random.split(self._key)
        return int(mx.random.categorical(row * (1 / self.options.temperature), key=key)[0])
