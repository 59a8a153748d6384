"""Attention primitives shared by the model files."""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def sliding_window_mask(q_pos: np.ndarray, k_pos: np.ndarray, window: int) -> np.ndarray:
    """Causal sliding window (llama.cpp LLAMA_SWA_TYPE_STANDARD): query p sees key k iff
    ``p - window < k <= p``. Returns bool [len(q_pos), len(k_pos)]."""
    diff = q_pos[:, None] - k_pos[None, :]
    return (diff >= 0) & (diff < window)


def sink_attention(
    q: mx.array, kv: mx.array, mask: mx.array, sinks: mx.array, scale: float
) -> mx.array:
    """Multi-query attention whose single key head is also the value head.

    q [T, H, D], kv [N, D], mask bool [T, N], sinks [H]: each head's sink logit (not scaled)
    joins the softmax denominator only. Returns [T, H, D].
    """
    k = kv[None, None]
    out = mx.fast.scaled_dot_product_attention(
        mx.swapaxes(q, 0, 1)[None], k, k, scale=scale, mask=mask[None, None], sinks=sinks
    )
    return mx.swapaxes(out[0], 0, 1)
