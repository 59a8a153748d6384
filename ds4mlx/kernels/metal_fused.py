"""The fused inference kernels of a Mac's decode tile, each one launch built with
``mx.fast.metal_kernel`` from its source in ``metal/`` (``kernels.metal`` holds the launch
helpers and the packed-weight backend they share a header scheme with).

``metal/hc_site.metal`` and ``metal/hc_expand.metal`` (a whole mHC site after its projection,
and the expansion after a block; ``metal/hc.metal`` is their header), ``metal/moe_route.metal``
and ``metal/moe_combine.metal`` (the MoE routing, and the weighted sum around the expert
launches), ``metal/rope.metal`` (rotary embeddings from host angle tables;
``metal/norm_rope.metal`` with the RMS norm before them), ``metal/hc_site_norm.metal`` (an mHC
site with the norm of its streams and of the block input it makes; ``metal/norm.metal`` is
their header), ``metal/pool_blocks.metal`` (a compressor's pooling of the blocks a chunk
completes), ``metal/grow_rows.metal`` (a bounded cache grown by a chunk;
``metal/grow_row_pairs.metal`` two of one shape), ``metal/indexer_scores.metal`` and
``metal/indexer_top_k.metal`` (the lightning indexer's block scores of a whole tile, and each
row's choice among them), ``metal/embed_streams.metal`` (a decode tile's token embeddings as
its mHC streams) and ``metal/kda_tile.metal`` (a GLM KDA layer's decode tile between its
projections). Semantics match ``kernels.twins`` (and ``models.rope``, ``models.moe`` for RoPE
and the routing); tests/kernels/metal_emulation.cpp runs and measures the sources without a Mac.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

from ds4mlx.kernels import twins
from ds4mlx.kernels.gradients import with_twin_gradient
from ds4mlx.kernels.metal import (
    MAX_THREADGROUP,
    SIMD_WIDTH,
    body_kernel,
    host_constant,
    host_ints,
)

import mlx.core as mx
import numpy as np


def hc_site(
    x: mx.array, mixes: mx.array, scale: mx.array, base: mx.array, hc: int, iters: int, eps: float
) -> tuple[mx.array, mx.array, mx.array]:
    """``twins.hc_site`` in one launch, differentiated through the twin."""
    return _hc_site_function(hc, iters, eps)(x, mixes, scale, base)


@cache
def _hc_site_function(hc: int, iters: int, eps: float):
    return with_twin_gradient(
        lambda x, m, s, b: hc_site_kernel(x, m, s, b, hc, iters, eps),
        lambda x, m, s, b: twins.hc_site(x, m, s, b, hc, iters, eps),
    )


def hc_site_kernel(
    x: mx.array, mixes: mx.array, scale: mx.array, base: mx.array, hc: int, iters: int, eps: float
) -> tuple[mx.array, mx.array, mx.array]:
    """(block input [T, D], post [T, hc], comb [T, hc, hc]) of streams x [T, hc, D] from their
    projected mixes [T, (2 + hc) * hc] (``metal/hc_site.metal``)."""
    tokens, _, dim = x.shape
    y, post, comb = body_kernel(
        "hc_site", ("x", "mixes", "scale", "base", "eps"), ("y", "post", "comb"), header="hc"
    )(
        inputs=[
            x,
            mixes.astype(mx.float32),
            scale.astype(mx.float32),
            base.astype(mx.float32),
            mx.array([eps], dtype=mx.float32),
        ],
        template=[("T_", x.dtype), ("HC", hc), ("D", dim), ("ITERS", iters)],
        grid=(dim, tokens, 1),
        threadgroup=(min(dim, MAX_THREADGROUP), 1, 1),
        output_shapes=[(tokens, dim), (tokens, hc), (tokens, hc, hc)],
        output_dtypes=[x.dtype, mx.float32, mx.float32],
    )
    return y, post, comb


def hc_expand(out: mx.array, residual: mx.array, post: mx.array, comb: mx.array) -> mx.array:
    """``twins.hc_expand`` in one launch, differentiated through the twin."""
    return _hc_expand_function()(out, residual, post, comb)


@cache
def _hc_expand_function():
    return with_twin_gradient(hc_expand_kernel, twins.hc_expand)


def hc_expand_kernel(
    out: mx.array, residual: mx.array, post: mx.array, comb: mx.array, flat: bool = False
) -> mx.array:
    """The streams [T, hc, D] after a block (``metal/hc_expand.metal``), or [T, hc * D] with
    ``flat`` (the same memory: the layout the next site's projection reads); the residual
    streams may come either way."""
    (tokens, dim), hc = out.shape, post.shape[-1]
    return body_kernel("hc_expand", ("out", "residual", "post", "comb"), ("streams",))(
        inputs=[
            out.astype(residual.dtype),
            residual,
            post.astype(mx.float32),
            comb.astype(mx.float32),
        ],
        template=[("T_", residual.dtype), ("HC", hc), ("D", dim)],
        grid=(dim, hc, tokens),
        threadgroup=(min(dim, MAX_THREADGROUP), 1, 1),
        output_shapes=[(tokens, hc * dim) if flat else (tokens, hc, dim)],
        output_dtypes=[residual.dtype],
    )[0]


def moe_route(
    logits: mx.array,
    bias: mx.array | None,
    hashed: mx.array | None,
    *,
    n_used: int,
    func: int,
    normalize: bool,
    scale: float,
    rows: int | None = None,
) -> tuple[mx.array, mx.array]:
    """Every row's chosen experts uint32 [R, k] (the expert launches' index type, so no
    conversion follows) and their weights float32 [R, k] from the router logits [T, E], of
    its first R = ``rows`` rows (all by default: the tile's real ones, which is all the expert
    launches and the sum read) (``metal/moe_route.metal``; ``models.moe.route`` is the twin)."""
    experts = logits.shape[1]
    tokens = logits.shape[0] if rows is None else rows
    indices, weights = body_kernel(
        "moe_route",
        ("logits", "bias", "hashed", "scale", "rows"),
        ("indices", "weights"),
        header="moe",
    )(
        inputs=[
            logits.astype(mx.float32),
            host_constant(0.0, mx.float32) if bias is None else bias.astype(mx.float32),
            host_constant(0, mx.int32) if hashed is None else hashed.astype(mx.int32),
            mx.array([scale], dtype=mx.float32),
            host_ints(tokens),
        ],
        template=[
            ("E", experts),
            ("K", n_used),
            ("FUNC", func),
            ("HAS_BIAS", int(bias is not None)),
            ("HASHED", int(hashed is not None)),
            ("NORMALIZE", int(normalize)),
        ],
        grid=(tokens, 1, 1),
        threadgroup=(min(tokens, MAX_THREADGROUP), 1, 1),
        output_shapes=[(tokens, n_used), (tokens, n_used)],
        output_dtypes=[mx.uint32, mx.float32],
    )
    return indices, weights


def moe_combine(expert_out: mx.array, weights: mx.array, shared: mx.array) -> mx.array:
    """``shared`` [T, D] plus, in its first R rows, the chosen experts' outputs [R, k, D] (or
    [R, k, 1, D], as ``pair_linear`` makes them) weighted by ``weights`` [T, k] and summed
    (``metal/moe_combine.metal``)."""
    tokens, dim = shared.shape
    return body_kernel("moe_combine", ("expert_out", "weights", "shared"))(
        inputs=[expert_out.astype(shared.dtype), weights.astype(mx.float32), shared],
        template=[("T_", shared.dtype), ("K", weights.shape[1]), ("D", dim)],
        grid=(dim, tokens, 1),
        threadgroup=(min(dim, MAX_THREADGROUP), 1, 1),
        output_shapes=[shared.shape],
        output_dtypes=[shared.dtype],
    )[0]


def _rope_template(
    dtype: mx.Dtype, dim: int, n_dims: int, offset: int, interleaved: bool
) -> list[tuple[str, object]]:
    """The template arguments ``metal/rope.metal`` and ``metal/norm_rope.metal`` share."""
    return [
        ("T_", dtype),
        ("D", dim),
        ("N", n_dims),
        ("OFFSET", offset),
        ("INTERLEAVED", int(interleaved)),
    ]


def rope(
    x: mx.array,
    cos: mx.array,
    sin: mx.array,
    offset: int,
    n_dims: int,
    interleaved: bool,
    inverse: bool,
    shape: tuple[int, ...] | None = None,
) -> mx.array:
    """``models.rope.RoPE.apply`` of x [T, D] or [T, M, D] (other ranks are reshaped to that)
    from its angle tables cos/sin [T, n_dims / 2] (``metal/rope.metal``); the result declared
    as ``shape`` when given (the same elements in the same order: the layout its reader takes,
    written by the launch rather than viewed after it)."""
    tokens, dim = x.shape[0], x.shape[-1]
    rows = x if x.ndim in (2, 3) else x.reshape(tokens, -1, dim)
    per_token = rows.shape[1] if rows.ndim == 3 else 1
    out = body_kernel("rope", ("x", "cosines", "sines"))(
        inputs=[rows, cos.astype(mx.float32), sin.astype(mx.float32)],
        template=[
            *_rope_template(x.dtype, dim, n_dims, offset, interleaved),
            ("INVERSE", int(inverse)),
        ],
        grid=(dim, per_token, tokens),
        threadgroup=(min(dim, MAX_THREADGROUP), 1, 1),
        output_shapes=[rows.shape if shape is None else shape],
        output_dtypes=[x.dtype],
    )[0]
    return out if rows is x or shape is not None else out.reshape(x.shape)


def _reduction_threads(width: int) -> int:
    """Threads of a kernel whose threadgroup reduces one row of ``width`` values (a norm's
    mean square): whole simdgroups, at most ``MAX_THREADGROUP``."""
    return min(MAX_THREADGROUP, -(-width // SIMD_WIDTH) * SIMD_WIDTH)


def hc_site_norm(
    x: mx.array,
    mixes: mx.array,
    scale: mx.array,
    base: mx.array,
    weight: mx.array,
    hc: int,
    iters: int,
    eps: float,
    norm_eps: float,
    out_eps: float,
    site: bool = True,
) -> tuple[mx.array, mx.array, mx.array]:
    """(normalised block input [T, D], post, comb) of streams x [T, hc, D] (or flat
    [T, hc * D]) from the projection of their raw flat rows (``metal/hc_site_norm.metal``;
    ``twins.hc_site_norm`` is the twin). ``site`` False: the head's collapse (mixes [T, hc],
    ``twins.hc_head_norm``), whose post and comb are not written (only y means anything)."""
    tokens, dim = x.shape[0], x.shape[-1] // (hc if x.ndim == 2 else 1)
    threads = _reduction_threads(dim)
    y, post, comb = body_kernel(
        "hc_site_norm",
        ("x", "mixes", "scale", "base", "weight", "eps"),
        ("y", "post", "comb"),
        header=("hc", "norm"),
    )(
        inputs=[
            x,
            mixes.astype(mx.float32),
            scale.astype(mx.float32),
            base.astype(mx.float32),
            weight.astype(mx.float32),
            mx.array([eps, norm_eps, out_eps], dtype=mx.float32),
        ],
        template=[
            ("T_", x.dtype),
            ("HC", hc),
            ("D", dim),
            ("ITERS", iters),
            ("THREADS", threads),
            ("SITE", int(site)),
        ],
        grid=(threads, tokens, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(tokens, dim), (tokens, hc), (tokens, hc, hc)],
        output_dtypes=[x.dtype, mx.float32, mx.float32],
    )
    return y, post, comb


def norm_rope(
    x: mx.array,
    weight: mx.array | None,
    eps: float,
    cos: mx.array,
    sin: mx.array,
    offset: int,
    n_dims: int,
    interleaved: bool,
    heads: int | None = None,
) -> mx.array:
    """``models.rope.RoPE.apply_normed``: the rows of x [T, D] or [T, M, D] (other ranks are
    reshaped to that), or x [T, heads * D] -> [T, heads, D] with ``heads`` (a product's heads
    read as they come), RMS-normalised (times ``weight``), then rotated from the angle tables
    cos/sin [T, n_dims / 2] (``metal/norm_rope.metal``)."""
    tokens = x.shape[0]
    dim = x.shape[-1] if heads is None else x.shape[-1] // heads
    rows = x if x.ndim in (2, 3) else x.reshape(tokens, -1, dim)
    per_token = rows.shape[1] if rows.ndim == 3 else rows.shape[1] // dim
    shape = rows.shape if heads is None else (tokens, heads, dim)
    threads = _reduction_threads(dim)
    out = body_kernel("norm_rope", ("x", "weight", "cosines", "sines", "eps"), header="norm")(
        inputs=[
            rows,
            host_constant(1.0, mx.float32) if weight is None else weight.astype(mx.float32),
            cos.astype(mx.float32),
            sin.astype(mx.float32),
            mx.array([eps], dtype=mx.float32),
        ],
        template=[
            *_rope_template(x.dtype, dim, n_dims, offset, interleaved),
            ("WEIGHTED", int(weight is not None)),
            ("THREADS", threads),
        ],
        grid=(threads, per_token, tokens),
        threadgroup=(threads, 1, 1),
        output_shapes=[shape],
        output_dtypes=[x.dtype],
    )[0]
    return out if rows is x or heads is not None else out.reshape(x.shape)


def pool_blocks(
    kv: mx.array, score: mx.array, lo: int, n: int, ratio: int, dim: int, overlap: bool
) -> mx.array:
    """The softmax pooling [n, dim] of the ``n`` blocks whose rows start at row ``lo`` of kv and
    score (``metal/pool_blocks.metal``; ``Compressor._pooled`` is the twin)."""
    return body_kernel("pool_blocks", ("kv", "score", "blocks"), ("pooled",))(
        inputs=[kv, score.astype(kv.dtype), host_ints(lo, n)],
        template=[("T_", kv.dtype), ("R", ratio), ("DIM", dim), ("OVERLAP", int(overlap))],
        grid=(dim, n, 1),
        threadgroup=(min(dim, MAX_THREADGROUP), 1, 1),
        output_shapes=[(n, dim)],
        output_dtypes=[kv.dtype],
    )[0]


def grow_rows(cached: mx.array, fresh: mx.array, take: int, keep: int) -> mx.array:
    """``kernels.grow_rows`` of one pair in one launch (``metal/grow_rows.metal``): the last
    ``keep`` rows of cached [N, W] followed by the first ``take`` rows of fresh. N must not
    be 0 (an empty input cannot be bound)."""
    rows, width = min(cached.shape[0] + take, keep), cached.shape[1]
    return body_kernel("grow_rows", ("cached", "fresh", "counts"), ("rows",))(
        inputs=[cached, fresh.astype(cached.dtype), host_ints(take, rows)],
        template=[("T_", cached.dtype), ("W", width)],
        grid=(width, rows, 1),
        threadgroup=(min(width, MAX_THREADGROUP), 1, 1),
        output_shapes=[(rows, width)],
        output_dtypes=[cached.dtype],
    )[0]


def grow_row_pairs(
    cached: tuple[mx.array, mx.array],
    fresh: tuple[mx.array, mx.array],
    take: int,
    keep: int,
    added: mx.array | None = None,
) -> tuple[mx.array, mx.array]:
    """``grow_rows`` of two pairs of one shape in one launch (``metal/grow_row_pairs.metal``):
    a compressor's pending kv rows and scores, ``added`` (float32, fresh's shape) summed into
    the second pair's fresh rows first when given (``kernels.grow_scored_rows``)."""
    (first, second), (new_first, new_second) = cached, fresh
    rows, width = min(first.shape[0] + take, keep), first.shape[1]
    grown = body_kernel(
        "grow_row_pairs",
        ("cached", "fresh", "cached2", "fresh2", "added", "counts"),
        ("rows", "rows2"),
    )(
        inputs=[
            first,
            new_first.astype(first.dtype),
            second,
            new_second.astype(first.dtype),
            host_constant(0.0, mx.float32) if added is None else added.astype(mx.float32),
            host_ints(take, rows),
        ],
        template=[("T_", first.dtype), ("W", width), ("ADDED", int(added is not None))],
        grid=(width, rows, 2),
        threadgroup=(min(width, MAX_THREADGROUP), 1, 1),
        output_shapes=[(rows, width), (rows, width)],
        output_dtypes=[first.dtype, first.dtype],
    )
    return grown[0], grown[1]


def embed_streams(
    tokens: mx.array,
    packed: mx.array,
    scales: mx.array,
    biases: mx.array,
    bits: int,
    group_size: int,
    hc: int,
) -> mx.array:
    """Each token's row of an affine-quantized embedding (``packed`` [V, D * bits / 32],
    ``scales`` and ``biases`` [V, D / group_size]) as all ``hc`` streams of its tile row,
    float32 [T, hc * D] (``metal/embed_streams.metal``)."""
    tokens_count, dim = tokens.shape[0], packed.shape[-1] * 32 // bits
    return body_kernel("embed_streams", ("tokens", "packed", "scales", "biases"), ("streams",))(
        inputs=[tokens.astype(mx.int32), packed, scales, biases.astype(scales.dtype)],
        template=[
            ("S_", scales.dtype),
            ("BITS", bits),
            ("GROUP", group_size),
            ("D", dim),
            ("HC", hc),
        ],
        grid=(dim, tokens_count, 1),
        threadgroup=(min(dim, MAX_THREADGROUP), 1, 1),
        output_shapes=[(tokens_count, hc * dim)],
        output_dtypes=[mx.float32],
    )[0]


def indexer_top_k(
    q: mx.array,
    weights: mx.array,
    keys: mx.array,
    visible: mx.array,
    top_k: int,
    weight_scale: float = 1.0,
) -> mx.array:
    """``twins.indexer_top_k`` (of the weights times ``weight_scale``) for a whole tile in two
    launches: every row's block scores (``metal/indexer_scores.metal``), then every row's
    selection (``top_k_kernel``)."""
    scores = indexer_scores(q, weights, keys, visible, weight_scale)
    return top_k_kernel(scores, visible, top_k)


def indexer_scores(
    q: mx.array, weights: mx.array, keys: mx.array, visible: mx.array, weight_scale: float = 1.0
) -> mx.array:
    """Each row's score of each block [T, N] (the head weights times ``weight_scale``), -inf
    past the blocks the row sees."""
    tokens, heads, dim = q.shape
    blocks = keys.shape[0]
    return body_kernel(
        "indexer_scores", ("q", "weights", "keys", "visible", "weight_scale"), ("scores",)
    )(
        inputs=[
            q,
            weights.astype(mx.float32),
            keys.astype(q.dtype),
            visible.astype(mx.int32),
            host_constant(weight_scale, mx.float32),
        ],
        template=[("T_", q.dtype), ("H", heads), ("D", dim)],
        grid=(blocks, tokens, 1),
        threadgroup=(min(blocks, MAX_THREADGROUP), 1, 1),
        output_shapes=[(tokens, blocks)],
        output_dtypes=[mx.float32],
    )[0]


def top_k_kernel(scores: mx.array, visible: mx.array, top_k: int) -> mx.array:
    """``select_top_k`` (its twin) in one launch, a threadgroup a row
    (``metal/indexer_top_k.metal``)."""
    return body_kernel("indexer_top_k", ("scores", "visible"), ("top",), header="select")(
        inputs=[scores.astype(mx.float32), visible.astype(mx.int32)],
        template=[("TOPK", top_k), ("THREADS", MAX_THREADGROUP)],
        grid=(MAX_THREADGROUP, scores.shape[0], 1),
        threadgroup=(MAX_THREADGROUP, 1, 1),
        output_shapes=[(scores.shape[0], top_k)],
        output_dtypes=[mx.int32],
    )[0]


def select_top_k(scores: mx.array, visible: mx.array, top_k: int) -> mx.array:
    """int32 [T, top_k]: each row's ``top_k`` best blocks of ``scores`` [T, N] in ascending
    order, -1 in unused slots, as ``twins.indexer_top_k`` chooses them (a stable sort: equal
    scores keep the lower block; the -inf of unseen blocks sort last, so a row that sees at
    most ``top_k`` blocks takes them all). MLX operations: ``top_k_kernel``'s twin."""
    picked = mx.sort(mx.argsort(-scores, axis=-1)[:, :top_k], axis=-1)
    return mx.where(_slots(top_k) < visible.astype(mx.int32)[:, None], picked.astype(mx.int32), -1)


@cache
def _slots(top_k: int) -> mx.array:
    return mx.array(np.arange(top_k, dtype=np.int32))  # made on the host: no primitive


def kda_head_dim_fits(a: mx.array, q: mx.array) -> bool:
    """Whether ``kda_tile`` serves KDA heads of this width (q [T, H * D], a [H]): one
    threadgroup a head, of whole simdgroups."""
    dim = q.shape[-1] // a.shape[0]
    return dim % SIMD_WIDTH == 0 and dim <= MAX_THREADGROUP


def kda_tile(
    w: twins.KDAWeights,
    qkv: Sequence[mx.array],
    beta: mx.array,
    decay: mx.array,
    gate: mx.array,
    conv_rows: mx.array,
    states: mx.array,
    newest: mx.array,
    n_real: int,
) -> tuple[mx.array, mx.array, mx.array]:
    """``twins.kda_tile`` in one launch (``metal/kda_tile.metal``): one threadgroup a head."""
    (tokens, inner), heads = qkv[0].shape, w.a.shape[0]
    dim = inner // heads
    lower = w.lower_bound > -math.inf
    params = [w.lower_bound if lower else 0.0, w.eps, twins.KDA_L2_EPS / dim, 1 / math.sqrt(dim)]
    kept_rows = min(conv_rows.shape[1] + n_real, w.keep_rows)
    inputs = (*qkv, beta, decay, gate, w.dt_bias, w.a, conv_rows, w.conv, states, w.norm_weight)
    out, rows, kept = body_kernel(
        "kda_tile",
        ("q", "k", "v", "beta", "decay", "gate", "dt_bias", "a", "conv_rows", "conv_w")
        + ("states", "norm_weight", "params", "newest"),
        ("out", "rows", "kept"),
        header=("hc", "norm"),
    )(
        inputs=[
            *(x.astype(mx.float32) for x in inputs),
            mx.array(params, dtype=mx.float32),
            newest.astype(mx.int32),
        ],
        template=[
            ("D", dim),
            ("H", heads),
            ("KERNEL", w.conv.shape[-1]),
            ("NREAL", n_real),
            ("KEEP_ROWS", w.keep_rows),
            ("LOWER", int(lower)),
        ],
        grid=(dim, heads, 1),
        threadgroup=(dim, 1, 1),
        output_shapes=[(tokens, inner), (3, kept_rows, inner), (n_real, heads, dim, dim)],
        output_dtypes=[mx.float32] * 3,
    )
    return out, rows, kept
