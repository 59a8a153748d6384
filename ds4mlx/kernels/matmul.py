"""Products with stored weights: ``linear`` and its kin (stacked, grouped, gathered for routed
experts), the frozen [in, out] copies and int8 codes the CPU's row kernels read (``freeze``,
``attach_codes``), and reading rows of a weight (``take_rows``, ``dequantize``).

A decode tile's rows (at most ``ROWS_LINEAR_MAX``) take the native row-by-row matmul on the
CPU, so each row's bits do not depend on the other rows; packed GGUF blocks are computed as
stored on the CPU (``cpu_ops/quant_blocks.cpp``), by ``metal/linear.metal`` on a Mac, by
their twins else.
"""

from __future__ import annotations

import math
import weakref
from functools import cache
from types import ModuleType

from ds4mlx.kernels import dispatch, metal, metal_fused, twins
from ds4mlx.kernels.dispatch import in_inference, inference_ops, metal_kernels, native_cpu_ops
from ds4mlx.kernels.native import native_ops
from ds4mlx.kernels.weights import PackedWeight, QuantizedWeight, RowCodes, Weight

import mlx.core as mx
import numpy as np


def _expert_grid(w: QuantizedWeight | PackedWeight) -> mx.array:
    """Indices of every matrix in a stacked weight [..., out, in], shaped like its leading dims."""
    return _index_grid(tuple(w.shape[:-2]))


@cache
def _index_grid(leading: tuple[int, ...]) -> mx.array:
    # Made on the host: a constant, not two primitives (arange, reshape) on every call.
    return mx.array(np.arange(math.prod(leading), dtype=np.uint32).reshape(leading))


@cache
def _row_group_grid(tokens: int, groups: int) -> mx.array:
    """[T, G]: group g's matrix for every row, made on the host (a constant, where an index
    vector [G] is broadcast by one more primitive)."""
    return mx.array(np.tile(np.arange(groups, dtype=np.uint32), (tokens, 1)))


def _lhs_grid(x: mx.array) -> mx.array:
    """The indices of every matrix of x [..., M, K] shaped like its leading dims: what a
    gathered matmul uses when given none, made there by two primitives on every call."""
    return _index_grid(tuple(x.shape[:-2]))


# The [..., in, out] copies of frozen weights (``freeze``), by the id of the [..., out, in] view
# the model holds; an entry leaves with its weight (a weak reference's callback).
_TRANSPOSED: dict[int, tuple[weakref.ref, mx.array]] = {}


# The codes (or float16 values) of float32 inference matrices (``attach_codes``), by the id of
# the array the model holds; an entry leaves with its weight.
_CODES: dict[int, tuple[weakref.ref, RowCodes]] = {}


# A frozen matrix's codes are stored in panels of this many output columns (cpu_ops kPanel).
CODE_PANEL = 64


def attach_codes(w: mx.array, codes: RowCodes) -> None:
    """Give the float32 matrix (stack) ``w`` [..., out, in] its int8 codes, as GGUF lays them
    out (``RowCodes``, ``gguf.quants.row_codes``): the CPU's row kernels then read those, with
    the same results to the bit. ``freeze`` carries them over to the frozen view."""
    key = id(w)
    _CODES[key] = (weakref.ref(w, lambda _: _CODES.pop(key, None)), codes)


def codes_of(w: Weight) -> RowCodes | None:
    entry = _CODES.get(id(w))
    if entry is not None and entry[0]() is w:
        return entry[1]
    return None


def _in_panels(codes: RowCodes) -> RowCodes:
    """A 2-D matrix's codes [out, in] (or float16 values) laid out for its frozen [in, out]
    memory, in panels of ``CODE_PANEL`` columns; an output width that is not a whole number of
    panels (a vocabulary's) is padded with zero columns, which the row kernels never write."""
    out = codes.codes.shape[0]
    padded = -(-out // CODE_PANEL) * CODE_PANEL

    def panels(a: mx.array) -> mx.array:  # [out, n] -> [padded / P, n, P]
        a = mx.pad(a, [(0, padded - out), (0, 0)]) if padded > out else a
        return mx.contiguous(a.reshape(padded // CODE_PANEL, CODE_PANEL, -1).transpose(0, 2, 1))

    scale, bias = codes.scale, codes.bias
    laid_out = RowCodes(
        panels(codes.codes),
        None if scale is None else panels(scale),
        None if bias is None else panels(bias),
        True,
    )
    mx.eval(laid_out.operand)
    return laid_out


def freeze(w: Weight) -> Weight:
    """Declare an inference matrix that is never updated nor differentiated, and store a plain
    array as [..., in, out] contiguous: MLX's CPU matmul takes a transposed operand at a third
    of the speed (38 vs 13 µs for a decode tile's [8, 256] x [256, 256]), and a Transpose
    primitive each call besides. Returns the same values as a [..., out, in] view of that
    memory (no second copy is kept), which ``linear`` recognises. Codes attached to ``w``
    (``attach_codes``) follow, laid out for the row kernels. Quantized weights stay as they
    are, evaluated here: MLX's streams belong to a thread, so a lazy view of them made while
    loading (a grouped matrix's reshape) could not be evaluated by another (the agent's worker:
    "There is no Stream(cpu, 0) in current thread")."""
    if isinstance(w, PackedWeight):
        mx.eval(w.data)
    if isinstance(w, QuantizedWeight):
        mx.eval([a for a in (w.packed, w.scales, w.biases) if a is not None])
    if not (isinstance(w, mx.array) and w.ndim >= 2):
        return w
    stored = mx.contiguous(mx.swapaxes(w, -1, -2))
    view = mx.swapaxes(stored, -1, -2)
    mx.eval(stored, view)
    key = id(view)
    _TRANSPOSED[key] = (weakref.ref(view, lambda _: _TRANSPOSED.pop(key, None)), stored)
    codes = codes_of(w)
    if codes is not None and w.ndim == 2:
        attach_codes(view, _in_panels(codes))
    return view


def row_operand(w: mx.array, stored: mx.array, padded: bool = False) -> mx.array | list[mx.array]:
    """What the native row-by-row matmul reads for the frozen matrix ``w`` (its [in, out]
    memory ``stored``): its codes where it has them, else the float32 values. ``padded``: the
    caller passes the real width (``rows_linear``'s widths), so panels padded past it do."""
    codes = codes_of(w)
    if codes is None or not codes.panels:
        return stored
    whole = codes.codes.shape[0] * CODE_PANEL == stored.shape[1]
    return codes.operand if whole or padded else stored


def expert_operand(w: mx.array) -> mx.array | list[mx.array]:
    """What the native experts read for a float32 stack [E, out, in]: its codes where it has
    them (as GGUF lays them out), else the values."""
    codes = codes_of(w)
    return codes.operand if codes is not None and not codes.panels else w


def frozen(w: mx.array) -> mx.array | None:
    """The contiguous [..., in, out] memory of a frozen matrix (``freeze``), else None."""
    entry = _TRANSPOSED.get(id(w))
    if entry is not None and entry[0]() is w:
        return entry[1]
    return None


def transposed(w: mx.array) -> mx.array:
    stored = frozen(w)
    return mx.swapaxes(w, -1, -2) if stored is None else stored


def frozen_float32(w: Weight) -> mx.array | None:
    """The frozen [in, out] float32 memory of a matrix (``freeze``), else None."""
    stored = frozen(w) if isinstance(w, mx.array) else None
    return stored if stored is not None and stored.dtype == mx.float32 else None


def float32_arrays(*weights: Weight) -> bool:
    """Whether every weight is a plain float32 array (what the native experts read)."""
    return all(isinstance(w, mx.array) and w.dtype == mx.float32 for w in weights)


# Inputs of at most this many rows (decode and verify tiles) take the native row-by-row matmul
# on the CPU (``rows_linear``): a BLAS GEMM picks its kernel by the row count, so only a
# row-by-row product keeps each row's bits independent of the other rows.
ROWS_LINEAR_MAX = 8


def linear(x: mx.array, w: Weight, rows: int | None = None) -> mx.array:
    """x @ w.T for a weight stored GGUF-style as [out_features, in_features].

    A weight with leading dims [..., out, in] is a stack of matrices: the product broadcasts over
    them like ``x @ w.swapaxes(-1, -2)``. ``rows``: only the first rows of a 2-D ``x`` are
    needed (a decode tile's real rows); the others come back unspecified (zeros where they
    are not computed: the CPU, packed weights on the GPU).
    """
    if isinstance(w, mx.array):
        stored = frozen(w)
        if stored is None:
            return (x @ mx.swapaxes(w, -1, -2)).astype(x.dtype)
        if _rows_linear_applies(x, [stored]):
            operand = row_operand(w, stored, padded=True)
            real = x.shape[0] if rows is None else rows
            return native_ops().rows_linear(x, [operand], real, [stored.shape[1]])[0]
        return (x @ stored).astype(x.dtype)
    if len(w.shape) > 2:
        return gather_linear(x, w, _expert_grid(w))
    if isinstance(w, QuantizedWeight):
        out = mx.quantized_matmul(
            x, w.packed, w.scales, w.biases, True, w.group_size, w.bits, w.mode
        )
        return out.astype(x.dtype)
    if block_ops(w) is not None:
        return blocks_linear(x, w, rows)
    if dispatch.backend is metal and x.ndim == 2:
        # Only the real rows, in the launch every tile of these rows takes (each row's bits
        # whatever the count; MLX's own quantized kinds above pick their kernel by the row
        # count, so they keep every row).
        return metal.linear(x, w, rows)
    return dispatch.backend.linear(x, w)


def block_ops(*weights: Weight) -> ModuleType | None:
    """The native CPU operations where they compute on these weights' GGUF blocks as stored
    (``PackedWeight``s on the CPU: ``cpu_ops/quant_blocks.cpp``), else None."""
    if not all(isinstance(w, PackedWeight) for w in weights):
        return None
    return native_cpu_ops()


def blocks_linear(x: mx.array, w: PackedWeight, rows: int | None) -> mx.array:
    """``linear`` on blocks: x [..., G * K] times w [N, K] (G = 1) or [G, N, K] (a grouped
    projection, x [T, G * K]); each of the first ``rows`` rows on its own (decode tiles)."""
    flat = x.reshape(-1, x.shape[-1])
    real = flat.shape[0] if rows is None else rows
    out = native_ops().blocks_linear(flat, w.data, int(w.qtype), real)
    return out.reshape(*x.shape[:-1], out.shape[-1]).astype(x.dtype)


def linear_many(x: mx.array, weights: list[Weight], rows: int | None = None) -> list[mx.array]:
    """``[linear(x, w, rows) for w in weights]``: the products of one input, as one native
    primitive where every weight takes the row-by-row matmul (decode tiles on the CPU)."""
    stored = [frozen(w) if isinstance(w, mx.array) else None for w in weights]
    if all(s is not None for s in stored) and _rows_linear_applies(x, stored):
        operands = [row_operand(w, s, padded=True) for w, s in zip(weights, stored, strict=True)]
        widths = [s.shape[1] for s in stored]
        return native_ops().rows_linear(x, operands, x.shape[0] if rows is None else rows, widths)
    return [linear(x, w, rows) for w in weights]


def _rows_linear_applies(x: mx.array, stored: list[mx.array]) -> bool:
    """Whether x times these frozen [in, out] matrices takes the native row-by-row matmul."""
    return (
        x.ndim == 2
        and x.shape[0] <= ROWS_LINEAR_MAX
        and x.dtype == mx.float32
        and all(s.ndim == 2 and s.dtype == mx.float32 for s in stored)
        and native_cpu_ops() is not None
    )


def gather_linear(
    x: mx.array, w: Weight, expert_indices: mx.array, sorted_indices: bool = False
) -> mx.array:
    """Routed-expert matmul: ``mx.gather_mm(x, w.swapaxes(-1, -2), rhs_indices=expert_indices)``.

    ``w`` is [n_expert, out, in]; ``x`` is [..., M, in] and its leading dims broadcast with
    ``expert_indices``; the result is [*broadcast, M, out]. This is mlx-lm's ``SwitchLinear``
    convention: x = expand_dims(x, (-2, -3)) with indices [tokens, top_k] gives
    [tokens, top_k, 1, out]. ``sorted_indices`` is the hint ``mx.gather_mm`` takes.
    """
    if isinstance(w, mx.array):
        out = mx.gather_mm(
            x,
            transposed(w),
            lhs_indices=_lhs_grid(x),
            rhs_indices=expert_indices,
            sorted_indices=sorted_indices,
        )
        return out.astype(x.dtype)
    if isinstance(w, QuantizedWeight):
        out = mx.gather_qmm(
            x,
            w.packed,
            w.scales,
            w.biases,
            lhs_indices=_lhs_grid(x),
            rhs_indices=expert_indices,
            transpose=True,
            group_size=w.group_size,
            bits=w.bits,
            mode=w.mode,
            sorted_indices=sorted_indices,
        )
        return out.astype(x.dtype)
    if block_ops(w) is not None:
        # A stacked projection (GLM's per-head matrices; routed experts take blocks_experts):
        # the matrices it uses decoded to float32, then one gathered matmul, as the twin does.
        stack = w.data.reshape(-1, *w.data.shape[-2:])
        used = dequantize(PackedWeight(stack[expert_indices.flatten()], w.qtype))
        positions = mx.arange(expert_indices.size).reshape(expert_indices.shape)
        out = mx.gather_mm(
            x, mx.swapaxes(used, -1, -2), rhs_indices=positions, sorted_indices=sorted_indices
        )
        return out.astype(x.dtype)
    return dispatch.backend.gather_linear(x, w, expert_indices, sorted_indices)


def grouped_input_shape(w: Weight, tokens: int) -> tuple[int, ...]:
    """The layout ``grouped_linear`` reads x in for w [G, N, K] without a view of it:
    [T, G, 1, K] where each (row, group) is a gathered one-row product (quantized and packed
    weights off the CPU's blocks: the GPU's path), [T, G * K] else."""
    groups, _, width = w.shape
    if isinstance(w, mx.array) or block_ops(w) is not None:
        return (tokens, groups * width)
    return (tokens, groups, 1, width)


def grouped_linear(x: mx.array, w: Weight, rows: int | None = None) -> mx.array:
    """x [T, G * K] (or [T, G, 1, K], ``grouped_input_shape``) -> [T, G * N]: group g's
    channels times its own matrix, w [G, N, K] stored GGUF-style (``rows``: see ``linear``).
    One native primitive in a CPU decode tile; else a batched matmul between the reshapes and
    transposes that line the groups up."""
    stored = frozen(w) if isinstance(w, mx.array) else None
    if stored is not None and stored.ndim == 3 and _rows_linear_applies(x, []):
        return native_ops().grouped_rows_linear(x, stored, x.shape[0] if rows is None else rows)
    if block_ops(w) is not None and x.ndim == 2:
        return blocks_linear(x, w, rows)
    tokens, groups = x.shape[0], w.shape[0]
    if not isinstance(w, mx.array):
        # Each (row, group) one gathered one-row product: no transposes around it, and a row's
        # bits never depend on the other rows (quantized and packed weights: the GPU's path).
        per_group = x if x.ndim == 4 else x.reshape(tokens, groups, 1, -1)  # [T, G, 1, K]
        return gather_linear(per_group, w, _row_group_grid(tokens, groups)).reshape(tokens, -1)
    grouped = mx.swapaxes(x.reshape(tokens, groups, -1), 0, 1)  # [G, T, K]
    return mx.swapaxes(linear(grouped, w), 0, 1).reshape(tokens, -1)


def markov_chain(
    logits: mx.array,
    w1: Weight,
    w2: Weight,
    anchor: mx.array,
    scale: mx.array | None,
    index: mx.array | None,
    first: int,
    n: int,
) -> tuple[mx.array, mx.array] | None:
    """DSpark's Markov head chained greedily over a block's first ``n`` rows of ``logits``
    [B, V]: row i (from ``first``) adds ``linear(w1[prev], w2)`` (times ``scale``, scattered
    through ``index`` for a draft vocabulary) and picks its argmax, prev being the anchor, then
    the previous pick; rows before ``first`` pass through. -> (rows [n, V], picks int32 [n]) as
    one native primitive in inference on the CPU (``models.deepseek4_dspark.DSparkNet.block_rows``
    computes the same with MLX ops, about eight a row); None where that does not apply."""
    w1_t, w2_t = frozen_float32(w1), frozen_float32(w2)
    if inference_ops() is None or w1_t is None or w2_t is None or logits.dtype != mx.float32:
        return None
    rows, picks = native_ops().markov_chain(logits, w1_t, w2_t, anchor, scale, index, first, n)
    return rows, picks


def dequantize(w: Weight) -> mx.array:
    """The weight as a float32 array [..., out, in] (for checks and small one-off uses)."""
    if isinstance(w, mx.array):
        return w.astype(mx.float32)
    if isinstance(w, QuantizedWeight):
        return mx.dequantize(
            w.packed, w.scales, w.biases, w.group_size, w.bits, w.mode, dtype=mx.float32
        )
    if block_ops(w) is not None:
        rows = w.data.reshape(-1, w.data.shape[-1])
        indices = mx.arange(rows.shape[0], dtype=mx.int32)
        return native_ops().blocks_rows(rows, int(w.qtype), indices).reshape(w.shape)
    return twins.dequantize_packed(w.data, w.qtype)


def embed_streams(w: Weight, tokens: mx.array, hc: int) -> mx.array | None:
    """The rows ``take_rows(w, tokens)`` as ``hc`` identical mHC streams, float32
    [T, hc * D] (the flat layout an mHC site reads): one Metal launch in inference on the GPU
    for MLX's affine layouts of whole values a word (``metal/embed_streams.metal``); None
    elsewhere."""
    if not (in_inference() and metal_kernels() and isinstance(w, QuantizedWeight)):
        return None
    if w.mode != "affine" or w.bits not in (2, 4, 8) or w.biases is None:
        return None
    return metal_fused.embed_streams(tokens, w.packed, w.scales, w.biases, w.bits, w.group_size, hc)


def take_rows(w: Weight, indices: mx.array) -> mx.array:
    """Rows ``w[indices]`` of a 2-D weight, e.g. an embedding lookup [..., in].

    Plain arrays keep their dtype; quantized weights decode only the rows taken, to float32.
    """
    if isinstance(w, mx.array):
        return w[indices]
    if isinstance(w, QuantizedWeight):
        biases = None if w.biases is None else w.biases[indices]
        return mx.dequantize(
            w.packed[indices],
            w.scales[indices],
            biases,
            w.group_size,
            w.bits,
            w.mode,
            dtype=mx.float32,
        )
    if block_ops(w) is not None:
        return native_ops().blocks_rows(w.data, int(w.qtype), indices)
    return twins.dequantize_packed(w.data[indices], w.qtype)
