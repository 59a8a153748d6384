"""The only place model code gets matmuls on stored weights from (Metal kernels or MLX twins)."""

from __future__ import annotations

import mlx.core as mx


def linear(x: mx.array, w: mx.array) -> mx.array:
    """x @ w.T for a weight stored GGUF-style as [out_features, in_features]."""
    return x @ w.T
