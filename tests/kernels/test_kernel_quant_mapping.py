"""Every supported type round-trips exactly: dequantizing the weight ds4mlx builds from a tensor's
bytes gives bit-for-bit the values ``gguf.quants.dequantize`` gives."""

from __future__ import annotations

from ds4mlx import kernels
from ds4mlx.gguf import quants
from ds4mlx.gguf.quants import load_weight
from ds4mlx.kernels import PackedWeight, QuantizedWeight

import mlx.core as mx
import numpy as np
import pytest
from ggml_blocks import (
    DENSE_TYPES,
    QUANTIZABLE,
    QUANTIZED_TYPES,
    quantized_normal,
    random_blocks,
    reference,
)
from gguf import GGMLQuantizationType

T = GGMLQuantizationType
SHAPES = [(6, 512), (3, 4, 256)]  # a matrix and a stack of expert matrices
EXPECTED_KIND = {
    T.Q8_0: QuantizedWeight,
    T.Q4_0: QuantizedWeight,
    T.Q4_K: QuantizedWeight,
    T.MXFP4: QuantizedWeight,
    T.Q2_K: PackedWeight,
    T.Q6_K: PackedWeight,
    T.IQ2_XXS: PackedWeight,
}
DENSE_DTYPE = {T.F32: mx.float32, T.F16: mx.float16, T.BF16: mx.bfloat16}
# "mlx": MLX's quantized layouts (Metal's native weights); "blocks": the file's blocks as
# stored (the CPU's, with its block kernels built): every quantized, F16 and BF16 matrix.
LAYOUTS = ("mlx", "blocks") if quants.cpu_keeps_blocks() else ("mlx",)


@pytest.fixture(params=LAYOUTS)
def layout(request, monkeypatch) -> str:
    if request.param == "mlx":
        monkeypatch.setattr(quants, "cpu_keeps_blocks", lambda: False)
    return request.param


def max_abs_error(weight, expected: np.ndarray) -> float:
    got = np.array(kernels.dequantize(weight))
    assert got.shape == expected.shape
    both_nan = np.isnan(got) & np.isnan(expected)
    same = (got == expected) | both_nan  # also equal infinities
    return 0.0 if same.all() else float(np.max(np.abs(np.where(same, 0, got - expected))))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("qtype", QUANTIZED_TYPES + DENSE_TYPES, ids=lambda t: t.name)
def test_native_weight_is_exact(qtype: GGMLQuantizationType, shape: tuple[int, ...], layout: str):
    raw = random_blocks(qtype, shape, seed=1)
    weight = load_weight(raw, qtype, shape, "native")
    if layout == "blocks" and qtype != T.F32:
        assert isinstance(weight, PackedWeight) and weight.qtype == qtype
    elif qtype in DENSE_TYPES:
        assert isinstance(weight, mx.array) and weight.dtype == DENSE_DTYPE[qtype]
    else:
        assert isinstance(weight, EXPECTED_KIND[qtype])
    assert tuple(weight.shape) == shape
    assert max_abs_error(weight, reference(raw, qtype, shape)) == 0.0


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_native_weight_is_exact_on_quantized_normal_weights(qtype: GGMLQuantizationType):
    shape = (8, 256)
    raw = quantized_normal(qtype, shape, seed=2)
    weight = load_weight(raw, qtype, shape, "native")
    assert max_abs_error(weight, reference(raw, qtype, shape)) == 0.0


@pytest.mark.parametrize("qtype", QUANTIZED_TYPES + DENSE_TYPES, ids=lambda t: t.name)
def test_f32_weight_is_the_reference(qtype: GGMLQuantizationType):
    shape = (4, 256)
    raw = random_blocks(qtype, shape, seed=3)
    weight = load_weight(raw, qtype, shape, "f32")
    assert isinstance(weight, mx.array) and weight.dtype == mx.float32
    assert max_abs_error(weight, reference(raw, qtype, shape)) == 0.0


def test_mxfp4_covers_every_finite_exponent():
    # One block per e8m0 exponent 0..254 with all 16 codes twice: subnormal to 2**127 scales.
    exponents = np.arange(255, dtype=np.uint8)[:, None]
    codes = np.tile(np.arange(16, dtype=np.uint8) * 0x11, (255, 1))
    raw = np.concatenate([exponents, codes], axis=1).reshape(5, -1)
    shape = (5, 51 * 32)
    expected = reference(raw, T.MXFP4, shape)
    assert max_abs_error(load_weight(raw, T.MXFP4, shape, "native"), expected) == 0.0


def test_quantized_vectors_and_empty_tensors_fall_back_to_float32():
    raw = random_blocks(T.Q8_0, (64,), seed=4)
    weight = load_weight(raw, T.Q8_0, (64,), "native")
    assert isinstance(weight, mx.array) and weight.dtype == mx.float32
    assert max_abs_error(weight, reference(raw, T.Q8_0, (64,))) == 0.0
    empty = load_weight(np.zeros((0, 34), dtype=np.uint8), T.Q8_0, (0, 32), "native")
    assert isinstance(empty, mx.array) and empty.shape == (0, 32)


def test_unknown_weight_mode_is_refused():
    with pytest.raises(ValueError, match="weight mode 'fp8'"):
        load_weight(random_blocks(T.F32, (2, 32), seed=5), T.F32, (2, 32), "fp8")
