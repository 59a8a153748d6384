"""linear / gather_linear / take_rows agree with float64 numpy on the reference weights, for
every weight kind, and follow mx.gather_mm's (mlx-lm SwitchLinear's) calling convention."""

from __future__ import annotations

from ds4mlx import kernels
from ds4mlx.gguf.quants import load_weight
from ds4mlx.kernels import PackedWeight, twins

import mlx.core as mx
import numpy as np
import pytest
from ggml_blocks import DENSE_TYPES, QUANTIZED_TYPES, integer_rounded, random_blocks, reference
from gguf import GGMLQuantizationType

T = GGMLQuantizationType
ALL_TYPES = QUANTIZED_TYPES + DENSE_TYPES
N_EXPERTS, N_OUT, K_IN = 4, 6, 256


def weights(qtype: GGMLQuantizationType, shape: tuple[int, ...], seed: int):
    """(native weight, float64 reference) with scales kept small so sums stay well-conditioned."""
    raw = random_blocks(qtype, shape, seed, moderate=True)
    expected = reference(raw, qtype, shape).astype(np.float64)
    return load_weight(raw, qtype, shape, "native"), expected


def assert_close(got: mx.array, expected: np.ndarray, dtype=mx.float32):
    assert got.dtype == dtype
    got = np.array(got.astype(mx.float32), dtype=np.float64)
    assert got.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected))))
    tolerance = 1e-5 if dtype == mx.float32 else 1e-2
    np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance * scale)


def switch_reference(x: np.ndarray, w: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """mx.gather_mm(x, w.swapaxes(-1, -2), rhs_indices=indices), in numpy."""
    batch = np.broadcast_shapes(x.shape[:-2], indices.shape)
    x = np.broadcast_to(x, (*batch, *x.shape[-2:]))
    picked = w[np.broadcast_to(indices, batch)]  # [*batch, out, in]
    return x @ np.swapaxes(picked, -1, -2)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_linear(qtype: GGMLQuantizationType):
    weight, expected = weights(qtype, (N_OUT, 2 * K_IN), seed=10)
    x = np.random.default_rng(11).normal(size=(2, 3, 2 * K_IN))
    if isinstance(weight, PackedWeight):
        x = integer_rounded(x, qtype)  # what the CPU's integer products multiply (as llama.cpp)
    assert_close(kernels.linear(mx.array(x, dtype=mx.float32), weight), x @ expected.T)


@pytest.mark.parametrize("qtype", (T.Q8_0, T.Q4_K, T.MXFP4, T.Q6_K, T.F16), ids=lambda t: t.name)
def test_linear_keeps_half_precision_activations(qtype: GGMLQuantizationType):
    weight, expected = weights(qtype, (N_OUT, K_IN), seed=12)
    x = np.random.default_rng(13).normal(size=(5, K_IN)).astype(np.float16)
    got = kernels.linear(mx.array(x), weight)
    assert_close(got, x.astype(np.float64) @ expected.T, dtype=mx.float16)


@pytest.mark.parametrize("stack", ((N_EXPERTS,), (2, 3)), ids=str)
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_linear_on_stacked_weights_broadcasts_like_matmul(
    qtype: GGMLQuantizationType, stack: tuple[int, ...]
):
    weight, expected = weights(qtype, (*stack, N_OUT, K_IN), seed=14)
    x = np.random.default_rng(15).normal(size=(*stack, 2, K_IN))
    got = kernels.linear(mx.array(x, dtype=mx.float32), weight)
    assert_close(got, x @ np.swapaxes(expected, -1, -2))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_gather_linear_switch_glu_convention(qtype: GGMLQuantizationType):
    # mlx-lm SwitchGLU: x [tokens, in] -> expand_dims(x, (-2, -3)), indices [tokens, top_k]
    weight, expected = weights(qtype, (N_EXPERTS, N_OUT, K_IN), seed=16)
    rng = np.random.default_rng(17)
    x = rng.normal(size=(5, 1, 1, K_IN))
    indices = rng.integers(0, N_EXPERTS, size=(5, 2))
    got = kernels.gather_linear(mx.array(x, dtype=mx.float32), weight, mx.array(indices))
    assert got.shape == (5, 2, 1, N_OUT)
    assert_close(got, switch_reference(x, expected, indices))


@pytest.mark.parametrize("qtype", (T.Q4_K, T.Q2_K, T.F32), ids=lambda t: t.name)
def test_gather_linear_with_sorted_indices(qtype: GGMLQuantizationType):
    # SwitchGLU's sorted path: x [rows, 1, in] gathered in expert order, indices [rows] sorted.
    weight, expected = weights(qtype, (N_EXPERTS, N_OUT, K_IN), seed=18)
    rng = np.random.default_rng(19)
    indices = np.sort(rng.integers(0, N_EXPERTS, size=70))
    x = rng.normal(size=(70, 1, K_IN))
    got = kernels.gather_linear(
        mx.array(x, dtype=mx.float32), weight, mx.array(indices), sorted_indices=True
    )
    assert_close(got, switch_reference(x, expected, indices))


@pytest.mark.parametrize("n_indices", (2, 12), ids=("fewer-than-experts", "more-than-experts"))
@pytest.mark.parametrize("qtype", (T.Q2_K, T.Q6_K, T.IQ2_XXS), ids=lambda t: t.name)
def test_twin_gather_decodes_the_used_or_all_experts(qtype: GGMLQuantizationType, n_indices: int):
    weight, expected = weights(qtype, (N_EXPERTS, N_OUT, K_IN), seed=20)
    rng = np.random.default_rng(21)
    indices = rng.integers(0, N_EXPERTS, size=(n_indices, 1))
    x = rng.normal(size=(n_indices, 1, 3, K_IN))
    got = twins.gather_linear(mx.array(x, dtype=mx.float32), weight, mx.array(indices))
    assert_close(got, switch_reference(x, expected, indices))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_take_rows_decodes_embedding_rows(qtype: GGMLQuantizationType):
    weight, expected = weights(qtype, (N_OUT, K_IN), seed=22)
    token_ids = np.array([[5, 0], [2, 2]])
    got = kernels.take_rows(weight, mx.array(token_ids))
    assert got.shape == (2, 2, K_IN)
    np.testing.assert_array_equal(np.array(got.astype(mx.float32)), expected[token_ids])
