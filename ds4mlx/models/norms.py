"""RMS normalisation as llama.cpp's ``ggml_rms_norm`` (+ optional weight) computes it."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


def rms_norm(x: mx.array, weight: mx.array | None, eps: float) -> mx.array:
    """x / sqrt(mean(x^2) + eps) over the last axis, times ``weight`` when given."""
    return mx.fast.rms_norm(x, weight, eps)


class RMSNorm(nn.Module):
    """A weighted RMS norm whose weight comes from a GGUF tensor."""

    def __init__(self, weight: mx.array, eps: float):
        super().__init__()
        self.weight = weight
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return rms_norm(x, self.weight, self.eps)
