"""Random GGML tensors of every supported type, as the bytes a GGUF file would store."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

T = GGMLQuantizationType

# Byte offsets of each block's float16 scale fields. Every other byte of these formats is a
# free bit field (codes, packed sub-scales, grid indices, signs), so random bytes plus finite
# float16 scales make random *valid* blocks, including for IQ2_XXS which gguf cannot quantize.
FLOAT16_FIELDS = {
    T.Q8_0: (0,),
    T.Q4_0: (0,),
    T.Q4_K: (0, 2),
    T.Q2_K: (80, 82),
    T.Q6_K: (208,),
    T.IQ2_XXS: (0,),
}
QUANTIZABLE = (T.Q8_0, T.Q4_0, T.MXFP4, T.BF16)  # what gguf.quants.quantize implements
QUANTIZED_TYPES = (T.Q8_0, T.Q4_0, T.Q4_K, T.MXFP4, T.Q2_K, T.Q6_K, T.IQ2_XXS)
DENSE_TYPES = (T.F32, T.F16, T.BF16)
MAX_MXFP4_EXPONENT = 254  # 255 is NaN in the OCP MX spec; MLX and ggml differ there


def _finite_float16_bits(rng: np.random.Generator, count: int) -> np.ndarray:
    bits = rng.integers(0, 2**16, size=count, dtype=np.uint16)
    exponent_all_ones = (bits & 0x7C00) == 0x7C00
    return np.where(exponent_all_ones, bits & ~np.uint16(0x4000), bits).astype(np.uint16)


def random_blocks(
    qtype: GGMLQuantizationType, shape: tuple[int, ...], seed: int, moderate: bool = False
) -> np.ndarray:
    """Random valid stored bytes (uint8 [..., row_bytes]) or elements of a tensor of ``shape``.

    Scales cover every finite float16 (every e8m0 exponent but 255), which checks exactness at
    the extremes; ``moderate`` keeps them weight-sized so matmuls neither overflow nor cancel.
    """
    rng = np.random.default_rng(seed)
    if qtype == T.F32:
        return rng.normal(size=shape).astype(np.float32)
    if qtype == T.F16:
        return rng.normal(size=shape).astype(np.float16)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype == T.BF16:
        return gguf_quants.quantize(rng.normal(size=shape).astype(np.float32), qtype)
    n_blocks = int(np.prod(shape)) // block_size
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if qtype == T.MXFP4:
        low, high = (120, 127) if moderate else (0, MAX_MXFP4_EXPONENT)
        blocks[:, 0] = rng.integers(low, high + 1, size=n_blocks)
    for offset in FLOAT16_FIELDS.get(qtype, ()):
        if moderate:
            scales = rng.uniform(-0.01, 0.01, size=n_blocks).astype(np.float16)
        else:
            scales = _finite_float16_bits(rng, n_blocks).view(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(*shape[:-1], shape[-1] // block_size * type_size)


def quantized_normal(qtype: GGMLQuantizationType, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Realistic blocks: normal weights quantized by ``gguf.quants.quantize``."""
    rng = np.random.default_rng(seed)
    return gguf_quants.quantize(rng.normal(scale=0.05, size=shape).astype(np.float32), qtype)


def reference(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """The ``gguf`` package's float32 dequantization, the ground truth for every check."""
    with np.errstate(over="ignore"):
        return np.asarray(gguf_quants.dequantize(raw, qtype), dtype=np.float32).reshape(shape)


# Values per scale of the input's 8-bit form where the CPU's blocks take integer dot products
# (``integer_dot_block``, cpu_ops/quant_blocks.h): llama.cpp's q8_0 and q8_K.
INTEGER_DOT_BLOCK = {T.Q8_0: 32, T.Q2_K: 256, T.IQ2_XXS: 256}


def integer_rounded(x: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """float32 rows as the CPU's products on ``qtype`` blocks see them: for the formats with
    integer dot products each block of the input rounded to d * round(v / d), d = its largest
    magnitude / 127 (``QuantizedRow``, cpu_ops/quant_blocks.h); other formats' rows as they are."""
    block = INTEGER_DOT_BLOCK.get(qtype)
    if block is None:
        return x
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], -1, block)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    return (np.rint(blocks * inverse) * d).reshape(x.shape).astype(np.float32)
