"""Shared model pieces against direct ports of the ggml CPU loops they reproduce."""

from __future__ import annotations

import math

from ds4mlx.kernels import swiglu
from ds4mlx.kernels.twins import sinkhorn
from ds4mlx.models.mhc import HyperHead
from ds4mlx.models.moe import GatingFunc, gate_probs, route
from ds4mlx.models.rope import RoPE, RopeConfig

import mlx.core as mx
import numpy as np
import pytest

f32 = np.float32


def ggml_rope(
    x: np.ndarray, pos: np.ndarray, cfg: RopeConfig, n_offs: int, forward: bool = True
) -> np.ndarray:
    """ggml_compute_forward_rope_flt for x [T, H, D], written as the C code is (float32)."""
    n_dims, base = cfg.n_dims, cfg.base
    theta_scale = f32(base ** (-2.0 / n_dims))

    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(cfg.n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = 0.0, 0.0
    if cfg.ext_factor != 0.0:
        low = max(0.0, math.floor(corr_dim(cfg.beta_fast)))
        high = min(n_dims - 1.0, math.ceil(corr_dim(cfg.beta_slow)))
    out = x.copy()
    for t in range(x.shape[0]):
        cache = np.zeros(x.shape[-1], dtype=np.float32)
        theta = f32(pos[t])
        for i0 in range(0, x.shape[-1], 2):
            theta_interp = f32(cfg.freq_scale) * theta
            th, mscale = theta_interp, f32(cfg.attn_factor)
            if cfg.ext_factor != 0.0:
                y = (i0 // 2 - low) / max(0.001, high - low)
                ramp_mix = f32((1 - min(1.0, max(0.0, y))) * cfg.ext_factor)
                th = theta_interp * (1 - ramp_mix) + theta * ramp_mix
                mscale = f32(mscale * (1.0 + 0.1 * math.log(1.0 / cfg.freq_scale)))
            cache[i0] = f32(math.cos(th)) * mscale
            cache[i0 + 1] = f32(math.sin(th)) * mscale * (1 if forward else -1)
            theta = f32(theta * theta_scale)
        for h in range(x.shape[1]):
            src, dst = x[t, h, n_offs:], out[t, h, n_offs:]
            for i0 in range(0, n_dims, 2):
                if cfg.interleaved:
                    a, b = i0, i0 + 1
                else:
                    a, b = i0 // 2, i0 // 2 + n_dims // 2
                c, s = cache[i0], cache[i0 + 1]
                dst[a] = src[a] * c - src[b] * s
                dst[b] = src[a] * s + src[b] * c
    return out


ROPES = {
    "plain": RopeConfig(n_dims=16, base=10000.0),
    "yarn": RopeConfig(
        n_dims=16,
        base=160000.0,
        freq_scale=1 / 16,
        ext_factor=1.0,
        attn_factor=1 / (1 + 0.1 * math.log(16)),
        n_ctx_orig=65536,
    ),
    "neox": RopeConfig(n_dims=16, base=10000.0, freq_scale=0.25, interleaved=False),
}


@pytest.mark.parametrize("name", list(ROPES))
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_matches_ggml(name, inverse):
    cfg = ROPES[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, 40)).astype(np.float32)
    # Small positions: ggml's float32 angle recurrence drifts by ~1e-3 rad near 1e5.
    pos = np.array([0, 1, 7, 300, 4099])
    rope = RoPE(cfg)
    ours = rope.apply(mx.array(x), rope.angles(pos), offset=24, inverse=inverse)
    ref = ggml_rope(x, pos, cfg, n_offs=24, forward=not inverse)
    np.testing.assert_allclose(np.array(ours), ref, rtol=2e-4, atol=2e-4)
    if inverse:
        forward = rope.apply(mx.array(x), rope.angles(pos), offset=24)
        back = rope.apply(forward, rope.angles(pos), offset=24, inverse=True)
        np.testing.assert_allclose(np.array(back), x, rtol=1e-5, atol=1e-5)


def ggml_hc_comb(logits: np.ndarray, eps: float, iters: int) -> np.ndarray:
    """ggml_compute_forward_dsv4_hc_comb_f32 on comb logits [T, src, dst]."""
    out = np.empty_like(logits)
    hc = logits.shape[-1]
    for t in range(logits.shape[0]):
        c = logits[t].astype(np.float64)
        c = np.exp(c - c.max(axis=1, keepdims=True))
        c = c / c.sum(axis=1, keepdims=True) + eps
        for it in range(2 * iters - 1):
            axis = 0 if it % 2 == 0 else 1  # columns (over src) first, then rows (over dst)
            c = c / (c.sum(axis=axis, keepdims=True) + eps)
        out[t] = c
        assert c.shape == (hc, hc)
    return out


@pytest.mark.parametrize("iters", [1, 2, 20])
def test_sinkhorn_matches_ggml(iters):
    logits = np.random.default_rng(1).standard_normal((6, 4, 4)).astype(np.float32) * 3
    ours = sinkhorn(mx.array(logits), iters, 1e-6)
    np.testing.assert_allclose(
        np.array(ours), ggml_hc_comb(logits, 1e-6, iters), rtol=1e-5, atol=1e-6
    )


def test_swiglu_clamp():
    gate = np.array([-30.0, -1.0, 0.5, 12.0], dtype=np.float32)
    up = np.array([20.0, -15.0, 2.0, 3.0], dtype=np.float32)
    g = np.minimum(gate, 10.0)
    ref = g / (1 + np.exp(-g)) * np.clip(up, -10.0, 10.0)
    np.testing.assert_allclose(
        np.array(swiglu(mx.array(gate), mx.array(up), 10.0)), ref, rtol=1e-5, atol=1e-9
    )
    plain = gate / (1 + np.exp(-gate)) * up
    np.testing.assert_allclose(
        np.array(swiglu(mx.array(gate), mx.array(up))), plain, rtol=1e-5, atol=1e-9
    )


def test_route_bias_selects_weights_stay_unbiased():
    logits = mx.array([[0.0, 3.0, -2.0, 25.0]])
    probs = gate_probs(logits, GatingFunc.SQRT_SOFTPLUS)
    expected = np.sqrt(
        np.where(np.array(logits) > 20, np.array(logits), np.log1p(np.exp(np.array(logits))))
    )
    np.testing.assert_allclose(np.array(probs), expected, rtol=1e-6)
    bias = mx.array([10.0, 0.0, 0.0, -10.0])  # selects expert 0 over expert 3
    idx, w = route(probs, 2, func=GatingFunc.SQRT_SOFTPLUS, bias=bias, normalize=True, scale=1.5)
    assert sorted(np.array(idx)[0].tolist()) == [0, 1]
    p = expected[0, np.array(idx)[0]]
    np.testing.assert_allclose(np.array(w)[0], p / p.sum() * 1.5, rtol=1e-6)
    fixed = mx.array([[3, 2]])
    idx, w = route(
        probs, 2, func=GatingFunc.SQRT_SOFTPLUS, selected=fixed, normalize=False, scale=1.0
    )
    np.testing.assert_array_equal(np.array(idx), [[3, 2]])
    np.testing.assert_allclose(np.array(w)[0], expected[0, [3, 2]], rtol=1e-6)


def test_the_head_collapse_reads_flat_streams_as_nested_ones():
    """A block's decode tile leaves the streams flat [T, hc * D] on the GPU; a drafter's head
    (DSpark's hc_head after its stages) collapses them as it does [T, hc, D]."""
    rng = np.random.default_rng(7)
    hc, dim = 4, 32
    head = HyperHead(
        mx.array(rng.standard_normal((hc, hc * dim)).astype(np.float32)),
        mx.array(rng.standard_normal(hc).astype(np.float32)),
        mx.array(np.array([0.5], np.float32)),
        hc_eps=1e-6,
        norm_eps=1e-6,
    )
    streams = mx.array(rng.standard_normal((3, hc, dim)).astype(np.float32))
    nested = head(streams)
    assert nested.shape == (3, dim)
    assert mx.array_equal(head(streams.reshape(3, hc * dim)), nested).item()
