"""RMS normalisation as llama.cpp's ``ggml_rms_norm`` (+ optional weight) computes it."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from ds4mlx import kernels

import mlx.core as mx
import mlx.nn as nn


def rms_norm(x: mx.array, weight: mx.array | None, eps: float) -> mx.array:
    """x / sqrt(mean(x^2) + eps) over the last axis, times ``weight`` when given: one native
    primitive on the CPU (``kernels.rms_norm``), else ``mx.fast.rms_norm``."""
    native = kernels.rms_norm(x, weight, eps)
    if native is not None:
        return native
    if weight is None:
        return _compiled_rms_norm(eps)(x)
    return _compiled_weighted_rms_norm(eps)(x, weight)


# Without the native primitive, on the CPU ``mx.fast.rms_norm`` is eleven primitives (square,
# sum, then one op per broadcast and arithmetic step); compiled, the steps after the sum fuse
# into one kernel: three. On Metal it is one primitive either way. The ops and their order are
# unchanged.
@cache
def _compiled_rms_norm(eps: float) -> Callable[[mx.array], mx.array]:
    return mx.compile(lambda x: mx.fast.rms_norm(x, None, eps))


@cache
def _compiled_weighted_rms_norm(eps: float) -> Callable[[mx.array, mx.array], mx.array]:
    return mx.compile(lambda x, weight: mx.fast.rms_norm(x, weight, eps))


class RMSNorm(nn.Module):
    """A weighted RMS norm whose weight comes from a GGUF tensor."""

    def __init__(self, weight: mx.array, eps: float):
        super().__init__()
        self.weight = weight
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return rms_norm(x, self.weight, self.eps)
