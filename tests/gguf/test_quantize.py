"""``quantize``: ggml's block layouts, checked through the ``gguf`` package's reference dequantizer
(and so the layout llama.cpp reads), at ggml's own accuracy."""

from __future__ import annotations

from ds4mlx.gguf import SUPPORTED_TYPES
from ds4mlx.gguf.quantize import QUANTIZE_TYPES, quantize

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

T = GGMLQuantizationType
TYPES = sorted(QUANTIZE_TYPES, key=lambda t: t.name)
OWN_TYPES = [T.Q2_K, T.Q4_K, T.Q6_K, T.IQ2_XXS]  # the ones gguf cannot quantize
FLOAT16_SCALED = [T.F16, T.Q8_0, T.Q4_0, T.Q2_K, T.Q4_K, T.Q6_K, T.IQ2_XXS]

# Relative RMS error of ggml's own quantizers on N(0, 1) weights (1M values, ggml_quantize_chunk
# from llama.cpp's libggml without an importance matrix; IQ2_XXS, which needs one, with all-ones).
# Ours must stay within 10% of them; F32, F16, BF16 bound their rounding instead.
GGML_RELATIVE_RMS = {
    T.F32: 0.0,
    T.F16: 2.0**-11,
    T.BF16: 2.0**-8,
    T.Q8_0: 0.0054,
    T.Q4_0: 0.086,
    T.MXFP4: 0.115,
    T.Q6_K: 0.0177,
    T.Q4_K: 0.0713,
    T.Q2_K: 0.297,
    T.IQ2_XXS: 0.344,
}


def gaussian(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def round_trip(x: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    return np.asarray(gguf_quants.dequantize(quantize(x, qtype), qtype), dtype=np.float32)


def relative_rms(approximation: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(np.mean((approximation - x) ** 2) / np.mean(x**2)))


def test_quantizes_exactly_the_types_ds4mlx_reads():
    assert QUANTIZE_TYPES == SUPPORTED_TYPES


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("magnitude", [1.0, 1e-3, 1e3])
def test_round_trip_error_matches_ggml(qtype: GGMLQuantizationType, magnitude: float):
    x = gaussian((64, 1024)) * np.float32(magnitude)
    encoded = quantize(x, qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    assert encoded.dtype == np.uint8 and encoded.shape == (64, 1024 // block_size * type_size)
    assert relative_rms(round_trip(x, qtype), x) <= 1.1 * GGML_RELATIVE_RMS[qtype]


@pytest.mark.parametrize("qtype", OWN_TYPES, ids=lambda t: t.name)
def test_deterministic_and_row_by_row(qtype: GGMLQuantizationType):
    # 3 * 400 blocks: more than one internal chunk, and chunks that straddle rows
    x = gaussian((3, 400 * 256), seed=1)
    encoded = quantize(x, qtype)
    np.testing.assert_array_equal(quantize(x, qtype), encoded)
    for row in range(3):
        np.testing.assert_array_equal(quantize(x[row], qtype), encoded[row])
    stacked = x.reshape(3, 2, 200 * 256)
    np.testing.assert_array_equal(quantize(stacked, qtype).reshape(encoded.shape), encoded)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_all_zero_blocks_stay_exactly_zero(qtype: GGMLQuantizationType):
    x = gaussian((4, 1024), seed=2)
    x[1] = 0  # a whole row
    x[2, 256:512] = 0  # one super-block amid others
    decoded = round_trip(x, qtype)
    assert np.all(decoded[1] == 0) and np.all(decoded[2, 256:512] == 0)
    assert relative_rms(decoded, x) <= 1.1 * GGML_RELATIVE_RMS[qtype]
    if qtype in OWN_TYPES:  # like ggml, an all-zero block is all-zero bytes
        assert not quantize(np.zeros((1, 256), np.float32), qtype).any()


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_zero_sub_blocks_of_k_quants_stay_exactly_zero(qtype: GGMLQuantizationType):
    x = gaussian((2, 512), seed=3)
    x[:, 32:64] = 0  # a 32-value sub-block (two of Q2_K's and Q6_K's 16-value ones)
    assert np.all(round_trip(x, qtype)[:, 32:64] == 0)


def test_constant_and_one_signed_blocks():
    ramp = np.linspace(0.5, 2.0, 256, dtype=np.float32)
    for x in (np.full((1, 256), -1.5, np.float32), ramp[None], -ramp[None]):
        for qtype in OWN_TYPES:
            assert relative_rms(round_trip(x, qtype), x) <= GGML_RELATIVE_RMS[qtype]


def test_iq2_xxs_odd_sign_count_gives_the_wrong_sign_to_the_smallest_value():
    # 7 stored sign bits per 8 values, the 8th implied by an even count of negatives: a group with
    # one negative value must misrepresent one sign, and (as in ggml) that is its smallest value.
    group = np.array([3.0, -2.5, 2.0, 2.8, 0.1, 3.1, 2.2, 2.6], dtype=np.float32)
    x = np.tile(group, 32)[None]
    decoded = round_trip(x, T.IQ2_XXS).reshape(32, 8)
    expected_signs = np.sign(group)
    expected_signs[4] = -1
    np.testing.assert_array_equal(np.sign(decoded), np.broadcast_to(expected_signs, (32, 8)))


@pytest.mark.parametrize("qtype", OWN_TYPES + [T.Q8_0, T.MXFP4], ids=lambda t: t.name)
def test_row_length_must_be_a_multiple_of_the_block(qtype: GGMLQuantizationType):
    block_size = GGML_QUANT_SIZES[qtype][0]
    with pytest.raises(ValueError, match=rf"multiple of the {qtype.name} block size {block_size}"):
        quantize(np.zeros((2, block_size + 16), np.float32), qtype)
    with pytest.raises(ValueError, match="row length"):
        quantize(np.float32(1.0), qtype)


def test_rejects_unsupported_types_and_non_finite_values():
    with pytest.raises(ValueError, match=r"cannot quantize to Q5_K; supported: BF16, F16, F32"):
        quantize(np.zeros(256, np.float32), T.Q5_K)
    for bad in (np.nan, np.inf):
        x = np.zeros(256, np.float32)
        x[7] = bad
        with pytest.raises(ValueError, match="NaN or infinity"):
            quantize(x, T.Q4_K)


@pytest.mark.parametrize("qtype", FLOAT16_SCALED, ids=lambda t: t.name)
def test_values_beyond_float16_scales_are_refused(qtype: GGMLQuantizationType):
    x = gaussian((1, 256)) * np.float32(1e9)
    with pytest.raises(ValueError, match=rf"to {qtype.name}: values up to .* overflow"):
        quantize(x, qtype)


def test_does_not_alias_its_input():
    x = gaussian((2, 32))
    encoded = quantize(x, T.F32)
    x[:] = 0
    assert encoded.view(np.float32).any()


@pytest.mark.parametrize("qtype", FLOAT16_SCALED, ids=lambda t: t.name)
def test_one_value_beyond_float16_scales_among_ordinary_ones_is_refused(qtype):
    """The overflow is in one block of one row: the others encode fine, the call still fails,
    naming the largest value."""
    x = gaussian((2, 512))
    x[1, 300] = 1e9
    with pytest.raises(
        ValueError, match=rf"^cannot quantize to {qtype.name}: values up to 1e\+09 "
    ):
        quantize(x, qtype)


# The search's accuracy when this file last checked it against ggml's (relative RMS error, as
# ``relative_rms``), on four kinds of rows: Gaussian and Laplace weights, all-positive ones,
# and blocks of 16 equal values. Two-sided and tight (1e-4, far above the rounding differences
# between platforms): a change to a scale search must show here, and a deliberate one updates
# these numbers.
SEARCH_RMS = {
    (T.Q2_K, "gaussian"): 0.28717750310897827,
    (T.Q2_K, "laplace"): 0.32758113741874695,
    (T.Q2_K, "positive"): 0.1301788091659546,
    (T.Q2_K, "steps"): 0.17042578756809235,
    (T.Q4_K, "gaussian"): 0.07195668667554855,
    (T.Q4_K, "laplace"): 0.08403578400611877,
    (T.Q4_K, "positive"): 0.027692172676324844,
    (T.Q4_K, "steps"): 0.010107739828526974,
    (T.Q6_K, "gaussian"): 0.017779286950826645,
    (T.Q6_K, "laplace"): 0.02165277488529682,
    (T.Q6_K, "positive"): 0.012409541755914688,
    (T.Q6_K, "steps"): 0.0034343686420470476,
    (T.IQ2_XXS, "gaussian"): 0.32833993434906006,
    (T.IQ2_XXS, "laplace"): 0.35382798314094543,
    (T.IQ2_XXS, "positive"): 0.29084402322769165,
    (T.IQ2_XXS, "steps"): 0.35341566801071167,
}
SEARCH_INPUTS = {
    "gaussian": lambda: np.random.default_rng(0).standard_normal((64, 1024)),
    "laplace": lambda: np.random.default_rng(5).laplace(size=(64, 1024)),
    "positive": lambda: np.random.default_rng(6).uniform(0.1, 1.0, size=(64, 1024)),
    "steps": lambda: np.repeat(np.random.default_rng(7).uniform(-2, 2, size=(64, 64)), 16, axis=1),
}


@pytest.mark.parametrize(("qtype", "kind"), list(SEARCH_RMS), ids=lambda v: getattr(v, "name", v))
def test_the_scale_search_keeps_its_measured_accuracy(qtype, kind):
    x = SEARCH_INPUTS[kind]().astype(np.float32)
    assert relative_rms(round_trip(x, qtype), x) == pytest.approx(SEARCH_RMS[qtype, kind], rel=1e-4)
