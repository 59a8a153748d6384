"""Pure-MLX twins of the Metal kernels: the readable specification of each packed format.

Each ``_decode_*`` turns GGML blocks (uint8 [..., n_blocks, type_size]) into float32 values
[..., n_blocks, 256] with the same arithmetic, in the same order, as ``gguf.quants`` (and ggml's
``dequantize_row_*``), so the result is bit-identical to the reference. The matmuls then run on
the decoded float32 weight. The Metal kernels in ``metal/`` compute the same sums without
materialising the weight.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial

from ds4mlx.kernels.weights import PackedWeight

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType
from gguf.quants import IQ2_XXS

PACKED_TYPES = frozenset(
    {GGMLQuantizationType.Q2_K, GGMLQuantizationType.Q6_K, GGMLQuantizationType.IQ2_XXS}
)


def _f16_at(blocks: mx.array, offset: int) -> mx.array:
    """The little-endian float16 at byte ``offset`` of every block, as float32 [..., n, 1]."""
    return mx.view(blocks[..., offset : offset + 2], mx.float16).astype(mx.float32)


def _shifts(*values: int) -> mx.array:
    return mx.array(values, dtype=mx.uint8)


def _decode_q2_k(blocks: mx.array) -> mx.array:
    # scales[16] | qs[64] | d | dmin. Value half*128 + pass*32 + l is bits [2*pass, 2*pass + 2) of
    # qs[half*32 + l]; 16-value sub-block s uses d*(scales[s] & 15) and dmin*(scales[s] >> 4).
    *outer, n_blocks, _ = blocks.shape
    scales = blocks[..., 0:16]
    qs = blocks[..., 16:80].reshape(*outer, n_blocks, 2, 1, 32)
    d, dmin = _f16_at(blocks, 80), _f16_at(blocks, 82)
    sub_scale = (d * (scales & 0xF).astype(mx.float32))[..., None]
    sub_min = (dmin * (scales >> 4).astype(mx.float32))[..., None]
    q = (qs >> _shifts(0, 2, 4, 6).reshape(4, 1)) & 3  # [..., n, half, pass, l]
    q = q.reshape(*outer, n_blocks, 16, 16).astype(mx.float32)
    return (sub_scale * q - sub_min).reshape(*outer, n_blocks, QK_K)


def _decode_q6_k(blocks: mx.array) -> mx.array:
    # ql[128] | qh[64] | scales[16] (int8) | d. Value half*128 + quarter*32 + l takes nibble
    # (quarter // 2) of ql[half*64 + (quarter % 2)*32 + l] and bits [2*quarter, 2*quarter + 2) of
    # qh[half*32 + l]; value = d * scales[sub-block] * (q - 32) with 16-value sub-blocks.
    *outer, n_blocks, _ = blocks.shape
    ql = blocks[..., 0:128].reshape(*outer, n_blocks, 2, 1, 64)
    qh = blocks[..., 128:192].reshape(*outer, n_blocks, 2, 1, 32)
    scales = mx.view(blocks[..., 192:208], mx.int8).astype(mx.float32)
    d = _f16_at(blocks, 208)
    sub_scale = (d * scales).reshape(*outer, n_blocks, 16, 1)
    low = ((ql >> _shifts(0, 4).reshape(2, 1)) & 0xF).reshape(*outer, n_blocks, 2, 4, 32)
    high = ((qh >> _shifts(0, 2, 4, 6).reshape(4, 1)) & 3).reshape(*outer, n_blocks, 2, 4, 32)
    q = (low | (high << 4)).astype(mx.int8) - 32
    q = q.reshape(*outer, n_blocks, 16, 16).astype(mx.float32)
    return (sub_scale * q).reshape(*outer, n_blocks, QK_K)


@cache
def iq2_xxs_tables() -> tuple[mx.array, mx.array]:
    """(grid [256, 8] float32 of 8/25/43, ksigns [128] uint8), taken from ``gguf.quants``."""
    IQ2_XXS.init_grid()
    grid = np.asarray(IQ2_XXS.grid, dtype=np.float32).reshape(256, 8)
    ksigns = np.frombuffer(IQ2_XXS.ksigns, dtype=np.uint8)
    return mx.array(grid), mx.array(ksigns)


def _decode_iq2_xxs(blocks: mx.array) -> mx.array:
    # d | 8 sub-blocks of 32 values in 8 bytes: bytes 0-3 pick 4 rows of the 8-value grid, bytes
    # 4-7 are a uint32 whose four 7-bit fields pick each row's signs from ksigns (bit j set: value j
    # negative) and whose top 4 bits are the scale: value = d * (0.5 + scale) * 0.25 * grid.
    *outer, n_blocks, _ = blocks.shape
    grid, ksigns = iq2_xxs_tables()
    d = _f16_at(blocks, 0)[..., None]  # [..., n, 1, 1]
    sub_blocks = blocks[..., 2:].reshape(*outer, n_blocks, 8, 8)
    grid_rows = sub_blocks[..., 0:4]  # [..., n, sub, 4]
    packed = mx.view(sub_blocks[..., 4:8], mx.uint32)  # [..., n, sub, 1]
    db = (d * (0.5 + (packed >> 28).astype(mx.float32)) * 0.25)[..., None]  # [..., n, sub, 1, 1]
    sign_index = (packed >> mx.array([0, 7, 14, 21], dtype=mx.uint32)) & 0x7F
    sign_bits = (ksigns[sign_index][..., None] >> mx.arange(8, dtype=mx.uint8)) & 1
    signs = mx.where(sign_bits == 0, 1.0, -1.0)  # [..., n, sub, 4, 8]
    values = db * grid[grid_rows] * signs
    return values.reshape(*outer, n_blocks, QK_K)


_DECODERS = {
    GGMLQuantizationType.Q2_K: _decode_q2_k,
    GGMLQuantizationType.Q6_K: _decode_q6_k,
    GGMLQuantizationType.IQ2_XXS: _decode_iq2_xxs,
}


def dequantize_packed(data: mx.array, qtype: GGMLQuantizationType) -> mx.array:
    """GGML rows uint8 [..., row_bytes] of ``qtype`` as float32 [..., row_length]."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    *outer, row_bytes = data.shape
    blocks = data.reshape(*outer, row_bytes // type_size, type_size)
    return _DECODERS[qtype](blocks).reshape(*outer, row_bytes // type_size * QK_K)


def linear(x: mx.array, w: PackedWeight) -> mx.array:
    """x @ W.T (batched over W's leading dims) in float32, returned in x's dtype."""
    weight = dequantize_packed(w.data, w.qtype)
    return (x @ mx.swapaxes(weight, -1, -2)).astype(x.dtype)


def gather_linear(
    x: mx.array, w: PackedWeight, expert_indices: mx.array, sorted_indices: bool = False
) -> mx.array:
    """``mx.gather_mm(x, W.swapaxes(-1, -2), rhs_indices=expert_indices)`` for a packed W.

    As in ``mx.gather_mm``, indices are flat over W's leading dims.
    """
    experts = w.data.reshape(-1, *w.data.shape[-2:])
    if expert_indices.size < experts.shape[0]:
        # Few routed rows (decode): decode only the experts they use, one copy per index.
        weight = dequantize_packed(experts[expert_indices.flatten()], w.qtype)
        expert_indices = mx.arange(expert_indices.size).reshape(expert_indices.shape)
    else:
        weight = dequantize_packed(experts, w.qtype)
    out = mx.gather_mm(
        x, mx.swapaxes(weight, -1, -2), rhs_indices=expert_indices, sorted_indices=sorted_indices
    )
    return out.astype(x.dtype)


# --------------------------------------------------------------------------------------------
# mHC Sinkhorn and sparse compressed-KV attention (metal/sinkhorn.metal,
# metal/sparse_attention.metal)
# --------------------------------------------------------------------------------------------


def sinkhorn(comb: mx.array, iters: int, eps: float) -> mx.array:
    """Sinkhorn-normalise mixing logits ``comb`` [..., src, dst].

    llama.cpp's order (``build_hc_sinkhorn`` / ``ggml_dsv4_hc_comb``): softmax over dst plus eps,
    one column normalisation (over src, for each dst), then ``iters - 1`` rounds of row
    (over dst) and column normalisation, each sum padded by eps.
    """
    return _compiled_sinkhorn(iters, eps)(comb)


def _sinkhorn_rounds(comb: mx.array, iters: int, eps: float) -> mx.array:
    comb = mx.softmax(comb, axis=-1, precise=True) + eps
    comb = comb / (mx.sum(comb, axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (mx.sum(comb, axis=-1, keepdims=True) + eps)
        comb = comb / (mx.sum(comb, axis=-2, keepdims=True) + eps)
    return comb


@cache
def _compiled_sinkhorn(iters: int, eps: float) -> Callable[[mx.array], mx.array]:
    # The rounds are ~6 tiny ops each (20 rounds, 13 sites per token): launching them one by one
    # was a third of a decode step on the CPU. mx.compile fuses each eps-add and division into
    # one kernel and replays the traced graph without Python; the ops and their order are
    # unchanged, so the results are bit-identical (checked in tests/kernels). On a CPU without a
    # C++ compiler MLX runs the same graph unfused.
    return mx.compile(partial(_sinkhorn_rounds, iters=iters, eps=eps))


def swiglu(gate: mx.array, up: mx.array, limit: float = 0.0) -> mx.array:
    """silu(gate) * up; with ``limit`` > 0 as ``ggml_swiglu_clamp``: gate clamped from above and
    up to [-limit, limit] before the product."""
    if limit > 1e-6:
        gate = mx.minimum(gate, limit)
        up = mx.clip(up, -limit, limit)
    return nn.silu(gate) * up


def routed_experts(
    x: mx.array, gate: mx.array, up: mx.array, down: mx.array, indices: mx.array, limit: float
) -> mx.array:
    """Every (token, slot) pair's routed SwiGLU expert output [T, k, D]:
    ``down_e(swiglu(gate_e x[t], up_e x[t]))`` with ``e = indices[t, k]``, on stacked weights as
    GGUF stores them (gate/up [E, F, D], down [E, D, F]); one gathered matmul per pair."""
    rows = x[:, None, None, :]  # broadcasts against indices [T, k]

    def gathered(inputs: mx.array, w: mx.array) -> mx.array:
        return mx.gather_mm(inputs, mx.swapaxes(w, -1, -2), rhs_indices=indices)

    hidden = swiglu(gathered(rows, gate), gathered(rows, up), limit)
    return gathered(hidden, down).reshape(*indices.shape, -1)


def hc_mixes(
    mixes: mx.array,
    scale: mx.array,
    base: mx.array,
    hc: int,
    iters: int,
    eps: float,
    sinkhorn_fn: Callable[[mx.array, int, float], mx.array] = sinkhorn,
) -> tuple[mx.array, mx.array, mx.array]:
    """One mHC site's mixes from its projection ``mixes`` [T, (2 + hc) * hc], the per-section
    ``scale`` [3] and bias ``base`` [(2 + hc) * hc]: collapse weights ``pre`` [T, hc] (sigmoid
    plus eps), expansion weights ``post`` [T, hc] (2 * sigmoid) and the Sinkhorn-normalised
    stream mix ``comb`` [T, hc(src), hc(dst)] (``sinkhorn_fn``: this twin's or a kernel)."""
    pre = mx.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2.0 * mx.sigmoid(mixes[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    comb = mixes[:, 2 * hc :] * scale[2] + base[2 * hc :]
    return pre, post, sinkhorn_fn(comb.reshape(mixes.shape[0], hc, hc), iters, eps)


def hc_pre(
    x: mx.array,
    fn_t: mx.array,
    scale: mx.array,
    base: mx.array,
    hc: int,
    iters: int,
    eps: float,
    norm_eps: float,
) -> tuple[mx.array, mx.array, mx.array]:
    """A whole mHC site before its block, on a float32 projection stored [in, out], ``fn_t``
    [hc * D, (2 + hc) * hc]: the streams x [T, hc, D] RMS-normed as one flat vector per token,
    projected, mixed (``hc_mixes``) and collapsed by ``pre``. Returns (block input [T, D],
    post, comb)."""
    flat = mx.fast.rms_norm(x.reshape(x.shape[0], -1), None, norm_eps)
    return hc_site(x, flat @ fn_t, scale, base, hc, iters, eps)


def hc_site(
    x: mx.array,
    mixes: mx.array,
    scale: mx.array,
    base: mx.array,
    hc: int,
    iters: int,
    eps: float,
    sinkhorn_fn: Callable[[mx.array, int, float], mx.array] = sinkhorn,
) -> tuple[mx.array, mx.array, mx.array]:
    """An mHC site after its projection: the streams x [T, hc, D] collapsed by the ``pre``
    weights of their ``mixes`` (``hc_mixes``). Returns (block input [T, D], post, comb)."""
    pre, post, comb = hc_mixes(mixes, scale, base, hc, iters, eps, sinkhorn_fn)
    return (pre[:, None, :] @ x)[:, 0], post, comb


def rms_normalised(x: mx.array, eps: float) -> mx.array:
    """x / sqrt(mean(x^2) + eps) over the last axis (``mx.fast.rms_norm`` without a weight,
    written out: the twins' norm, in float32)."""
    x = x.astype(mx.float32)
    return x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps)


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
) -> tuple[mx.array, mx.array, mx.array]:
    """``hc_site`` with its norms: ``mixes`` project the raw flat streams, so they are scaled by
    the streams' inverse RMS (``norm_eps``; the projection is linear, so this is the product of
    the normalised streams), and the block input comes back RMS-normalised (``out_eps``) times
    ``weight``. Returns (normalised block input [T, D], post, comb)."""
    y, post, comb = hc_site(
        x, mixes * _streams_inverse_rms(x, norm_eps), scale, base, hc, iters, eps
    )
    return (rms_normalised(y, out_eps) * weight).astype(x.dtype), post, comb


def hc_head_norm(
    x: mx.array,
    mixes: mx.array,
    scale: mx.array,
    base: mx.array,
    weight: mx.array,
    eps: float,
    norm_eps: float,
    out_eps: float,
) -> mx.array:
    """The head's collapse of the streams x [T, hc, D] with its norms, as ``hc_site_norm``
    (llama.cpp's ``build_hc_head``, then the output norm ``weight``): ``mixes`` [T, hc] project
    the raw flat streams; pre = sigmoid(mixes / rms * scale + base) + eps. -> [T, D]."""
    pre = mx.sigmoid(mixes * _streams_inverse_rms(x, norm_eps) * scale + base) + eps
    y = (pre[:, None, :] @ x.astype(mx.float32))[:, 0]
    return (rms_normalised(y, out_eps) * weight).astype(x.dtype)


def _streams_inverse_rms(x: mx.array, eps: float) -> mx.array:
    """1 / sqrt(mean(x^2) + eps) of each token's streams x [T, hc, D] as one flat row: [T, 1]."""
    flat = x.reshape(x.shape[0], -1).astype(mx.float32)
    return mx.rsqrt(mx.mean(flat * flat, axis=-1, keepdims=True) + eps)


@mx.compile
def hc_expand(out: mx.array, residual: mx.array, post: mx.array, comb: mx.array) -> mx.array:
    """The streams after a block [T, hc, D]: ``post[dst] * out + sum_src comb[src, dst] *
    residual[src]``. Compiled, the scaling and the sum are one kernel after the matmul."""
    mixed = mx.matmul(mx.swapaxes(comb, -1, -2), residual)
    return post[..., None] * out[:, None, :] + mixed


def sparse_attention(
    q: mx.array,
    window: mx.array,
    window_range: mx.array,
    comp: mx.array,
    comp_index: mx.array,
    sinks: mx.array,
    scale: float,
) -> mx.array:
    """Sink attention of each query row over its sliding window and its selected compressed rows.

    q [T, H, D]; window [W, D] raw keys (also the values), row t seeing rows
    ``window_range[t, 0] <= w < window_range[t, 1]``; comp [N, D] compressed keys, row t seeing
    ``comp[comp_index[t, k]]`` for each slot k with an index in [0, N); sinks [H] (unscaled
    logits in the denominator only). Returns [T, H, D] in q's dtype; a row that sees no key
    gets zeros. This twin reads the ranges and indices on the host and gathers each row's keys
    on their own, so that, as in the fused kernels that read them in place, a row's result
    depends on nothing but its own keys: not on the other rows, nor on the window's length.
    """
    ranges = np.array(window_range).reshape(-1, 2)
    index = np.array(comp_index).reshape(ranges.shape[0], -1)
    rows = []
    for t in range(q.shape[0]):
        lo, hi = max(int(ranges[t, 0]), 0), min(int(ranges[t, 1]), window.shape[0])
        picked = index[t][(index[t] >= 0) & (index[t] < comp.shape[0])]
        keys = ([window[lo:hi]] if hi > lo else []) + (
            [comp[mx.array(picked)]] if picked.size else []
        )
        rows.append(_sink_attention_row(q[t], keys, sinks, scale))
    return mx.stack(rows).astype(q.dtype)


def indexer_top_k(
    q: mx.array, weights: mx.array, keys: mx.array, visible: mx.array, top_k: int
) -> mx.array:
    """The lightning indexer's choice of compressed blocks for each query row on its own.

    q [T, H, D] indexer queries, weights [T, H] their head weights, keys [N, D] the indexer's
    block keys, visible int32 [T] how many blocks each row sees (its first ones). A row that
    sees at most ``top_k`` blocks takes them all; otherwise block j scores
    ``sum_h weights[t, h] * max(q[t, h] . keys[j], 0)`` and the ``top_k`` highest are kept,
    equal scores taken lower block first. Returns int32 [T, top_k]: the chosen blocks in
    ascending order, -1 in unused slots. This twin reads ``visible`` on the host and scores
    each row over exactly its own blocks, so that a row's choice never depends on the other
    rows (a verify row chooses as its one-token decode does).
    """
    slots = np.arange(top_k)
    rows = []
    for t, n in enumerate(np.array(visible).reshape(-1).tolist()):
        if n <= top_k:
            rows.append(mx.array(np.where(slots < n, slots, -1).astype(np.int32)))
            continue
        scores = mx.maximum(q[t].astype(mx.float32) @ keys[:n].astype(mx.float32).T, 0.0)
        scores = mx.sum(scores * weights[t].astype(mx.float32)[:, None], axis=0)  # [n]
        # argsort is stable: among equal scores the lower block comes first.
        rows.append(mx.sort(mx.argsort(-scores)[:top_k]).astype(mx.int32))
    return mx.stack(rows)


def _sink_attention_row(
    q: mx.array, keys: list[mx.array], sinks: mx.array, scale: float
) -> mx.array:
    """One query row q [H, D] over ``keys`` (pieces [n, D]): softmax with each head's sink."""
    if not keys:
        return mx.zeros(q.shape, mx.float32)
    k = mx.concatenate(keys).astype(mx.float32)
    scores = (q.astype(mx.float32) @ k.T) * scale  # [H, n]
    top = mx.maximum(mx.max(scores, axis=-1), sinks.astype(mx.float32))
    weights = mx.exp(scores - top[:, None])
    denominator = mx.sum(weights, axis=-1) + mx.exp(sinks - top)
    return (weights / denominator[:, None]) @ k


# --------------------------------------------------------------------------------------------
# KDA (Kimi Delta Attention, models.kda): a decode tile after its input projections
# --------------------------------------------------------------------------------------------

# ggml_gated_delta_net's L2 norm epsilon (build_gdn_l2_norm, "Match FLA l2 norm").
KDA_L2_EPS = 1e-6


def kda_conv(
    proj: mx.array, rows: mx.array, taps: Sequence[mx.array], n_real: int, keep: int
) -> tuple[mx.array, mx.array]:
    """Causal depthwise conv + SiLU of the q/k/v projections proj [3, T, inner] after the
    cached rows [3, R, inner] (R >= kernel - 1), taps [3, 1, inner] each -> ([3, T, inner], the
    last ``keep`` of the cached rows followed by the first ``n_real`` new ones)."""
    tokens, history = proj.shape[1], len(taps) - 1
    window = mx.concatenate([rows[:, rows.shape[1] - history :], proj], axis=1)
    out = window[:, :tokens] * taps[0]
    for i in range(1, len(taps)):
        out = out + window[:, i : i + tokens] * taps[i]
    kept = mx.concatenate([rows, proj[:, max(0, n_real - keep) : n_real]], axis=1)
    return nn.silu(out), kept[:, max(0, kept.shape[1] - keep) :]


def softplus(x: mx.array) -> mx.array:
    """ggml's softplus: x above 20, else log(1 + exp(x))."""
    return mx.where(x > 20.0, x, mx.log1p(mx.exp(mx.minimum(x, 20.0))))


def kda_l2_norm(x: mx.array) -> mx.array:
    """x / sqrt(sum(x^2) + eps) over the last axis, computed as llama.cpp's
    ``build_gdn_l2_norm`` does (an RMS norm with eps / n, times 1 / sqrt(n))."""
    n = x.shape[-1]
    return mx.fast.rms_norm(x, None, KDA_L2_EPS / n) * (1.0 / math.sqrt(n))


def kda_decay(g: mx.array, a: mx.array, lower_bound: float) -> mx.array:
    """Per-channel log decay (llama.cpp's ``kda_g1``) [T, H, K] from its pre-activation g
    (f_b f_a x + dt_bias) and A [H]: ``lower_bound * sigmoid(-A g)``, or ggml's
    ``softplus(g) * A`` without a lower bound (-inf)."""
    if lower_bound > -math.inf:
        return lower_bound * mx.sigmoid(-(g * a[:, None]))
    return softplus(g) * a[:, None]


def kda_steps(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """The KDA recurrence one position at a time (as ``ggml_gated_delta_net`` scans), on the
    shapes of a single position whatever the number of positions: a position's result does not
    depend on how many positions share the call.

    q, k, g [H, T, K]; v [H, T, V]; beta [H, T]; ``state`` [H, K, V] the state to continue.
    Returns the outputs [H, T, V] and the state after each position [T, H, K, V].
    """
    scale = mx.array(1.0 / math.sqrt(v.shape[-1]), mx.float32)
    outs, new_states = [], []
    for t in range(q.shape[1]):
        at = slice(t, t + 1)
        out, state = _kda_step(q[:, at], k[:, at], v[:, at], g[:, at], beta[:, at], state, scale)
        outs.append(out)
        new_states.append(state[None])
    return mx.concatenate(outs, axis=1), mx.concatenate(new_states)


@mx.compile
def _kda_step(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    scale: mx.array,
) -> tuple[mx.array, mx.array]:
    """One position of ``kda_steps`` (q, k, g [H, 1, K], v [H, 1, V], beta [H, 1]), compiled:
    per head S = diag(exp(g)) S; d = beta (v - S^T k); S += k d^T; o = S^T q * scale."""
    state = mx.exp(g[:, 0])[..., None] * state
    delta = beta[:, 0, None] * (v[:, 0] - (k @ state)[:, 0])
    state = state + mx.swapaxes(k, 1, 2) * delta[:, None, :]
    return (q @ state) * scale, state


@dataclass(frozen=True)
class KDAWeights:
    """What a KDA layer's decode tile reads besides its rows (``kda_tile``): dt_bias [H * D],
    A [H], the conv weights [3, H * D, kernel], the output norm's weight [D] and eps, the
    decay's lower bound (-inf: the softplus decay), and how many conv rows the layer's cache
    keeps."""

    dt_bias: mx.array
    a: mx.array
    conv: mx.array
    norm_weight: mx.array
    eps: float
    lower_bound: float
    keep_rows: int


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
    """A KDA decode tile between its input and output projections (``models.kda.KDA.tile``).

    qkv: the q, k and v projections [T, H * D] of the tile's rows; beta, decay and gate: the
    pre-activations of beta [T, H], of the decay [T, H * D] (before ``w.dt_bias``) and of the
    output gate [T, H * D]; the cached conv rows [3, R, H * D] (R >= kernel - 1); states
    [n, H, D, D] and ``newest`` (int32 [1]), the one to continue (a KDA cache passes its
    current state alone: ``models.kda.KDACache``).
    The first ``n_real`` rows are real: each is conv'd (+ SiLU), q and k L2-normalised, run
    through the recurrence (``kda_steps``), its output RMS-normed and gated by sigmoid(gate);
    the padding rows come out zeros. Returns (output [T, H * D], the last ``w.keep_rows`` conv
    rows, the state after each real row [n_real, H, D, D]): the cache puts the new states in
    its ring's slots.
    """
    tokens, inner = qkv[0].shape
    heads = w.a.shape[0]
    dim = inner // heads
    taps = [w.conv[:, None, :, i] for i in range(w.conv.shape[-1])]
    conv, kept_rows = kda_conv(mx.stack(qkv), conv_rows, taps, n_real, w.keep_rows)
    q, k, v = (mx.swapaxes(t.reshape(tokens, heads, dim), 0, 1) for t in conv)  # [H, T, D]
    q, k = kda_l2_norm(q), kda_l2_norm(k)
    beta = mx.swapaxes(mx.sigmoid(beta), 0, 1)  # [H, T]
    g = kda_decay((decay + w.dt_bias).reshape(tokens, heads, dim), w.a, w.lower_bound)
    recurrence_inputs = (q, k, v, mx.swapaxes(g, 0, 1), beta)
    state = mx.take(states, newest, axis=0)[0]
    out, new_states = kda_steps(*(t[:, :n_real] for t in recurrence_inputs), state)
    out = mx.concatenate([out, mx.zeros((heads, tokens - n_real, dim))], axis=1)
    out = mx.fast.rms_norm(mx.swapaxes(out, 0, 1), w.norm_weight, w.eps)
    out = out * mx.sigmoid(gate.reshape(tokens, heads, dim))
    return out.reshape(tokens, inner), kept_rows, new_states
