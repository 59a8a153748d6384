"""``quants.resident_nbytes`` (memory plans) predicts exactly what ``host_weight`` holds, for every
supported type, shape kind and weights mode."""

from __future__ import annotations

import warnings

from ds4mlx.gguf.quants import SUPPORTED_TYPES, host_weight, resident_nbytes

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
SHAPES = [(512,), (3, 512), (2, 4, 512)]


def stored(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """Bytes as GGUFReader maps them: typed values for F32/F16, uint8 rows otherwise. Scales are
    kept small (random bytes would make float16 scales inf or NaN, which converts alike)."""
    if qtype in (T.F32, T.F16):
        return np.ones(shape, dtype=np.float32 if qtype == T.F32 else np.float16)
    block, size = GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1]))
    return np.zeros((rows, shape[-1] // block * size), np.uint8)


@pytest.mark.parametrize("mode", ["native", "f32"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES, key=lambda t: t.name))
def test_matches_host_weight(qtype, shape, mode):
    held = host_weight(stored(qtype, shape), qtype, shape, mode).nbytes
    assert resident_nbytes(qtype, shape, mode) == held


def test_integer_tables_are_kept_as_stored():
    assert resident_nbytes(T.I32, (1000, 6), "native") == 24000
    assert resident_nbytes(T.I32, (1000, 6), "f32") == 24000


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("qtype", [T.F16, T.Q8_0, T.Q4_0, T.Q4_K, T.Q2_K, T.Q6_K, T.MXFP4])
def test_row_codes_bytes_are_what_load_weight_attaches(qtype, shape):
    """The plan's ``row_codes_nbytes`` counts the codes (or float16 values) ``load_weight``
    keeps beside a float32 matrix for the CPU's row kernels: none for a vector, another type
    or the native mode."""
    from ds4mlx import kernels
    from ds4mlx.gguf.quants import load_weight, row_codes_nbytes

    weight = load_weight(stored(qtype, shape), qtype, shape, "f32")
    codes = kernels.matmul.codes_of(weight)
    attached = 0 if codes is None else sum(part.nbytes for part in codes.operand)
    assert row_codes_nbytes(qtype, shape, "f32") == attached
    assert row_codes_nbytes(qtype, shape, "native") == 0


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K])
def test_blocks_with_a_non_finite_scale_have_no_int8_codes(qtype):
    """A NaN float16 scale (a corrupt or odd file) gives no codes, quietly: the rows stay in
    float32 (no invalid-cast warning from casting NaN codes to int8)."""
    from ds4mlx.gguf.quants import dequantize, row_codes

    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.zeros((2, size), np.uint8)
    raw[0, :2] = np.array([np.nan], np.float16).view(np.uint8)  # the first block's d
    values = dequantize(raw, qtype, (2, block))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert row_codes(raw, qtype, values) is None
