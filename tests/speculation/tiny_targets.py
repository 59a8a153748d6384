"""Random-weight deepseek4 targets small enough for drafter tests (written as GGUF files)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import ds4mlx
from ds4mlx.models.deepseek4 import ModelArgs, tensor_shapes
from ds4mlx.models.moe import GatingFunc
from ds4mlx.speculation.support_gguf import random_arrays, write_support_gguf

import numpy as np

LAYERS = 3
CONTEXT = 256
TINY = ModelArgs(
    vocab_size=96,
    hidden_size=64,
    num_layers=LAYERS,
    num_heads=2,
    head_dim=32,
    rope_dims=16,
    q_lora_rank=32,
    o_groups=2,
    o_lora_rank=16,
    sliding_window=16,
    compress_ratios=(0, 4, 128),
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    rope_scaling_type="none",
    rope_freq_scale=1.0,
    rope_orig_ctx=CONTEXT,
    n_experts=4,
    n_experts_used=2,
    n_shared_experts=1,
    expert_ff=32,
    expert_weights_scale=1.5,
    expert_weights_norm=True,
    gating_func=GatingFunc.SQRT_SOFTPLUS,
    swiglu_limits=(10.0,) * LAYERS,
    swiglu_limits_shared=(10.0,) * LAYERS,
    n_hash_layers=0,
    index_heads=2,
    index_head_dim=32,
    index_topk=4,
    hc_mult=4,
    hc_sinkhorn_iters=3,
    hc_eps=1e-6,
)


def write_target(
    path: Path, seed: int, extra: dict[str, np.ndarray] | None = None, nextn: bool = False
):
    """A random TINY target at ``path``, loaded. ``extra`` tensors join the file; ``nextn``
    declares one MTP block after the main layers (its tensors must be in ``extra``)."""
    arrays = random_arrays(tensor_shapes(TINY), np.random.default_rng(seed)) | (extra or {})
    if nextn:
        limits = TINY.swiglu_limits + (10.0,)
        args = replace(
            TINY,
            num_layers=LAYERS + 1,
            compress_ratios=TINY.compress_ratios + (0,),
            swiglu_limits=limits,
            swiglu_limits_shared=limits,
        )
        metadata = args.to_gguf_metadata(CONTEXT) | {"deepseek4.nextn_predict_layers": 1}
    else:
        metadata = TINY.to_gguf_metadata(CONTEXT)
    write_support_gguf(path, "deepseek4", metadata, arrays)
    return ds4mlx.load_model(path)
