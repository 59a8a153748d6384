"""From a GGUF tensor's stored bytes to a weight ``kernels.linear`` accepts.

Two modes:
- "f32": float32 ``mx.array`` via ``gguf.quants.dequantize`` (the reference). The CPU default:
  MLX's CPU backend runs fp16 and quantized matmuls without BLAS, so they are much slower.
- "native": keep the file's precision. On the CPU, with its block kernels built
  (``kernels/cpu_ops/quant_blocks.cpp``), every quantized, F16 or BF16 matrix stays the file's
  blocks as stored (``PackedWeight``, one copy, mapped from the file by ``GGUFFile``): the CPU
  default then. On Metal F32/F16/BF16 stay dense in their dtype; Q8_0, Q4_0, Q4_K and MXFP4 are
  re-laid out, exactly, into MLX's quantized formats (``QuantizedWeight``); Q2_K, Q6_K and
  IQ2_XXS keep their blocks (``PackedWeight``) for the kernels. The Metal default.
Quantized tensors with fewer than 2 dims or no elements (never matmul weights) are dequantized to
float32.

The exact mappings, per 32-value group (MLX's "affine" value is ``scale * q + bias``):
- Q8_0 (d, int8 q):        q + 128 as 8 bits, scale d, bias -128 d
- Q4_0 (d, 4-bit q):       q as 4 bits, scale d, bias -8 d
- Q4_K (d, dmin, 6-bit sc, m per 32 values): q as 4 bits, scale d*sc, bias -dmin*m
- MXFP4 (e8m0 e, e2m1 q):  MLX "mxfp4" with the same e and q, nibbles reordered
Affine scales and biases are float32: MLX evaluates ``scale * q + bias`` in the scales' dtype, and
in float16 products like d*q (Q8_0: up to 19 significant bits) or d*sc (Q4_K: 17) would round.
This costs 2 bits per weight over the 32-value groups (float16 would cost 1).

Conversion streams over row chunks of the memory map, so only one tensor's output (plus a chunk
of temporaries) is ever in memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from ds4mlx.kernels import PackedWeight, QuantizedWeight, RowCodes, Weight, attach_codes
from ds4mlx.kernels.metal import metal_available
from ds4mlx.kernels.native import native_ops
from ds4mlx.kernels.twins import PACKED_TYPES

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

T = GGMLQuantizationType
DENSE_TYPES = frozenset({T.F32, T.F16, T.BF16})
AFFINE_TYPES = frozenset({T.Q8_0, T.Q4_0, T.Q4_K})
SUPPORTED_TYPES = DENSE_TYPES | AFFINE_TYPES | {T.MXFP4} | PACKED_TYPES
# What the CPU's block kernels compute on as stored (quant_blocks.h ``BlockType``).
BLOCK_TYPES = frozenset({T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_K, T.MXFP4}) | PACKED_TYPES
WEIGHT_MODES = ("f32", "native")
# Metal's default; the CPU's is ``default_weight_mode()`` (it depends on a build).
DEFAULT_WEIGHT_MODE = "native" if metal_available() else "f32"


@cache
def cpu_keeps_blocks() -> bool:
    """Whether "native" matrices stay the file's blocks as stored: on the CPU, when its block
    kernels are built (Metal keeps MLX's quantized layouts; without a compiler the twins cannot
    read every format)."""
    return not metal_available() and native_ops() is not None


#: "auto" on the CPU expands a model to float32 when its tensors take at most this much as
#: float32: the fused decode steps (a whole mHC site, the MoE tile, every product of one input
#: in one call) read float32 matrices only, so on its blocks ds4-tiny decodes a token in 407
#: primitives instead of 166, at 0.8-0.9x the speed, to save a float copy of 58 MiB. Larger
#: models keep their blocks as stored: one copy of each weight (issue 35).
CPU_FLOAT32_MODEL_BYTES = 2**30


def default_weight_mode(float32_bytes: int | None = None) -> str:
    """ "native" with Metal. On the CPU: "native" (the blocks as stored) when its block kernels
    are built and the model is larger than ``CPU_FLOAT32_MODEL_BYTES`` as float32 (or its size
    is not given); "f32" otherwise."""
    if DEFAULT_WEIGHT_MODE == "native":
        return "native"
    small = float32_bytes is not None and float32_bytes <= CPU_FLOAT32_MODEL_BYTES
    return "native" if cpu_keeps_blocks() and not small else "f32"


def float32_bytes(shapes: Iterable[Sequence[int]]) -> int:
    """What tensors of ``shapes`` take expanded to float32."""
    return sum(4 * math.prod(shape) for shape in shapes)


def keeps_blocks(qtype: GGMLQuantizationType, shape: Sequence[int], mode: str) -> bool:
    """Whether a tensor loads as its blocks as stored (``PackedWeight``) on the CPU."""
    is_matrix = len(shape) >= 2 and math.prod(shape) > 0
    return mode == "native" and is_matrix and qtype in BLOCK_TYPES and cpu_keeps_blocks()


def block_bytes_shape(qtype: GGMLQuantizationType, shape: Sequence[int]) -> tuple[int, ...]:
    """The uint8 shape [..., row_bytes] of a tensor's blocks (numpy order ``shape``)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    return (*shape[:-1], shape[-1] // block * type_size)


GROUP_SIZE = 32
CHUNK_BYTES = 32 * 2**20  # raw bytes converted per step: bounds the temporaries


def dequantize(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor as float32 numpy [shape], through the ``gguf`` package's reference code."""
    out = gguf_quants.dequantize(raw, qtype)
    return np.ascontiguousarray(out, dtype=np.float32).reshape(shape)


@dataclass(frozen=True)
class HostWeight:
    """A converted weight still in numpy memory: building one needs no MLX call, so reader
    threads can (the streamed expert store does), and ``to_device`` then makes the weight.

    ``parts``: (values,) for "dense" and "bf16" (uint16 bits), (blocks,) for "packed",
    (packed, scales[, biases]) for "quantized"; each already in the weight's final shape.
    """

    kind: str
    parts: tuple[np.ndarray, ...]
    qtype: GGMLQuantizationType
    bits: int = 0
    mode: str = ""

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)


def host_weight(
    raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...], mode: str | None = None
) -> HostWeight:
    """The conversion half of ``load_weight``, in numpy only (see ``HostWeight``)."""
    mode = mode or default_weight_mode()
    if mode not in WEIGHT_MODES:
        raise ValueError(f"weight mode {mode!r}: expected one of {', '.join(WEIGHT_MODES)}")
    if keeps_blocks(qtype, shape, mode):
        return HostWeight(
            "packed", (raw.view(np.uint8).reshape(block_bytes_shape(qtype, shape)),), qtype
        )
    is_matrix = len(shape) >= 2 and raw.size > 0
    if mode == "f32" or (qtype not in DENSE_TYPES and not is_matrix):
        return HostWeight("dense", (dequantize(raw, qtype, shape),), qtype)
    if qtype == T.BF16:  # numpy has no bfloat16: move the bits, reinterpret them in MLX
        return HostWeight("bf16", (raw.view(np.uint16).reshape(shape),), qtype)
    if qtype in DENSE_TYPES:
        return HostWeight("dense", (raw.reshape(shape),), qtype)
    if qtype in PACKED_TYPES:
        return HostWeight("packed", (raw,), qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows = raw.reshape(-1, shape[-1] // block_size, type_size)
    convert, bits, quant_mode = _CONVERTERS[qtype]
    parts = _convert_in_chunks(rows, convert)
    outer = shape[:-1]
    return HostWeight(
        "quantized", tuple(p.reshape(*outer, -1) for p in parts), qtype, bits, quant_mode
    )


def resident_nbytes(qtype: GGMLQuantizationType, shape: Sequence[int], mode: str) -> int:
    """Bytes ``host_weight(raw, qtype, shape, mode)`` holds, computed without converting
    anything (memory plans): the same cases in the same order. ``mode`` must be resolved
    ("f32" or "native")."""
    n = math.prod(shape)
    is_matrix = len(shape) >= 2 and n > 0
    if qtype not in SUPPORTED_TYPES:  # integer tables (hash routing): kept as stored
        block, type_size = GGML_QUANT_SIZES[qtype]
        return n // block * type_size
    if mode == "f32" or (qtype not in DENSE_TYPES and not is_matrix):
        return 4 * n
    if qtype in DENSE_TYPES or qtype in PACKED_TYPES or keeps_blocks(qtype, shape, mode):
        block, type_size = GGML_QUANT_SIZES[qtype]
        return n // block * type_size
    groups = n // GROUP_SIZE
    if qtype == T.MXFP4:
        return n // 2 + groups  # e2m1 codes, one e8m0 byte a group
    bits = _CONVERTERS[qtype][1]
    return n * bits // 8 + 2 * 4 * groups  # codes, float32 scale and bias a group


def row_codes_nbytes(qtype: GGMLQuantizationType, shape: Sequence[int], mode: str) -> int:
    """Bytes ``load_weight`` keeps besides ``resident_nbytes`` for the CPU's row kernels (the
    codes of ``row_codes``, or an F16 matrix's float16 values), in the float32 mode; an upper
    bound, since a tensor whose codes fail the exactness check keeps none."""
    n = math.prod(shape)
    if mode != "f32" or len(shape) < 2 or n == 0:
        return 0
    if qtype == T.F16:
        return 2 * n
    if qtype not in _GROUP_AFFINE:
        return 0
    return n + 2 * 4 * (n // _GROUP_AFFINE[qtype][0])  # int8 codes, a scale and a bias a group


def to_device(host: HostWeight, arrays: Sequence[mx.array] | None = None) -> Weight:
    """The ``kernels`` weight of a ``HostWeight``: copies of its parts in MLX arrays, or, with
    ``arrays``, a weight of the same kind over those MLX arrays (parts of the same layout, e.g.
    an expert slab with a leading slot dim; a bf16 part already viewed as bfloat16)."""
    if arrays is None:
        arrays = [mx.array(p) for p in host.parts]
        if host.kind == "bf16":
            arrays = [mx.view(arrays[0], mx.bfloat16)]
    if host.kind in ("dense", "bf16"):
        return arrays[0]
    if host.kind == "packed":
        return PackedWeight(arrays[0], host.qtype)
    packed, scales, *rest = arrays
    return QuantizedWeight(
        packed=packed,
        scales=scales,
        biases=rest[0] if rest else None,
        bits=host.bits,
        group_size=GROUP_SIZE,
        mode=host.mode,
    )


def load_weight(
    raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...], mode: str | None = None
) -> Weight:
    """The tensor (stored bytes ``raw`` as ``GGUFReader`` maps them) as a weight for ``kernels``.

    ``qtype`` must be in ``SUPPORTED_TYPES`` (the reader checks, naming the file and tensor).
    A float32 matrix of a quantized type gets its int8 codes too (``row_codes``), and one of
    an F16 tensor its float16 values, which the CPU's row kernels read instead.
    """
    host = host_weight(raw, qtype, shape, mode)
    weight = to_device(host)
    if host.kind != "dense" or not isinstance(weight, mx.array) or weight.ndim < 2:
        return weight
    if qtype == T.F16 and weight.dtype == mx.float32:  # float16 values are exact
        attach_codes(weight, RowCodes(mx.array(np.asarray(raw).view(np.float16).reshape(shape))))
    elif qtype not in DENSE_TYPES:
        found = row_codes(raw, qtype, host.parts[0])
        if found is not None:
            attach_codes(weight, RowCodes(*(mx.array(part) for part in found)))
    return weight


def _convert_in_chunks(
    rows: np.ndarray, convert: Callable[[np.ndarray], tuple[np.ndarray, ...]]
) -> list[np.ndarray]:
    """Applies ``convert`` to row chunks of a (memory-mapped) [rows, blocks, bytes] array."""
    n_rows, n_blocks, type_size = rows.shape
    rows_per_chunk = max(1, CHUNK_BYTES // (n_blocks * type_size))
    outputs: list[np.ndarray] = []
    for start in range(0, n_rows, rows_per_chunk):
        parts = convert(np.asarray(rows[start : start + rows_per_chunk]))
        if not outputs:
            outputs = [np.empty((n_rows, *p.shape[1:]), dtype=p.dtype) for p in parts]
        for output, part in zip(outputs, parts, strict=True):
            output[start : start + len(part)] = part
    return outputs


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 at byte ``offset`` of each block, as float32 [rows, blocks]."""
    return blocks[..., offset : offset + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles_to_mlx(qs: np.ndarray, span: int) -> np.ndarray:
    """GGML's 4-bit order to MLX's, byte for byte, as uint32 [rows, ...].

    GGML: each ``span`` bytes hold ``span`` values in their low nibbles, then the next ``span``
    values in their high nibbles. MLX: byte k holds values 2k (low nibble) and 2k + 1 (high).
    So MLX's first ``span / 2`` bytes pair the low nibbles of GGML's bytes 2k and 2k + 1, the
    rest their high nibbles. Read as little-endian uint16 words, each pair is one contiguous
    element: a few word-wide operations, no array of unpacked values (the streamed expert
    store converts on every cache miss)."""
    rows = qs.shape[0]
    words = np.ascontiguousarray(qs).view(np.uint16).reshape(rows, -1, span // 2)
    out = np.empty((rows, words.shape[1], 2, span // 2), np.uint8)
    out[:, :, 0] = (words & 0x0F) | ((words >> 4) & 0xF0)
    out[:, :, 1] = ((words >> 4) & 0x0F) | ((words >> 8) & 0xF0)
    return out.reshape(rows, -1).view(np.uint32)


def _q8_0(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _f16(blocks, 0)
    unsigned_q = blocks[..., 2:] ^ np.uint8(0x80)  # int8 q -> q + 128 in [0, 255]
    return np.ascontiguousarray(unsigned_q).reshape(len(blocks), -1).view(np.uint32), d, -128 * d


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _f16(blocks, 0)
    return _nibbles_to_mlx(blocks[..., 2:], 16), d, -8 * d


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    # d | dmin | 12 bytes of 6-bit (sc, m) pairs for 8 sub-blocks | qs[128]: 32 bytes hold
    # 2 sub-blocks, the first in the low nibbles
    n_rows, n_blocks, _ = blocks.shape
    d, dmin = _f16(blocks, 0)[..., None], _f16(blocks, 2)[..., None]
    sc, m = gguf_quants.Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12))
    scales = d * sc.reshape(n_rows, n_blocks, 8).astype(np.float32)
    biases = -(dmin * m.reshape(n_rows, n_blocks, 8).astype(np.float32))
    q = _nibbles_to_mlx(blocks[..., 16:], 32)
    return q, scales.reshape(n_rows, -1), biases.reshape(n_rows, -1)


def _mxfp4(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    # Same e8m0 exponent and e2m1 codes as MLX's "mxfp4"; only the nibble order differs.
    return _nibbles_to_mlx(blocks[..., 1:], 16), blocks[..., 0]


# --------------------------------------------------------------------------------------------
# Codes for the CPU's row kernels: value = scale * code + bias, a scale and a bias per group
# --------------------------------------------------------------------------------------------


def _group_affine_q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = _f16(blocks, 0)[..., None]  # one group of 32: d * q
    return d, np.zeros_like(d)


def _group_affine_q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n_rows, n_blocks, _ = blocks.shape  # 8 groups of 32: d * sc * q - dmin * m
    d, dmin = _f16(blocks, 0)[..., None], _f16(blocks, 2)[..., None]
    sc, m = gguf_quants.Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12))
    scale = d * sc.reshape(n_rows, n_blocks, 8).astype(np.float32)
    return scale, -(dmin * m.reshape(n_rows, n_blocks, 8).astype(np.float32))


def _group_affine_q2_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scales = blocks[..., :16]  # 16 groups of 16: d * (sc & 15) * q - dmin * (sc >> 4)
    d, dmin = _f16(blocks, 80)[..., None], _f16(blocks, 82)[..., None]
    return d * (scales & 0xF).astype(np.float32), -(dmin * (scales >> 4).astype(np.float32))


def _group_affine_q6_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sc = blocks[..., 192:208].copy().view(np.int8).astype(np.float32)  # 16 groups: d * sc * q
    scale = _f16(blocks, 208)[..., None] * sc
    return scale, np.zeros_like(scale)


# GGML types whose values are scale * q + bias per group: how many values a group holds, and
# what gives each group's scale and bias from the blocks [rows, blocks, bytes] (each [rows,
# blocks, groups per block]).
_GROUP_AFFINE: dict[GGMLQuantizationType, tuple[int, Callable]] = {
    T.Q8_0: (32, _group_affine_q8_0),
    T.Q4_0: (32, _group_affine_q8_0),  # d * (q - 8): the same d per 32
    T.Q4_K: (32, _group_affine_q4_k),
    T.Q2_K: (16, _group_affine_q2_k),
    T.Q6_K: (16, _group_affine_q6_k),
}


def row_codes(
    raw: np.ndarray, qtype: GGMLQuantizationType, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A quantized matrix (stack) as int8 codes [..., out, in] with a float32 scale and bias
    per group of the input dim [..., out, groups], such that ``scale * code + bias`` in float32
    (rounded after the multiply and after the add) is ``values`` (its float32 dequantization)
    exactly: what the CPU's row kernels read instead of the float32 values (``kernels.RowCodes``,
    a quarter of the bytes). None for a type without such a form or where the check fails."""
    if qtype not in _GROUP_AFFINE or values.ndim < 2 or values.size == 0:
        return None
    group, group_affine = _GROUP_AFFINE[qtype]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, values.shape[-1] // block_size, type_size)
    scale, bias = group_affine(np.asarray(blocks))
    groups = values.shape[-1] // group
    flat = values.reshape(blocks.shape[0], groups, group)
    scale, bias = scale.reshape(-1, groups, 1), bias.reshape(-1, groups, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.rint(np.where(scale != 0, (flat - bias) / scale, 0))
    # Non-finite scales or values (a corrupt or odd file) have no int8 form either.
    if not np.isfinite(codes).all() or codes.max(initial=0) > 127 or codes.min(initial=0) < -128:
        return None
    codes = codes.astype(np.int8)
    if not np.array_equal(scale * codes.astype(np.float32) + bias, flat):
        return None
    outer = values.shape[:-1]
    return (
        codes.reshape(values.shape),
        scale.reshape(*outer, -1).astype(np.float32),
        bias.reshape(*outer, -1).astype(np.float32),
    )


_CONVERTERS: dict[GGMLQuantizationType, tuple[Callable, int, str]] = {
    T.Q8_0: (_q8_0, 8, "affine"),
    T.Q4_0: (_q4_0, 4, "affine"),
    T.Q4_K: (_q4_k, 4, "affine"),
    T.MXFP4: (_mxfp4, 4, "mxfp4"),
}
