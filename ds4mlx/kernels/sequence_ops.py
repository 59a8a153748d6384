"""The operations along the sequence: sparse attention and the lightning indexer's choice,
compressor pooling, bounded cache growth, rotary embeddings (with the norm before them), RMS
norm, and a KDA layer's recurrent decode tile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

from ds4mlx.kernels import dispatch, metal, metal_fused, twins
from ds4mlx.kernels.dispatch import in_inference, inference_ops, metal_kernels, native_cpu_ops
from ds4mlx.kernels.gradients import with_twin_gradient
from ds4mlx.kernels.native import native_ops

import mlx.core as mx


def sparse_attention(
    q: mx.array,
    window: mx.array,
    window_range: mx.array,
    comp: mx.array,
    comp_index: mx.array,
    sinks: mx.array,
    scale: float,
) -> mx.array:
    """Attention of each row over its window range and its selected compressed rows
    (``twins.sparse_attention`` says how). Each row's result depends on its own keys only."""
    if native_cpu_ops() is not None and q.dtype == mx.float32:
        if in_inference():
            return native_ops().sparse_attention(
                q, window, window_range, comp, comp_index, sinks, scale
            )
        return _native_sparse_attention(scale)(q, window, window_range, comp, comp_index, sinks)
    if in_inference() and metal_kernels() and metal.attention_head_dim_fits(q.shape[-1]):
        # No gradient is taken: the kernel without its twin-gradient wrapper (a primitive less).
        return metal._sparse_attention_kernel(
            q, window, window_range, comp, comp_index, sinks, scale
        )
    return dispatch.backend.sparse_attention(
        q, window, window_range, comp, comp_index, sinks, scale
    )


@cache
def _native_sparse_attention(scale: float) -> Callable[..., mx.array]:
    ops = native_ops()
    return mx.compile(
        with_twin_gradient(
            lambda q, w, r, c, i, s: ops.sparse_attention(q, w, r, c, i, s, scale),
            lambda q, w, r, c, i, s: twins.sparse_attention(q, w, r, c, i, s, scale),
            constants=(2, 4),
        )
    )


def indexer_top_k(
    q: mx.array,
    weights: mx.array,
    keys: mx.array,
    visible: mx.array,
    top_k: int,
    weight_scale: float = 1.0,
) -> mx.array:
    """The lightning indexer's top-k blocks for each row on its own (``twins.indexer_top_k``
    says how, of the head weights times ``weight_scale``): one native primitive on the CPU for
    the whole tile, in inference on the GPU two Metal launches for the whole tile (the scores,
    with the weights' scale inside, and the choice), a loop over rows else."""
    if in_inference() and metal_kernels() and keys.shape[0] >= top_k:
        return metal_fused.indexer_top_k(q, weights, keys, visible, top_k, weight_scale)
    weights = _scaled_by(weight_scale)(weights)
    if native_cpu_ops() is None or keys.dtype != mx.float32:
        return twins.indexer_top_k(q, weights, keys, visible, top_k)
    return native_ops().indexer_top_k(q, weights, keys, visible, top_k)


@cache
def _scaled_by(scale: float) -> Callable[[mx.array], mx.array]:
    # Compiled, a product with a constant is one primitive (eager, a Broadcast and a Multiply).
    return mx.compile(lambda x: x * scale)


def pool_blocks(
    kv: mx.array, score: mx.array, lo: int, n: int, ratio: int, dim: int, overlap: bool
) -> mx.array | None:
    """A compressor's softmax pooling of ``n`` completed blocks whose rows start at row ``lo``
    of kv and score [N, C] as one native primitive in inference on the CPU; None where that
    does not apply. ``models.compressed_attention.Compressor.pool`` computes the same with
    MLX ops (some twenty primitives). In inference on the GPU: one Metal launch
    (``metal/pool_blocks.metal``)."""
    if in_inference() and metal_kernels():
        return metal_fused.pool_blocks(kv, score, lo, n, ratio, dim, overlap)
    if inference_ops() is None or kv.dtype != mx.float32:
        return None
    return native_ops().pool_blocks(kv, score, lo, n, ratio, dim, overlap)


def rms_norm(x: mx.array, weight: mx.array | None, eps: float) -> mx.array | None:
    """``mx.fast.rms_norm`` (also its derivative) as one native primitive on the CPU; None
    where that does not apply (not on the CPU, x not float32)."""
    if x.dtype != mx.float32 or native_cpu_ops() is None:
        return None
    return native_ops().rms_norm(x, weight, eps)


def grow_rows(
    cached: Sequence[mx.array], new: Sequence[mx.array], take: int, keep: int
) -> list[mx.array]:
    """For each pair: the rows of ``cached[i]`` followed by the first ``take`` rows of
    ``new[i]``, of which the last ``keep`` (all if fewer): a cache growing by a chunk. One
    native primitive for all pairs in inference on the CPU, one Metal launch a pair on the GPU
    (``metal/grow_rows.metal``; two pairs of one shape, a compressor's pending rows, in one:
    ``metal/grow_row_pairs.metal``); MLX slices and concatenations (differentiable) else."""
    ops = inference_ops()
    if ops is not None and all(a.ndim == 2 and a.dtype == mx.float32 for a in (*cached, *new)):
        return ops.grow_rows(list(cached), list(new), take, keep)
    on_gpu = in_inference() and metal_kernels()
    if on_gpu and _one_shape_pairs(cached, new) and cached[0].shape[0]:
        return list(metal_fused.grow_row_pairs(tuple(cached), tuple(new), take, keep))
    out = []
    for old, fresh in zip(cached, new, strict=True):
        if on_gpu and old.shape[0] and min(old.shape[0] + take, keep):
            out.append(metal_fused.grow_rows(old, fresh, take, keep))
            continue
        full = mx.concatenate([old, fresh[:take]]) if old.shape[0] else fresh[:take]
        out.append(full[full.shape[0] - keep :] if full.shape[0] > keep else full)
    return out


def grow_scored_rows(
    cached: Sequence[mx.array],
    kv: mx.array,
    gate: mx.array,
    embedding: mx.array,
    take: int,
    keep: int,
) -> list[mx.array]:
    """``grow_rows(cached, [kv, gate + embedding], take, keep)``: a compressor's pending kv rows
    and gate scores grown by a chunk's, its scores the gate products plus their position
    embedding; in inference on the GPU the sum is made inside the growth's launch
    (``metal/grow_row_pairs.metal``), a launch less."""
    fresh = (kv, gate)
    on_gpu = in_inference() and metal_kernels()
    if on_gpu and _one_shape_pairs(cached, fresh) and cached[0].shape[0]:
        return list(metal_fused.grow_row_pairs(tuple(cached), fresh, take, keep, embedding))
    return grow_rows(cached, (kv, gate + embedding), take, keep)


def _one_shape_pairs(cached: Sequence[mx.array], new: Sequence[mx.array]) -> bool:
    """Whether ``grow_rows`` has two pairs whose caches, and whose new rows, share a shape."""
    return (
        len(cached) == 2
        and cached[0].shape == cached[1].shape
        and new[0].shape == new[1].shape
        and cached[0].dtype == cached[1].dtype
    )


def rotary(
    x: mx.array,
    cos: mx.array,
    sin: mx.array,
    offset: int,
    n_dims: int,
    interleaved: bool,
    inverse: bool,
    shape: tuple[int, ...] | None = None,
) -> mx.array | None:
    """``models.rope.RoPE.apply`` (its formula is the twin) as one native primitive on the CPU,
    or in inference on the GPU one Metal launch (``metal/rope.metal``; its result already in
    ``shape`` when given), from the angle tables cos/sin [T, n_dims / 2]
    (``RopeAngles.on_device``); None where that does not apply."""
    if in_inference() and metal_kernels():
        return metal_fused.rope(x, cos, sin, offset, n_dims, interleaved, inverse, shape)
    if x.dtype != mx.float32 or native_cpu_ops() is None:
        return None
    return native_ops().rope(x, cos, sin, offset, n_dims, interleaved, inverse)


def norm_rotary(
    x: mx.array,
    weight: mx.array | None,
    eps: float,
    cos: mx.array,
    sin: mx.array,
    offset: int,
    n_dims: int,
    interleaved: bool,
    heads: int | None = None,
) -> mx.array | None:
    """``models.rope.RoPE.apply_normed`` (an RMS norm, then ``rotary``) as one Metal launch in
    inference on the GPU (``metal/norm_rope.metal``); None elsewhere."""
    if not (in_inference() and metal_kernels()):
        return None
    return metal_fused.norm_rope(x, weight, eps, cos, sin, offset, n_dims, interleaved, heads)


# What a KDA layer's decode tile reads besides its rows (models import it from here).
KDAWeights = twins.KDAWeights


def kda_tile(
    w: KDAWeights,
    qkv: Sequence[mx.array],
    beta: mx.array,
    decay: mx.array,
    gate: mx.array,
    conv_rows: mx.array,
    states: mx.array,
    newest: mx.array,
    n_real: int,
) -> tuple[mx.array, mx.array, mx.array]:
    """A KDA decode tile between its input and output projections (``twins.kda_tile`` says
    what it computes): (output [T, H * D], kept conv rows, the real rows' new states; ``states`` is
    only read). One native primitive
    in inference on the CPU, one Metal launch in inference on the GPU
    (``metal/kda_tile.metal``), the twin's MLX ops else."""
    if in_inference() and metal_kernels() and metal_fused.kda_head_dim_fits(w.a, qkv[0]):
        return metal_fused.kda_tile(w, qkv, beta, decay, gate, conv_rows, states, newest, n_real)
    ops = inference_ops()
    if ops is None or qkv[0].dtype != mx.float32:
        return twins.kda_tile(w, qkv, beta, decay, gate, conv_rows, states, newest, n_real)
    out, rows, kept = ops.kda_tile(
        *qkv,
        beta,
        decay,
        gate,
        w.dt_bias,
        w.a,
        conv_rows,
        w.conv,
        states,
        w.norm_weight,
        newest,
        n_real,
        w.lower_bound,
        w.eps,
        w.keep_rows,
    )
    return out, rows, kept
