"""Kimi Delta Attention (KDA): the recurrent token mixer of GLM-5.3-Flash's KDA layers
(llama.cpp ``build_kda_layer`` and ``ggml_gated_delta_net``), with its cache.

q/k/v projections each go through a causal depthwise conv (``ssm_conv``, kernel
``ssm.conv_kernel``) and SiLU; q and k are L2-normalised; a per-channel decay
``g = lower_bound * sigmoid(-A * (f_b f_a x + dt_b))`` (or ``softplus(...) * A`` without a lower
bound); ``beta = sigmoid(ssm_beta x)``. Per head, state S [key, value]:
``S = diag(exp(g)) S;  d = beta (v - S^T k);  S += k d^T;  o = S^T q / sqrt(head_dim)``.
The output is RMS-normed per head (``ssm_norm``), gated by ``sigmoid(g_b g_a x)``, projected.

Prefill is computed chunk-wise (``_kda_chunk``: the WY/UT form over 16-position chunks);
llama.cpp's CPU op scans token by token. Both compute the same recurrence. Decode tiles scan
one position at a time and keep the state after each, for a rollback, in a ring of slots that
a tile writes only its new states into (``KDACache``): everything between the tile's
projections is one fused operation (``kernels.kda_tile``: a native CPU primitive, a Metal
launch, or the MLX ops of ``twins.kda_tile``, which scans with ``twins.kda_steps``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from ds4mlx import kernels
from ds4mlx.kernels import KDAWeights, linear, linear_many
from ds4mlx.kernels.twins import KDA_L2_EPS, kda_conv, kda_decay
from ds4mlx.models.norms import RMSNorm, rms_norm
from ds4mlx.models.weights import Weights

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# Positions per KDA chunk (llama.cpp's chunked KDA uses 16 too).
_KDA_CHUNK = 16


@dataclass(frozen=True)
class KDACache:
    """A KDA layer's recurrent state: the projected q/k/v rows of the last positions
    [3, rows, inner] (the conv reads the last ``conv_kernel - 1``; up to ``KDA.rollback`` more
    allow a rollback) and a ring of delta-rule states [n, heads, key, value] (n =
    ``KDA.rollback + 1`` slots): slot ``newest`` holds the state after the current position, the
    ``depth`` slots before it (cyclically) the states after the positions before, how far the
    state can be rolled back; ``current`` [1, heads, key, value] is that newest state as the
    next tile reads it (its own array, so that the ring's only reader is its update). A decode
    tile writes only its new states into the slots after ``newest`` (in place when nothing else
    holds the ring: MLX donates it), and a rollback moves ``newest`` back: the past is never
    copied."""

    conv: mx.array | None = None
    ssm: mx.array | None = None
    newest: int = 0
    depth: int = 0
    current: mx.array | None = None

    @property
    def rollback(self) -> int:
        return self.depth

    @property
    def state(self) -> mx.array:
        """The state after the current position [heads, key, value]."""
        return self.current[0]

    def truncate(self, cut: int) -> KDACache:
        """This cache as it was ``cut`` positions ago (``cut <= rollback``)."""
        if cut == 0:
            return self
        newest = (self.newest - cut) % self.ssm.shape[0]
        return KDACache(
            conv=self.conv[:, : self.conv.shape[1] - cut],
            ssm=self.ssm,
            newest=newest,
            depth=self.depth - cut,
            # A view of the ring: the next tile's update of the ring may then copy it, once.
            current=self.ssm[newest : newest + 1],
        )

    def advanced(self, conv: mx.array, ssm: mx.array, current: mx.array, n_real: int) -> KDACache:
        """This cache after a decode tile of ``n_real`` real rows put their states in the ring
        ``ssm`` (``KDA.tile``), the last ``current``, and kept the conv rows ``conv``."""
        slots = ssm.shape[0]
        return KDACache(
            conv=conv,
            ssm=ssm,
            newest=(self.newest + n_real) % slots,
            depth=min(self.depth + n_real, slots - 1),
            current=current,
        )


@cache
def ring_slots(newest: int, n_real: int, slots: int) -> mx.array:
    """The slots of a ring of ``slots`` states whose newest is ``newest`` that a tile of
    ``n_real`` real rows writes, cyclically after it (int32 [n_real, 1, 1, 1], for
    ``mx.put_along_axis``): an array, so that a compiled tile is traced once whichever slot is
    newest; made once for each."""
    after = (newest + 1 + np.arange(n_real)) % slots
    indices = mx.array(after.reshape(-1, 1, 1, 1), dtype=mx.int32)
    mx.eval(indices)
    return indices


# The slot of ``kernels.kda_tile``'s states input that a tile continues from: its only one.
_FIRST = mx.array([0], dtype=mx.int32)


def _unit_lower_inverse(a: mx.array) -> mx.array:
    """(I + a)^-1 for strictly lower triangular ``a`` [..., C, C].

    ``a`` is nilpotent, so the inverse is the finite series sum_k (-a)^k, evaluated as the
    product (I - a)(I + a^2)(I + a^4)...: log2(C) matmuls instead of C substitution steps.
    """
    size = a.shape[-1]
    eye = mx.eye(size)
    inverse, power, span = eye - a, a, 2
    while span < size:
        power = power @ power
        inverse = inverse @ (eye + power)
        span *= 2
    return inverse


def _kda_chunk(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    scale: float,
) -> tuple[mx.array, mx.array]:
    """The KDA recurrence over one chunk of C positions, in closed form.

    q, k, g [H, C, K]; v [H, C, V]; beta [H, C]; state [H, K, V]. With B_t the cumulative
    decay (sum of g up to t), the deltas solve (I + A) D = beta (V - (K e^B) S) where
    A[t, s] = beta_t sum_c k_t,c k_s,c e^(B_t,c - B_s,c) for s < t; then
    O = scale ((Q e^B) S + M D) with M[t, s] the same sum over q_t for s <= t, and
    S' = e^(B_last) S + (K e^(B_last - B))^T D. Returns (O [H, C, V], S').
    """
    size = q.shape[1]
    cum = mx.cumsum(g, axis=1)
    causal = mx.array(np.tril(np.ones((size, size), dtype=bool)))[..., None]
    diff = cum[:, :, None, :] - cum[:, None, :, :]  # [H, t, s, K]
    # Zero the decay above the diagonal before exp, where the differences may overflow.
    decay = mx.where(causal, mx.exp(mx.where(causal, diff, 0.0)), 0.0)
    k_decayed = decay * k[:, None, :, :]
    qk = mx.sum(q[:, :, None, :] * k_decayed, axis=-1)  # M, lower triangle with diagonal
    kk = mx.sum(k[:, :, None, :] * k_decayed, axis=-1)
    strict = mx.array(np.tril(np.ones((size, size), dtype=np.float32), -1))
    a = beta[..., None] * kk * strict
    grow = mx.exp(cum)
    rhs = beta[..., None] * (v - (k * grow) @ state)
    delta = _unit_lower_inverse(a) @ rhs
    out = scale * ((q * grow) @ state + qk @ delta)
    last = cum[:, -1:, :]
    new_state = mx.exp(last[:, 0, :])[..., None] * state
    new_state = new_state + mx.swapaxes(k * mx.exp(last - cum), 1, 2) @ delta
    return out, new_state


def kda_scan(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """``ggml_gated_delta_net`` with per-channel gates, over any number of positions.

    q, k, g [H, T, K]; v [H, T, V]; beta [H, T]; state [H, K, V] (key-major). Returns the
    outputs [H, T, V] (scaled by 1/sqrt(V)) and the state after the last position.
    """
    scale = 1.0 / math.sqrt(v.shape[-1])
    outs = []
    for c0 in range(0, q.shape[1], _KDA_CHUNK):
        c1 = c0 + _KDA_CHUNK
        out, state = _kda_chunk(
            q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], g[:, c0:c1], beta[:, c0:c1], state, scale
        )
        outs.append(out)
    return (outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1)), state


def _l2_norm(x: mx.array) -> mx.array:
    """x / sqrt(sum(x^2) + eps) over the last axis, computed as llama.cpp's
    ``build_gdn_l2_norm`` does (an RMS norm with eps / n, times 1 / sqrt(n))."""
    n = x.shape[-1]
    return rms_norm(x, None, KDA_L2_EPS / n) * (1.0 / math.sqrt(n))


class _ConvTaps:
    """The conv weights [3, inner, kernel] as one [3, 1, inner] array per tap, made and
    evaluated once for the weights loaded (slicing them on every call was two primitives a
    tap). A plain object, so that the taps stay out of the module's parameter tree."""

    def __init__(self, conv: mx.array):
        self.source = conv
        self.taps = [conv[:, None, :, i] for i in range(conv.shape[-1])]
        mx.eval(self.taps)

    def of(self, conv: mx.array) -> list[mx.array]:
        """The taps of ``conv``: the stored ones while it is the loaded array (weights that
        training replaced are sliced as they are)."""
        if conv is self.source:
            return self.taps
        return [conv[:, None, :, i] for i in range(conv.shape[-1])]


class KDA(nn.Module):
    """A Kimi-Delta-Attention layer (llama.cpp ``build_kda_layer``).

    ``prefix``: its block (``blk.N``); ``heads`` of width ``head_dim``; ``conv_kernel``: the
    causal conv's width; ``gate_lower_bound``: -inf for the softplus decay; ``eps``: the output
    norm's; ``rollback``: how many positions fed in decode tiles a state can be rolled back by
    (the cache keeps a recurrent state and conv rows for each).
    """

    def __init__(
        self,
        w: Weights,
        prefix: str,
        *,
        heads: int,
        head_dim: int,
        conv_kernel: int,
        gate_lower_bound: float,
        eps: float,
        rollback: int,
    ):
        super().__init__()
        p = prefix
        self.wqkv = [w.matrix(f"{p}.attn_{x}.weight") for x in "qkv"]
        # [3, inner, kernel]: the depthwise causal conv weights of q, k and v.
        self.conv = mx.stack([w.param(f"{p}.ssm_conv1d_{x}.weight")[:, 0] for x in "qkv"])
        self._taps = _ConvTaps(self.conv)
        self.f_a = w.matrix(f"{p}.ssm_f_a.weight")
        self.f_b = w.matrix(f"{p}.ssm_f_b.weight")
        self.dt_bias = w.param(f"{p}.ssm_dt.bias")
        self.a = w.param(f"{p}.ssm_a")  # -exp(A_log), per head
        self.w_beta = w.matrix(f"{p}.ssm_beta.weight")
        self.g_a = w.matrix(f"{p}.ssm_g_a.weight")
        self.g_b = w.matrix(f"{p}.ssm_g_b.weight")
        self.o_norm = RMSNorm(w.param(f"{p}.ssm_norm.weight"), eps)
        self.wo = w.matrix(f"{p}.attn_output.weight")
        self.heads, self.head_dim = heads, head_dim
        self.kernel = conv_kernel
        self.lower_bound = gate_lower_bound
        self.rollback = rollback

    def _input_products(self, x: mx.array, rows: int) -> list[mx.array]:
        """Every product of the layer's input x [T, D] (of its first ``rows`` rows): q, k and v,
        beta's, and the first projections of the decay and of the output gate, as one call (one
        native primitive in a decode tile)."""
        return linear_many(x, [*self.wqkv, self.w_beta, self.f_a, self.g_a], rows)

    def _cached(self, cache: KDACache) -> tuple[mx.array, mx.array, mx.array]:
        """The cache's conv rows [3, R, inner], ring of states [rollback + 1, H, K, V] and
        current state [1, H, K, V]; zeros (the history before the first position) where it has
        none yet."""
        inner = self.heads * self.head_dim
        rows = cache.conv if cache.conv is not None else mx.zeros((3, self.kernel - 1, inner))
        shape = (self.heads, self.head_dim, self.head_dim)
        ring = cache.ssm if cache.ssm is not None else mx.zeros((self.rollback + 1, *shape))
        current = cache.current if cache.current is not None else mx.zeros((1, *shape))
        return rows, ring, current

    def _decay(self, f_a_x: mx.array, rows: int) -> mx.array:
        """Per-channel log decay g [T, H, K] (llama.cpp's ``kda_g1``) from the decay's first
        projection of the input, of its first ``rows`` rows (``kernels.linear``)."""
        g = linear(f_a_x, self.f_b, rows) + self.dt_bias
        g = g.reshape(f_a_x.shape[0], self.heads, self.head_dim)
        return kda_decay(g, self.a, self.lower_bound)

    def __call__(self, x: mx.array, cache: KDACache) -> tuple[mx.array, KDACache]:
        """A chunk (prefill): x [T, D] -> (output [T, D], the new cache). The recurrence runs
        chunk-wise and keeps the final state only."""
        products = self._input_products(x, x.shape[0])
        (q, k, v, g, beta), current, conv = self._recurrence_inputs(products, cache, x.shape[0])
        out, state = kda_scan(q, k, v, g, beta, current[0])
        # A new ring, the state in its first slot: a chunk keeps no earlier states to roll
        # back to, and a prefill chunk's one allocation is nothing beside its compute.
        ring = mx.concatenate([state[None], mx.zeros((self.rollback, *state.shape))])
        new = KDACache(conv=conv, ssm=ring, current=state[None])
        return self._output(products[-1], out, x.shape[0]), new

    def steady(self, cache: KDACache) -> bool:
        """Whether ``cache`` has the shapes every later decode tile keeps (all the conv rows
        and states a rollback may need): from then on a compiled tile traces no more."""
        return (
            cache.conv is not None
            and cache.ssm is not None
            and cache.conv.shape[1] == self.kernel - 1 + self.rollback
        )

    def tile_inputs(self, cache: KDACache, n_real: int) -> tuple[mx.array, ...]:
        """What ``tile`` reads of ``cache`` besides x, all arrays (so that a compiled tile
        reads the slots of each call, not of its trace): the conv rows, the ring of states, the
        current state and the slots the tile's states go to (``ring_slots``)."""
        rows, ring, current = self._cached(cache)
        return rows, ring, current, ring_slots(cache.newest, n_real, ring.shape[0])

    def tile(
        self,
        x: mx.array,
        rows: mx.array,
        ring: mx.array,
        current: mx.array,
        slots: mx.array,
        n_real: int,
    ) -> tuple[mx.array, ...]:
        """``__call__`` of a decode tile (see ``models.base.DECODE_TILE``): the recurrence runs
        one position at a time on the first ``n_real`` rows; the padding rows get zeros.
        Between the projections, one fused operation (``kernels.kda_tile``) continuing from
        ``current``; its new states go to the ring's ``slots`` (``mx.put_along_axis``, in place
        when MLX may donate the ring, which nothing else then reads). Returns the output, the
        conv rows to keep, the ring and the last state (``KDACache.advanced``)."""
        *qkv, beta_x, f_a_x, g_a_x = self._input_products(x, n_real)
        weights = KDAWeights(
            dt_bias=self.dt_bias,
            a=self.a,
            conv=self.conv,
            norm_weight=self.o_norm.weight,
            eps=self.o_norm.eps,
            lower_bound=self.lower_bound,
            keep_rows=self.kernel - 1 + self.rollback,
        )
        decay, gate = linear(f_a_x, self.f_b, n_real), linear(g_a_x, self.g_b, n_real)
        out, conv, states = kernels.kda_tile(
            weights, qkv, beta_x, decay, gate, rows, current, _FIRST, n_real
        )
        ring = mx.put_along_axis(ring, slots, states, axis=0)
        return linear(out, self.wo, n_real), conv, ring, states[-1:]

    def _recurrence_inputs(
        self, products: list[mx.array], cache: KDACache, real: int
    ) -> tuple[tuple[mx.array, ...], mx.array, mx.array]:
        """The recurrence's inputs q, k, g [H, T, K], v [H, T, V] and beta [H, T] of the first
        ``real`` rows of the input (its ``_input_products``; the other rows' are unspecified);
        the state [1, H, K, V] it continues from; the conv rows to keep (the causal
        depthwise conv + SiLU of the projections is ``twins.kda_conv``)."""
        *qkv, beta_x, f_a_x, _ = products
        tokens, h, hd = beta_x.shape[0], self.heads, self.head_dim
        rows, _, current = self._cached(cache)
        taps = self._taps.of(self.conv)
        keep = self.kernel - 1 + self.rollback
        qkv, conv = kda_conv(mx.stack(qkv), rows, taps, real, keep)  # [3, T, inner]
        q, k, v = (mx.swapaxes(t.reshape(tokens, h, hd), 0, 1) for t in qkv)  # [H, T, hd]
        q, k = _l2_norm(q), _l2_norm(k)
        beta = mx.swapaxes(mx.sigmoid(beta_x), 0, 1)  # [H, T]
        g = mx.swapaxes(self._decay(f_a_x, real), 0, 1)
        return (q, k, v, g, beta), current, conv

    def _output(self, g_a_x: mx.array, out: mx.array, rows: int) -> mx.array:
        """The recurrence's outputs [H, T, V] normed, gated (the gate from its first projection
        of the input) and projected: [T, D] (its first ``rows`` rows)."""
        tokens, h, hd = g_a_x.shape[0], self.heads, self.head_dim
        gate = linear(g_a_x, self.g_b, rows).reshape(tokens, h, hd)
        out = self.o_norm(mx.swapaxes(out, 0, 1)) * mx.sigmoid(gate)
        return linear(out.reshape(tokens, h * hd), self.wo, rows)
