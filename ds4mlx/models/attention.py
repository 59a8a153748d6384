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
    if mx.default_device() == mx.cpu:
        return _sink_attention_cpu(q, kv, mask, sinks, scale)
    k = kv[None, None]
    out = mx.fast.scaled_dot_product_attention(
        mx.swapaxes(q, 0, 1)[None], k, k, scale=scale, mask=mask[None, None], sinks=sinks
    )
    return mx.swapaxes(out[0], 0, 1)


@mx.compile
def _sink_attention_cpu(
    q: mx.array, kv: mx.array, mask: mx.array, sinks: mx.array, scale: float
) -> mx.array:
    """``sink_attention`` as the CPU computes it best. On the CPU ``mx.fast``'s attention is a
    composed fallback of 27 primitives, most of them reshaping its [B, H, T, D] layout; with
    one shared key/value head the scores are a single [T, H, D] x [D, N] product and the sink
    one more softmax column: fourteen primitives compiled, with the same products and the same
    precise softmax."""
    scores = mx.where(mask[:, None, :], (q @ kv.T) * scale, -mx.inf)  # [T, H, N]
    sink = mx.broadcast_to(sinks.astype(scores.dtype)[None, :, None], (*scores.shape[:2], 1))
    probs = mx.softmax(mx.concatenate([scores, sink], axis=-1), axis=-1, precise=True)
    return probs[..., :-1] @ kv
