"""The "native" conversions Metal uses (and a CPU without its block kernels): every supported type
to MLX's own layout, exactly, in the bytes ``resident_nbytes`` plans; run here on the CPU by
turning the CPU's blocks off. Also the weight-mode choices and ``row_codes``'s exactness check."""

from __future__ import annotations

from ds4mlx import kernels
from ds4mlx.gguf import quants
from ds4mlx.gguf.quantize import quantize
from ds4mlx.kernels import PackedWeight, QuantizedWeight

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

T = GGMLQuantizationType
SHAPES = [(512,), (3, 512), (2, 3, 512)]
# type -> (kind of a matrix's HostWeight, bits, MLX quantization mode)
MATRIX_LAYOUTS = {
    T.F32: ("dense", 0, ""),
    T.F16: ("dense", 0, ""),
    T.BF16: ("bf16", 0, ""),
    T.Q8_0: ("quantized", 8, "affine"),
    T.Q4_0: ("quantized", 4, "affine"),
    T.Q4_K: ("quantized", 4, "affine"),
    T.MXFP4: ("quantized", 4, "mxfp4"),
    T.Q2_K: ("packed", 0, ""),
    T.Q6_K: ("packed", 0, ""),
    T.IQ2_XXS: ("packed", 0, ""),
}
MATRIX_DTYPES = {T.F32: mx.float32, T.F16: mx.float16, T.BF16: mx.bfloat16}


@pytest.fixture
def metal_layouts(monkeypatch):
    monkeypatch.setattr(quants, "cpu_keeps_blocks", lambda: False)


def stored(qtype: GGMLQuantizationType, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A tensor's bytes as GGUFReader maps them, from normal values where gguf can quantize the
    type, else random bytes (every bit of those formats is a free field)."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=shape).astype(np.float32)
    if qtype == T.F32:
        return values
    if qtype == T.F16:
        return values.astype(np.float16)
    if qtype in (T.Q8_0, T.Q4_0, T.MXFP4, T.BF16):
        return gguf_quants.quantize(values, qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 256, size=(*shape[:-1], shape[-1] // block * size), dtype=np.uint8)


def test_every_supported_type_has_a_layout():
    assert set(MATRIX_LAYOUTS) == quants.SUPPORTED_TYPES


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "qtype", sorted(MATRIX_LAYOUTS, key=lambda t: t.name), ids=lambda t: t.name
)
def test_native_layouts_are_exact_and_planned(metal_layouts, qtype, shape):
    raw = stored(qtype, shape)
    host = quants.host_weight(raw, qtype, shape, "native")
    is_vector = len(shape) == 1 and qtype not in quants.DENSE_TYPES
    kind, bits, mode = ("dense", 0, "") if is_vector else MATRIX_LAYOUTS[qtype]
    assert (host.kind, host.bits, host.mode, host.qtype) == (kind, bits, mode, qtype)
    assert quants.resident_nbytes(qtype, shape, "native") == host.nbytes
    weight = quants.load_weight(raw, qtype, shape, "native")
    assert tuple(weight.shape) == shape
    if kind == "quantized":
        assert isinstance(weight, QuantizedWeight)
        assert (weight.bits, weight.mode, weight.group_size) == (bits, mode, 32)
        assert (weight.biases is None) == (mode == "mxfp4")
    elif kind == "packed":
        assert isinstance(weight, PackedWeight) and weight.qtype == qtype
    else:
        assert weight.dtype == (mx.float32 if is_vector else MATRIX_DTYPES[qtype])
    with np.errstate(all="ignore"):
        expected = quants.dequantize(raw, qtype, shape)
    np.testing.assert_array_equal(np.array(kernels.dequantize(weight)), expected)


@pytest.mark.parametrize("chunk_bytes", [1, 2 * 34 * 16, 10**9])
def test_conversion_in_row_chunks_is_one_conversion(metal_layouts, monkeypatch, chunk_bytes):
    """Chunks of one row (a chunk smaller than a row still takes one), of two rows (the last
    chunk short), or all rows at once give the same arrays."""
    shape = (5, 512)
    raw = stored(T.Q8_0, shape, seed=3)
    monkeypatch.setattr(quants, "CHUNK_BYTES", chunk_bytes)
    weight = quants.load_weight(raw, T.Q8_0, shape, "native")
    np.testing.assert_array_equal(
        np.array(kernels.dequantize(weight)), quants.dequantize(raw, T.Q8_0, shape)
    )


def test_an_empty_matrix_is_dequantized(metal_layouts):
    raw = np.zeros((0, 34), np.uint8)
    host = quants.host_weight(raw, T.Q8_0, (0, 32), "native")
    assert host.kind == "dense" and host.parts[0].shape == (0, 32)
    assert quants.resident_nbytes(T.Q8_0, (0, 32), "native") == 0
    assert not quants.keeps_blocks(T.Q8_0, (0, 32), "native")


def test_metal_defaults_to_native_whatever_the_size(monkeypatch):
    monkeypatch.setattr(quants, "DEFAULT_WEIGHT_MODE", "native")
    assert quants.default_weight_mode(1) == "native"
    assert quants.default_weight_mode(None) == "native"


def test_a_cpu_without_block_kernels_defaults_to_float32(monkeypatch, metal_layouts):
    monkeypatch.setattr(quants, "DEFAULT_WEIGHT_MODE", "f32")
    assert quants.default_weight_mode(None) == "f32"
    assert quants.default_weight_mode(quants.CPU_FLOAT32_MODEL_BYTES + 1) == "f32"


def test_an_unknown_weight_mode_is_refused():
    with pytest.raises(ValueError, match=r"^weight mode 'f16': expected one of f32, native$"):
        quants.host_weight(stored(T.F32, (2, 32)), T.F32, (2, 32), "f16")


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K])
def test_values_that_are_not_the_blocks_have_no_codes(qtype):
    """Codes are kept only when they give back the float32 values exactly: values shifted by a
    fraction of a step round to codes that do not."""
    block = GGML_QUANT_SIZES[qtype][0]
    raw = stored(qtype, (2, block), seed=1)
    values = quants.dequantize(raw, qtype, (2, block))
    assert quants.row_codes(raw, qtype, values) is not None
    shifted = values.copy()
    shifted[1, 5] = np.nextafter(shifted[1, 5], np.float32(np.inf))
    assert quants.row_codes(raw, qtype, shifted) is None


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_K, T.Q2_K, T.Q6_K], ids=lambda t: t.name)
def test_quantized_matrices_have_int8_codes_that_give_their_values(qtype):
    """Real blocks (quantized from normal values, with non-zero scales and minimums) have codes:
    each group's scale and bias, read from the block's own fields, give back every value."""
    shape = (3, 512)
    raw = quantize(np.random.default_rng(4).normal(size=shape).astype(np.float32), qtype)
    values = quants.dequantize(raw, qtype, shape)
    found = quants.row_codes(raw, qtype, values)
    assert found is not None
    codes, scale, bias = found
    group = shape[-1] // scale.shape[-1]
    assert group == {T.Q2_K: 16, T.Q6_K: 16}.get(qtype, 32)
    rebuilt = np.repeat(scale, group, -1) * codes.astype(np.float32) + np.repeat(bias, group, -1)
    np.testing.assert_array_equal(rebuilt, values)
    assert codes.dtype == np.int8 and np.abs(codes).max() > 1
