"""Float32 weights to the bytes of GGML's quantized blocks, for writing GGUF files.

The ``gguf`` package quantizes F32, F16, BF16, Q8_0, Q4_0 and MXFP4, but not the K-quants or
IQ2_XXS; this module adds Q2_K, Q4_K, Q6_K and IQ2_XXS, so ``quantize`` covers every type ds4mlx
reads. Each produces exactly the ``block_*`` struct of ggml-common.h, so ``gguf.quants.dequantize``
(and llama.cpp) reads the bytes back.

The scale searches follow ggml's reference quantizers in ggml-quants.c, vectorised over blocks:
each candidate scale is tried on every sub-block of a chunk at once, and each sub-block keeps its
best. Deliberate differences, none of which changes the layout:
- the sub-block scales are rounded against the float16 super-block scale actually stored (ggml
  rounds against the unrounded one, which costs accuracy when the float16 rounding is coarse);
- Q2_K minimises squared error like the other types (ggml's Q2_K minimises absolute error);
- IQ2_XXS, which ggml only quantizes with an importance matrix, has its own search (``_iq2_xxs``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
from gguf import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType
from gguf import quants as gguf_quants
from gguf.quants import IQ2_XXS

T = GGMLQuantizationType
GGUF_QUANTIZED_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.MXFP4})
GROUP_MAX_EPS = 1e-15  # ggml-quants.c: a group whose largest |x| is below this is all zero
# Blocks encoded per step: keeps the temporaries near the CPU caches (IQ2_XXS makes 32 KiB of
# grid distances per block) while each numpy call stays large enough to be efficient.
BLOCKS_PER_CHUNK = 256


class _ScaleOverflowError(ArithmeticError):
    """A block scale does not fit float16."""


def quantize(array: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """``array`` (float [..., n]) as GGML blocks of ``qtype``: uint8 [..., n / block * bytes].

    Each row is encoded on its own, so the result reshapes to the tensor's rows of blocks exactly
    as a GGUF file stores them. Raises ``ValueError`` for a type not in ``QUANTIZE_TYPES``, rows
    whose length is not a multiple of the type's block size, non-finite values, or values too
    large for the type (a float16 scale or value would overflow).
    """
    if qtype not in QUANTIZE_TYPES:
        supported = ", ".join(sorted(t.name for t in QUANTIZE_TYPES))
        raise ValueError(f"cannot quantize to {qtype.name}; supported: {supported}")
    values = np.asarray(array, dtype=np.float32)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if values.ndim == 0 or values.shape[-1] % block_size:
        raise ValueError(
            f"cannot quantize shape {list(values.shape)} to {qtype.name}: the row length (last "
            f"dimension) must be a multiple of the {qtype.name} block size {block_size}"
        )
    if not np.isfinite(values).all():
        raise ValueError(f"cannot quantize to {qtype.name}: the values include NaN or infinity")
    outer = values.shape[:-1]
    if qtype in GGUF_QUANTIZED_TYPES:
        with np.errstate(over="ignore", invalid="ignore"):  # reported below, as a ValueError
            # np.array copies: for F32 gguf returns the input itself, which must not be aliased
            encoded = np.array(gguf_quants.quantize(values, qtype), order="C").view(np.uint8)
            fits = np.isfinite(gguf_quants.dequantize(encoded, qtype)).all()
        if not fits:
            raise _too_large(values, qtype)
        return encoded.reshape(*outer, -1)
    blocks = values.reshape(-1, block_size)
    encoded = np.empty((len(blocks), type_size), dtype=np.uint8)
    encode = _ENCODERS[qtype]
    try:
        for start in range(0, len(blocks), BLOCKS_PER_CHUNK):
            chunk = slice(start, start + BLOCKS_PER_CHUNK)
            encoded[chunk] = encode(blocks[chunk])
    except _ScaleOverflowError:
        raise _too_large(values, qtype) from None
    return encoded.reshape(*outer, -1)


def _too_large(values: np.ndarray, qtype: GGMLQuantizationType) -> ValueError:
    return ValueError(
        f"cannot quantize to {qtype.name}: values up to {np.abs(values).max():.3g} overflow its "
        "float16 scales or values"
    )


# ---------------------------------------------------------------------------------------------
# Shared helpers


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, and 0 where the denominator is 0 (an all-zero group)."""
    numerator, denominator = np.broadcast_arrays(numerator, denominator)
    out = np.zeros(numerator.shape, dtype=np.float32)
    return np.divide(numerator, denominator, out=out, where=denominator != 0)


def _f16(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to the float16 a block stores (both ggml's GGML_FP32_TO_FP16 and
    numpy round to nearest even), returned as float32 for the arithmetic that follows."""
    with np.errstate(over="ignore"):  # reported just below, as a ValueError
        half = values.astype(np.float16)
    if not np.isfinite(half).all():
        raise _ScaleOverflowError
    return half.astype(np.float32)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    """float32 [B] values that are exact float16s as their little-endian bytes [B, 2]."""
    return values.astype("<f2").view(np.uint8).reshape(len(values), 2)


def _pack(fields: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """ORs the fields along ``axis`` into one integer, field i at bit ``bits * i``: how ggml puts
    several quants in a byte (or IQ2_XXS its sign fields in a uint32)."""
    count = fields.shape[axis]
    shifts = (np.arange(count, dtype=fields.dtype) * bits).reshape((count,) + (1,) * (-axis - 1))
    return np.bitwise_or.reduce(fields << shifts, axis=axis)


def _super_block_scale(values: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block of non-negative sub-block ``values`` [B, n]: (d [B], q [B, n] uint8) with
    value ~ d * q, q in 0..levels, d the float16 max / levels (as in ggml's K-quants)."""
    d = _f16(np.maximum(values.max(axis=1), 0) / levels)
    q = np.clip(np.rint(_ratio(values, d[:, None])), 0, levels)
    return d, q.astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Q2_K and Q4_K: x ~ d * sc * q - dmin * m per sub-block


def _fit_affine(
    x: np.ndarray, weights: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``x`` [m, n]: (scale, offset), offset >= 0, with x ~ scale * q - offset for
    q in 0..nmax, minimising the weighted squared error.

    ggml's ``make_qkx2_quants``: each candidate maps the row's range [min(x, 0), max(x)] onto
    ``nmax + rmin + rdelta * step`` steps, rounds, and refits scale and offset by weighted least
    squares, with the offset clamped at 0 because the block stores it unsigned.
    ggml's first candidate (the plain range mapping, not refitted) can never beat the refit of the
    same rounding, so it is only the fallback for rows no candidate can fit.
    """
    low = np.minimum(x.min(axis=1), 0)
    span = x.max(axis=1) - low
    shifted = x - low[:, None]
    sum_w = weights.sum(axis=1)
    sum_wx = (weights * x).sum(axis=1)
    sum_wx2 = (weights * x * x).sum(axis=1)
    best_scale = span / nmax
    best_min = low
    best_error = np.full(len(x), np.inf, dtype=np.float32)
    for step in range(nstep + 1):
        iscale = _ratio(np.float32(nmax + rmin + rdelta * step), span)
        q = np.clip(np.rint(shifted * iscale[:, None]), 0, nmax)
        wq = weights * q
        sum_q = wq.sum(axis=1)
        sum_q2 = (wq * q).sum(axis=1)
        sum_xq = (wq * x).sum(axis=1)
        det = sum_w * sum_q2 - sum_q * sum_q
        scale = _ratio(sum_w * sum_xq - sum_wx * sum_q, det)
        minimum = _ratio(sum_q2 * sum_wx - sum_q * sum_xq, det)
        clamped = minimum > 0
        scale = np.where(clamped, _ratio(sum_xq, sum_q2), scale)
        minimum = np.where(clamped, 0, minimum)
        # sum of w * (scale * q + minimum - x)**2, expanded
        error = (
            scale * scale * sum_q2
            + 2 * scale * minimum * sum_q
            + minimum * minimum * sum_w
            - 2 * scale * sum_xq
            - 2 * minimum * sum_wx
            + sum_wx2
        )
        better = (det > 0) & (error < best_error)
        best_scale = np.where(better, scale, best_scale)
        best_min = np.where(better, minimum, best_min)
        best_error = np.where(better, error, best_error)
    return best_scale, -best_min


def _encode_affine(
    x: np.ndarray,
    sub_block: int,
    weights: np.ndarray,
    nmax: int,
    levels: int,
    search: tuple[float, float, int],
) -> tuple[np.ndarray, ...]:
    """The shared part of Q2_K and Q4_K: (d, dmin [B], sc, m [B, subs] uint8, q [B, 256] uint8)."""
    n_blocks = len(x)
    sub = x.reshape(-1, sub_block)
    scale, offset = _fit_affine(sub, weights.reshape(-1, sub_block), nmax, *search)
    d, sc = _super_block_scale(scale.reshape(n_blocks, -1), levels)
    dmin, m = _super_block_scale(offset.reshape(n_blocks, -1), levels)
    # Requantize against the scales as stored (ggml's final pass in quantize_row_q*_K_ref).
    step = (d[:, None] * sc)[..., None]
    shift = (dmin[:, None] * m)[..., None]
    q = np.clip(np.rint(_ratio(sub.reshape(n_blocks, -1, sub_block) + shift, step)), 0, nmax)
    return d, dmin, sc, m, q.astype(np.uint8).reshape(n_blocks, QK_K)


def _q4_k(x: np.ndarray) -> np.ndarray:
    # block_q4_K: d, dmin (f16) | scales[12]: 8 (sc, m) 6-bit pairs | qs[128]: each 32 bytes hold
    # two 32-value sub-blocks, the first in the low nibbles. Follows quantize_row_q4_K_ref.
    sub = x.reshape(len(x), -1, 32)
    weights = np.sqrt((sub * sub).mean(axis=-1, keepdims=True)) + np.abs(sub)
    d, dmin, sc, m, q = _encode_affine(x, 32, weights, 15, 63, (-1.0, 0.1, 20))
    # get_scale_min_k4's layout: bytes 0-3 and 4-7 hold sc and m of sub-blocks 0-3 in 6 bits,
    # plus the top 2 bits of those of sub-blocks 4-7; bytes 8-11 hold their low 4 bits.
    scales = np.concatenate(
        [
            sc[:, :4] | (sc[:, 4:] >> 4) << 6,
            m[:, :4] | (m[:, 4:] >> 4) << 6,
            (sc[:, 4:] & 0xF) | (m[:, 4:] & 0xF) << 4,
        ],
        axis=1,
    )
    qs = _pack(q.reshape(len(x), 4, 2, 32), 4, axis=-2).reshape(len(x), -1)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), scales, qs], axis=1)


def _q2_k(x: np.ndarray) -> np.ndarray:
    # block_q2_K: scales[16]: sc | m << 4 per 16-value sub-block | qs[64]: each 32 bytes hold 128
    # values, value 32 * p + l in bits [2p, 2p + 2) of byte l | d, dmin (f16).
    # Follows quantize_row_q2_K_ref.
    d, dmin, sc, m, q = _encode_affine(x, 16, np.abs(x), 3, 15, (-0.5, 0.1, 15))
    qs = _pack(q.reshape(len(x), 2, 4, 32), 2, axis=-2).reshape(len(x), -1)
    return np.concatenate([sc | m << 4, qs, _f16_bytes(d), _f16_bytes(dmin)], axis=1)


# ---------------------------------------------------------------------------------------------
# Q6_K: x ~ d * sc * (q - 32) per 16-value sub-block, sc signed


def _fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
    """Per row of ``x`` [m, n]: the scale with x ~ scale * q, q in -nmax..nmax-1.

    ggml's ``make_qx_quants`` (rmse_type 1: weights x**2): the largest-|x| value maps to -nmax,
    the one level without a positive twin, so the scale usually comes out negative; candidates
    stretch that mapping by +-0.9 levels, and each is refit by weighted least squares, keeping the
    best fit.
    """
    weights = x * x
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    peak = np.where(np.abs(peak) < GROUP_MAX_EPS, 0, peak)
    best_scale = np.zeros(len(x), dtype=np.float32)
    best_fit = np.full(len(x), -np.inf, dtype=np.float32)
    for step in (0, *range(-9, 0), *range(1, 10)):  # ggml's order: the plain mapping first
        iscale = _ratio(np.float32(-(nmax + 0.1 * step)), peak)
        q = np.clip(np.rint(x * iscale[:, None]), -nmax, nmax - 1)
        wq = weights * q
        sum_xq = (wq * x).sum(axis=1)
        scale = _ratio(sum_xq, (wq * q).sum(axis=1))
        fit = scale * sum_xq  # the error reduction sum_xq**2 / sum_q2
        better = fit > best_fit
        best_scale = np.where(better, scale, best_scale)
        best_fit = np.where(better, fit, best_fit)
    return best_scale


def _q6_k(x: np.ndarray) -> np.ndarray:
    # block_q6_K: ql[128] low nibbles | qh[64] top 2 bits | scales[16] int8 | d (f16). Each half of
    # 128 values splits into 4 quarters of 32: quarters j and j + 2 share the low-nibble bytes
    # ql[64 * half + 32 * j + l], all four the qh byte qh[32 * half + l].
    # Follows quantize_row_q6_K_ref.
    n_blocks = len(x)
    sub = x.reshape(n_blocks, -1, 16)
    scale = _fit_symmetric(sub.reshape(-1, 16), 32).reshape(n_blocks, -1)
    peak = np.take_along_axis(scale, np.abs(scale).argmax(axis=1)[:, None], axis=1)[:, 0]
    # the largest |scale| gets sc = -128, int8's extra level (and an all-zero block d = +0, not -0)
    d = _f16(np.where(peak != 0, -peak / 128, 0))
    sc = np.clip(np.rint(_ratio(scale, d[:, None])), -128, 127)
    step = (d[:, None] * sc)[..., None]
    q = np.clip(np.rint(_ratio(sub, step)), -32, 31) + 32
    q = np.where(step != 0, q, 0).astype(np.uint8).reshape(n_blocks, 2, 4, 32)
    low, high = q & 0xF, q >> 4
    ql = _pack(low.reshape(n_blocks, 2, 2, 2, 32), 4, axis=-3)  # [block, half, j, l]
    qh = _pack(high, 2, axis=-2)  # [block, half, l]
    sc_bytes = sc.astype(np.int8).view(np.uint8)
    parts = [ql.reshape(n_blocks, -1), qh.reshape(n_blocks, -1), sc_bytes, _f16_bytes(d)]
    return np.concatenate(parts, axis=1)


# ---------------------------------------------------------------------------------------------
# IQ2_XXS: 8-value groups are signed rows of a 256-entry grid, scaled per 32-value sub-block

# Stage 1 tries these sub-block scales, as fractions of max|x| / 43 (the largest grid value).
# Below 1 the peak is clipped to the top level, which usually pays for Gaussian-like weights;
# the least-squares refit of each then decides.
IQ2_XXS_SCALE_FRACTIONS = (0.65, 0.8, 0.95, 1.1)


@cache
def _iq2_xxs_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid [256, 8] float32 of 8/25/43: ggml's iq2xxs_grid, taken from ``gguf.quants``; the
    squared norm of each row [256]; and the distance matrix [9, 256] of ``_iq2_xxs``)."""
    IQ2_XXS.init_grid()
    grid = np.asarray(IQ2_XXS.grid, dtype=np.float32).reshape(256, 8)
    norms = (grid * grid).sum(axis=1)
    return grid, norms, np.concatenate([-2 * grid.T, norms[None]])


def _iq2_xxs(x: np.ndarray) -> np.ndarray:
    # block_iq2_xxs: d (f16) | per 32-value sub-block, 8 bytes: 4 grid-row indices (one per group
    # of 8 values), then a uint32 of four 7-bit sign fields (bit i: value i negative; value 7's
    # sign makes the count of negatives even, see ksigns_iq2xs) and a 4-bit scale ls in bits
    # 28-31. Value = d * (0.5 + ls) / 4 * grid[row][i] * sign (dequantize_row_iq2_xxs).
    #
    # Search: signs as in quantize_row_iq2_xxs_impl (an odd group gives its smallest value the
    # wrong sign); then, per sub-block, a few candidate scales, each with the nearest grid row for
    # every group (by brute force over all 256 rows) and a least-squares refit; the best refit
    # sets the block's d. Finally each sub-block tries the two ls around its scale, with the
    # nearest rows for the scale as stored, and keeps the one with the least squared error.
    n_blocks = len(x)
    groups = x.reshape(n_blocks, 8, 4, 8)
    negative = groups < 0
    magnitude = np.abs(groups)
    odd = negative.sum(axis=-1) % 2 == 1
    flipped = odd[..., None] & (np.arange(8) == magnitude.argmin(axis=-1)[..., None])
    target = np.where(flipped, -magnitude, magnitude)  # what the all-positive grid rows approximate
    sign_fields = _pack((negative ^ flipped)[..., :7].astype(np.uint32), 1, axis=-1)

    grid, grid_norms, distance_matrix = _iq2_xxs_grid()
    # |scale * row - target|**2 = scale * (scale |row|**2 - 2 target . row) + |target|**2, so for
    # scale > 0 the nearest row minimises [target, scale] @ distance_matrix: one matrix product.
    target_and_scale = np.empty((*target.shape[:-1], 9), dtype=np.float32)
    target_and_scale[..., :8] = target

    def nearest_rows(scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For sub-block scales [B, 8]: each group's nearest row [B, 8, 4], and per sub-block
        the sums of target . row and of |row|**2 over its groups."""
        target_and_scale[..., 8] = scale[..., None]
        rows = (target_and_scale.reshape(-1, 9) @ distance_matrix).argmin(axis=-1)
        rows = rows.reshape(target.shape[:-1])
        sum_cross = (grid[rows] * target).sum(axis=(-2, -1))
        return rows, sum_cross, grid_norms[rows].sum(axis=-1)

    peak = target.max(axis=(-2, -1))
    best_scale = np.zeros(peak.shape, dtype=np.float32)
    best_fit = np.zeros(peak.shape, dtype=np.float32)
    for fraction in IQ2_XXS_SCALE_FRACTIONS:
        _, sum_cross, sum_norms = nearest_rows(peak * np.float32(fraction / 43))
        scale = sum_cross / sum_norms
        fit = scale * sum_cross  # the error reduction sum_cross**2 / sum_norms, if scale > 0
        better = (scale > 0) & (fit > best_fit)
        best_scale = np.where(better, scale, best_scale)
        best_fit = np.where(better, fit, best_fit)

    d = _f16(best_scale.max(axis=1) * np.float32(8 / 31))  # the largest scale gets ls = 15
    lower_ls = np.floor(_ratio(4 * best_scale, d[:, None]) - 0.5)
    best_error = np.full(peak.shape, np.inf, dtype=np.float32)
    best_ls = np.zeros(peak.shape, dtype=np.uint32)
    best_rows = np.zeros(target.shape[:-1], dtype=np.intp)
    for ls in (np.clip(lower_ls, 0, 15), np.clip(lower_ls + 1, 0, 15)):
        scale = d[:, None] * (np.float32(0.5) + ls) * np.float32(0.25)
        rows, sum_cross, sum_norms = nearest_rows(scale)
        error = scale * scale * sum_norms - 2 * scale * sum_cross  # + |target|**2
        better = error < best_error
        best_error = np.where(better, error, best_error)
        best_ls = np.where(better, ls.astype(np.uint32), best_ls)
        best_rows = np.where(better[..., None], rows, best_rows)

    packed = _pack(sign_fields, 7, axis=-1) | best_ls << 28  # [block, sub] uint32
    sub_blocks = np.concatenate(
        [best_rows.astype(np.uint8), packed.astype("<u4")[..., None].view(np.uint8)], axis=-1
    )
    return np.concatenate([_f16_bytes(d), sub_blocks.reshape(n_blocks, -1)], axis=1)


_ENCODERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    T.Q2_K: _q2_k,
    T.Q4_K: _q4_k,
    T.Q6_K: _q6_k,
    T.IQ2_XXS: _iq2_xxs,
}
QUANTIZE_TYPES = GGUF_QUANTIZED_TYPES | frozenset(_ENCODERS)
