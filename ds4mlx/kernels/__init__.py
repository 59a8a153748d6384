"""The only place model code gets matmuls on stored weights from (Metal kernels or MLX twins).

A weight is one of (see ``kernels.weights``):
- ``mx.array`` [..., out, in] (float32, float16 or bfloat16): a plain matmul;
- ``QuantizedWeight``: MLX's own quantized layouts (``mx.quantized_matmul`` / ``mx.gather_qmm``);
- ``PackedWeight``: GGML blocks MLX cannot represent, computed by the Metal kernels in
  ``metal/`` or by their pure-MLX twins in ``kernels.twins``.

Results have the dtype of ``x`` whatever the weight kind; the arithmetic is at least float32
for quantized kinds. ``DS4MLX_KERNELS=metal|mlx|auto`` (default auto: Metal where available)
picks the packed-weight implementation; like the BLAS switch it is read once, at import.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from types import ModuleType

from ds4mlx.kernels import metal, twins
from ds4mlx.kernels.gradients import with_twin_gradient
from ds4mlx.kernels.native import native_ops
from ds4mlx.kernels.twins import swiglu
from ds4mlx.kernels.weights import PackedWeight, QuantizedWeight, RowCodes, Weight

import mlx.core as mx
import numpy as np

KERNEL_CHOICES = ("auto", "metal", "mlx")


def select_kernel_backend(choice: str, metal_is_available: bool) -> str:
    """'metal' or 'mlx' for a DS4MLX_KERNELS value; raises ValueError for an unusable choice."""
    choice = choice.strip().lower() or "auto"
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"DS4MLX_KERNELS={choice!r}: expected one of {', '.join(KERNEL_CHOICES)}")
    if choice == "metal" and not metal_is_available:
        raise ValueError("DS4MLX_KERNELS=metal, but Metal is not available on this machine")
    if choice == "auto":
        return "metal" if metal_is_available else "mlx"
    return choice


PACKED_KERNELS = select_kernel_backend(
    os.environ.get("DS4MLX_KERNELS", "auto"), metal.metal_available()
)
_backend = metal if PACKED_KERNELS == "metal" else twins


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


def _codes(w: Weight) -> RowCodes | None:
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
    codes = _codes(w)
    if codes is not None and w.ndim == 2:
        attach_codes(view, _in_panels(codes))
    return view


def _row_operand(w: mx.array, stored: mx.array, padded: bool = False) -> mx.array | list[mx.array]:
    """What the native row-by-row matmul reads for the frozen matrix ``w`` (its [in, out]
    memory ``stored``): its codes where it has them, else the float32 values. ``padded``: the
    caller passes the real width (``rows_linear``'s widths), so panels padded past it do."""
    codes = _codes(w)
    if codes is None or not codes.panels:
        return stored
    whole = codes.codes.shape[0] * CODE_PANEL == stored.shape[1]
    return codes.operand if whole or padded else stored


def _expert_operand(w: mx.array) -> mx.array | list[mx.array]:
    """What the native experts read for a float32 stack [E, out, in]: its codes where it has
    them (as GGUF lays them out), else the values."""
    codes = _codes(w)
    return codes.operand if codes is not None and not codes.panels else w


def _frozen(w: mx.array) -> mx.array | None:
    """The contiguous [..., in, out] memory of a frozen matrix (``freeze``), else None."""
    entry = _TRANSPOSED.get(id(w))
    if entry is not None and entry[0]() is w:
        return entry[1]
    return None


def _transposed(w: mx.array) -> mx.array:
    stored = _frozen(w)
    return mx.swapaxes(w, -1, -2) if stored is None else stored


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
        stored = _frozen(w)
        if stored is None:
            return (x @ mx.swapaxes(w, -1, -2)).astype(x.dtype)
        if _rows_linear_applies(x, [stored]):
            operand = _row_operand(w, stored, padded=True)
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
    if _block_ops(w) is not None:
        return _blocks_linear(x, w, rows)
    if _backend is metal and x.ndim == 2:
        # Only the real rows, in the launch every tile of these rows takes (each row's bits
        # whatever the count; MLX's own quantized kinds above pick their kernel by the row
        # count, so they keep every row).
        return metal.linear(x, w, rows)
    return _backend.linear(x, w)


def _block_ops(*weights: Weight) -> ModuleType | None:
    """The native CPU operations where they compute on these weights' GGUF blocks as stored
    (``PackedWeight``s on the CPU: ``cpu_ops/quant_blocks.cpp``), else None."""
    if not all(isinstance(w, PackedWeight) for w in weights):
        return None
    return _native_cpu_ops()


def _blocks_linear(x: mx.array, w: PackedWeight, rows: int | None) -> mx.array:
    """``linear`` on blocks: x [..., G * K] times w [N, K] (G = 1) or [G, N, K] (a grouped
    projection, x [T, G * K]); each of the first ``rows`` rows on its own (decode tiles)."""
    flat = x.reshape(-1, x.shape[-1])
    real = flat.shape[0] if rows is None else rows
    out = native_ops().blocks_linear(flat, w.data, int(w.qtype), real)
    return out.reshape(*x.shape[:-1], out.shape[-1]).astype(x.dtype)


def linear_many(x: mx.array, weights: list[Weight], rows: int | None = None) -> list[mx.array]:
    """``[linear(x, w, rows) for w in weights]``: the products of one input, as one native
    primitive where every weight takes the row-by-row matmul (decode tiles on the CPU)."""
    stored = [_frozen(w) if isinstance(w, mx.array) else None for w in weights]
    if all(s is not None for s in stored) and _rows_linear_applies(x, stored):
        operands = [_row_operand(w, s, padded=True) for w, s in zip(weights, stored, strict=True)]
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
        and _native_cpu_ops() is not None
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
            _transposed(w),
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
    if _block_ops(w) is not None:
        # A stacked projection (GLM's per-head matrices; routed experts take blocks_experts):
        # the matrices it uses decoded to float32, then one gathered matmul, as the twin does.
        stack = w.data.reshape(-1, *w.data.shape[-2:])
        used = dequantize(PackedWeight(stack[expert_indices.flatten()], w.qtype))
        positions = mx.arange(expert_indices.size).reshape(expert_indices.shape)
        out = mx.gather_mm(
            x, mx.swapaxes(used, -1, -2), rhs_indices=positions, sorted_indices=sorted_indices
        )
        return out.astype(x.dtype)
    return _backend.gather_linear(x, w, expert_indices, sorted_indices)


# Set while inference-only code runs (``inference``): no gradient will be asked for, so the
# native primitives are called bare, without the wrapper that differentiates them through their
# twins (a CustomTransforms primitive more on every call).
_INFERENCE: ContextVar[bool] = ContextVar("ds4mlx_kernels_inference", default=False)


@contextmanager
def inference() -> Iterator[None]:
    """Within this block no gradient is taken of what the kernels compute (decode tiles, which
    by contract only inference runs: ``models.tiles``)."""
    token = _INFERENCE.set(True)
    try:
        yield
    finally:
        _INFERENCE.reset(token)


def _native_cpu_ops() -> ModuleType | None:
    """The native CPU operations when computing on the CPU (``kernels.native``)."""
    if mx.default_device() != mx.cpu:
        return None
    return native_ops()


def _metal_kernels() -> bool:
    """Whether the fused Metal kernels run: Metal is the packed-weight backend (``PACKED_KERNELS``)
    and the default device is the GPU."""
    return _backend is metal and mx.default_device() != mx.cpu


def _inference_ops() -> ModuleType | None:
    """The native CPU operations where inference-only ones may run (``inference``)."""
    return _native_cpu_ops() if _INFERENCE.get() else None


def _frozen_float32(w: Weight) -> mx.array | None:
    """The frozen [in, out] float32 memory of a matrix (``freeze``), else None."""
    stored = _frozen(w) if isinstance(w, mx.array) else None
    return stored if stored is not None and stored.dtype == mx.float32 else None


def _float32_arrays(*weights: Weight) -> bool:
    """Whether every weight is a plain float32 array (what the native experts read)."""
    return all(isinstance(w, mx.array) and w.dtype == mx.float32 for w in weights)


def sinkhorn(comb: mx.array, iters: int, eps: float) -> mx.array:
    """Sinkhorn-normalised mHC mixing matrices [..., src, dst] (``twins.sinkhorn`` says how).
    On the CPU the models run it inside the native ``hc_pre`` / ``hc_mixes`` primitives."""
    return _backend.sinkhorn(comb, iters, eps)


def hc_mixes(
    mixes: mx.array, scale: mx.array, base: mx.array, hc: int, iters: int, eps: float
) -> tuple[mx.array, mx.array, mx.array]:
    """One mHC site's (pre, post, comb) from its projected mixes (``twins.hc_mixes`` says
    how): one native primitive on the CPU, the Sinkhorn in one Metal launch on Metal."""
    if _native_cpu_ops() is not None:
        if _INFERENCE.get():
            return tuple(native_ops().hc_mixes(mixes, scale, base, hc, iters, eps))
        return _native_hc_mixes(hc, iters, eps)(mixes, scale, base)
    return twins.hc_mixes(mixes, scale, base, hc, iters, eps, sinkhorn_fn=_backend.sinkhorn)


def hc_site(
    x: mx.array, mixes: mx.array, scale: mx.array, base: mx.array, hc: int, iters: int, eps: float
) -> tuple[mx.array, mx.array, mx.array]:
    """An mHC site after its projection (``twins.hc_site`` says how): the streams x [T, hc, D]
    collapsed into the block input [T, D], post and comb. One Metal launch on the GPU
    (``metal/hc_site.metal``); ``hc_mixes`` and the collapse else."""
    if _metal_kernels():
        if _INFERENCE.get():
            return metal.hc_site_kernel(x, mixes, scale, base, hc, iters, eps)
        return metal.hc_site(x, mixes, scale, base, hc, iters, eps)
    pre, post, comb = hc_mixes(mixes, scale, base, hc, iters, eps)
    return (pre[:, None, :] @ x)[:, 0], post, comb


def hc_site_norm(
    x: mx.array,
    fn: Weight,
    scale: mx.array,
    base: mx.array,
    weight: mx.array,
    hc: int,
    iters: int,
    eps: float,
    norm_eps: float,
    out_eps: float,
) -> tuple[mx.array, mx.array, mx.array] | None:
    """A whole mHC site with the norm of its streams and the block's input norm (``weight``,
    ``out_eps``) in inference on the GPU: the raw streams' projection and one Metal launch
    (``metal/hc_site_norm.metal``; ``twins.hc_site_norm`` says how). None elsewhere."""
    if not (_INFERENCE.get() and _metal_kernels()):
        return None
    mixes = linear(x if x.ndim == 2 else x.reshape(x.shape[0], -1), fn)
    return metal.hc_site_norm(x, mixes, scale, base, weight, hc, iters, eps, norm_eps, out_eps)


def hc_head_norm(
    x: mx.array,
    fn: Weight,
    scale: mx.array,
    base: mx.array,
    weight: mx.array,
    eps: float,
    norm_eps: float,
    out_eps: float,
    rows: int | None = None,
) -> mx.array | None:
    """The head's collapse of the streams with its norms (``twins.hc_head_norm``) in inference
    on the GPU: the raw streams' projection and one Metal launch (``metal/hc_site_norm.metal``
    as the head). None elsewhere."""
    if not (_INFERENCE.get() and _metal_kernels()):
        return None
    hc = fn.shape[0]
    mixes = linear(x if x.ndim == 2 else x.reshape(x.shape[0], -1), fn, rows)
    return metal.hc_site_norm(
        x, mixes, scale, base, weight, hc, 1, eps, norm_eps, out_eps, site=False
    )[0]


def hc_pre(
    x: mx.array,
    fn: Weight,
    scale: mx.array,
    base: mx.array,
    hc: int,
    iters: int,
    eps: float,
    norm_eps: float,
    rows: int | None = None,
) -> tuple[mx.array, mx.array, mx.array] | None:
    """A whole mHC site before its block as one native primitive on the CPU
    (``twins.hc_pre`` says what it computes): (block input [T, D], post, comb). None where
    that does not apply (not on the CPU, ``fn`` not a float32 array). ``rows``: see
    ``linear`` (a decode tile's real rows; the others come back zeros)."""
    if not (isinstance(fn, mx.array) and fn.dtype == mx.float32 and x.dtype == mx.float32):
        return None
    if _native_cpu_ops() is None:
        return None
    # A frozen matrix's [in, out] memory as stored (else a transposed view, read as a copy).
    if _INFERENCE.get():
        return tuple(
            native_ops().hc_pre(
                x, _transposed(fn), scale, base, hc, iters, eps, norm_eps, _row_count(rows)
            )
        )
    return _native_hc_pre(hc, iters, eps, norm_eps)(x, _transposed(fn), scale, base)


def hc_expand(
    out: mx.array,
    residual: mx.array,
    post: mx.array,
    comb: mx.array,
    flat: bool = False,
    rows: int | None = None,
) -> mx.array:
    """The mHC streams after a block (``twins.hc_expand`` says how): one native primitive on
    the CPU, one Metal launch on the GPU (``metal/hc_expand.metal``). ``flat``: in inference on
    the GPU the streams come back [T, hc * D], as the next site (``hc_site_norm``) reads them;
    [T, hc, D] everywhere else. ``rows``: see ``linear`` (zeros past them on the CPU)."""
    if _metal_kernels():
        if _INFERENCE.get():
            return metal.hc_expand_kernel(out, residual, post, comb, flat)
        return metal.hc_expand(out, residual, post, comb)
    if _native_cpu_ops() is None or residual.dtype != mx.float32:
        return twins.hc_expand(out, residual, post, comb)
    if _INFERENCE.get():
        return native_ops().hc_expand(out, residual, post, comb, _row_count(rows))
    return _native_hc_expand()(out, residual, post, comb)


def _row_count(rows: int | None) -> int:
    """A native operation's real-row count: -1 for every row."""
    return -1 if rows is None else rows


@cache
def _native_hc_pre(
    hc: int, iters: int, eps: float, norm_eps: float
) -> Callable[..., tuple[mx.array, ...]]:
    ops = native_ops()
    return mx.compile(
        with_twin_gradient(
            lambda x, f, s, b: tuple(ops.hc_pre(x, f, s, b, hc, iters, eps, norm_eps)),
            lambda x, f, s, b: twins.hc_pre(x, f, s, b, hc, iters, eps, norm_eps),
        )
    )


@cache
def _native_hc_expand() -> Callable[..., mx.array]:
    ops = native_ops()
    return mx.compile(with_twin_gradient(ops.hc_expand, twins.hc_expand))


def moe_tile(
    logits: mx.array,
    x: mx.array,
    gate: Weight,
    up: Weight,
    down: Weight,
    shared_gate: mx.array,
    shared_up: mx.array,
    shared_down: Weight,
    bias: mx.array | None,
    hashed: mx.array | None,
    rows: int,
    *,
    n_used: int,
    func: int,
    normalize: bool,
    scale: float,
    limit: float,
    shared_limit: float,
) -> mx.array | None:
    """A decode tile's whole FFN as one native primitive in inference on the CPU: for the first
    ``rows`` rows of x [T, D], the routing from the router ``logits`` [T, E] (gating function
    ``func``, selection ``bias`` [E] or the ``hashed`` experts [T, k]) and the weighted sum of
    the chosen experts' clamped SwiGLU outputs, plus the shared expert's output from its gate
    and up products [T, Fs] and its down matrix; the other rows are zeros. What ``models.moe``
    computes with ``route``, ``routed_experts`` and ``SwiGLU`` (the twins). None where it does
    not apply (not in inference on the CPU, weights not float32 arrays)."""
    ops, down_t = _inference_ops(), _frozen_float32(shared_down)
    if ops is None or down_t is None or not _float32_arrays(gate, up, down):
        return None
    return ops.moe_tile(
        logits,
        x,
        _expert_operand(gate),
        _expert_operand(up),
        _expert_operand(down),
        shared_gate,
        shared_up,
        _row_operand(shared_down, down_t),
        bias,
        hashed,
        rows,
        n_used,
        func,
        normalize,
        scale,
        limit,
        shared_limit,
    )


def moe_route(
    logits: mx.array,
    bias: mx.array | None,
    hashed: mx.array | None,
    rows: int,
    *,
    n_used: int,
    func: int,
    normalize: bool,
    scale: float,
) -> tuple[mx.array, mx.array] | None:
    """``moe_tile``'s routing alone (the experts [T, k] and their weights for the first
    ``rows`` rows), for experts that are not all resident, and every tile on the GPU (one
    Metal launch, ``metal/moe_route.metal``, whose results are those rows' only: [R, k]); None
    where it does not apply."""
    if _INFERENCE.get() and _metal_kernels():
        routing = {"n_used": n_used, "func": func, "normalize": normalize, "scale": scale}
        return metal.moe_route(logits, bias, hashed, **routing, rows=rows)
    ops = _inference_ops()
    if ops is None:
        return None
    indices, weights = ops.moe_route(logits, bias, hashed, rows, n_used, func, normalize, scale)
    return indices, weights


def moe_combine(
    expert_out: mx.array,
    weights: mx.array,
    shared_gate: mx.array,
    shared_up: mx.array,
    shared_down: Weight,
    shared_limit: float,
) -> mx.array | None:
    """``moe_tile``'s sum alone: the routed experts' outputs [R, k, D] of the first R rows
    weighted and summed, plus the shared expert ([T, D], zeros past R): on the GPU the shared
    expert's matmuls and then one Metal launch (``metal/moe_combine.metal``); None where it
    does not apply."""
    if _INFERENCE.get() and _metal_kernels():
        shared = linear(swiglu(shared_gate, shared_up, shared_limit), shared_down)
        return metal.moe_combine(expert_out, weights, shared)
    ops, down_t = _inference_ops(), _frozen_float32(shared_down)
    if ops is not None and down_t is None and _block_ops(shared_down) is not None:
        return _combine_on_blocks(
            expert_out, weights, shared_gate, shared_up, shared_down, shared_limit
        )
    if ops is None or down_t is None:
        return None
    shared = _row_operand(shared_down, down_t)
    return ops.moe_combine(expert_out, weights, shared_gate, shared_up, shared, shared_limit)


def _combine_on_blocks(
    expert_out: mx.array,
    weights: mx.array,
    shared_gate: mx.array,
    shared_up: mx.array,
    shared_down: PackedWeight,
    shared_limit: float,
) -> mx.array:
    """``moe_combine`` with the shared expert's down matrix as GGUF blocks: the same sums, each
    row on its own (so resident and streamed experts still give the same bits)."""
    real, tokens = expert_out.shape[0], shared_gate.shape[0]
    routed = mx.sum(expert_out * weights[:real, :, None], axis=1)
    if tokens > real:
        routed = mx.concatenate([routed, mx.zeros((tokens - real, routed.shape[1]), routed.dtype)])
    hidden = swiglu(shared_gate, shared_up, shared_limit)
    return routed + _blocks_linear(hidden, shared_down, real)


def routed_pairs(
    x: mx.array,
    gate: Weight,
    up: Weight,
    down: Weight,
    indices: mx.array,
    rows: int,
    limit: float,
) -> mx.array | None:
    """Every routed pair's clamped SwiGLU expert output [R, k, 1, D] for the first R = ``rows``
    rows of a GPU decode tile x [T, D], from the routing's ``indices`` [T, k] as made: packed
    matrices take one launch for all pairs that reads each x row in place
    (``metal.pair_linear``), MLX's quantized kinds a gathered matmul. In inference on the GPU
    over those weight kinds; None elsewhere."""
    kinds = (PackedWeight, QuantizedWeight)
    if not (_INFERENCE.get() and _metal_kernels()):
        return None
    if not all(isinstance(w, kinds) for w in (gate, up, down)):
        return None
    hidden = swiglu(
        _pair_products(x, gate, indices, rows), _pair_products(x, up, indices, rows), limit
    )
    return _pair_products(hidden, down, indices, rows)


def _pair_products(
    x: mx.array, w: PackedWeight | QuantizedWeight, indices: mx.array, rows: int
) -> mx.array:
    """``routed_pairs``' product of one matrix: x [T, K] (each row for its k experts) or
    [R, k, 1, K] (one row a pair) -> [R, k, 1, N]."""
    if isinstance(w, PackedWeight):
        return metal.pair_linear(x, w, indices, rows)
    pairs = x[:rows, None, None, :] if x.ndim == 2 else x
    return gather_linear(pairs, w, indices if indices.shape[0] == rows else indices[:rows])


def routed_experts(
    x: mx.array,
    gate: Weight,
    up: Weight,
    down: Weight,
    indices: mx.array,
    limit: float,
    *,
    row_invariant: bool,
) -> mx.array | None:
    """Every (token, slot) pair's routed SwiGLU expert output [T, k, D] as one fused native
    operation on the CPU (``twins.routed_experts`` says what it computes): the pairs of one
    expert share one GEMM, unless ``row_invariant`` asks for every row on its own (decode
    tiles). None where it does not apply (not on the CPU, weights not float32 arrays): the
    caller runs its own matmuls."""
    if _block_ops(gate, up, down) is not None:
        types = [int(w.qtype) for w in (gate, up, down)]
        data = (gate.data, up.data, down.data)
        grouped = not row_invariant
        return native_ops().blocks_experts(x, *data, types, indices, limit, grouped).astype(x.dtype)
    if not _float32_arrays(gate, up, down) or _native_cpu_ops() is None:
        return None
    if _INFERENCE.get():
        return native_ops().routed_experts(x, gate, up, down, indices, limit, not row_invariant)
    return _native_routed_experts(limit, not row_invariant)(x, gate, up, down, indices)


@cache
def _native_routed_experts(limit: float, grouped: bool) -> Callable[..., mx.array]:
    ops = native_ops()
    return mx.compile(
        with_twin_gradient(
            lambda x, g, u, d, i: ops.routed_experts(x, g, u, d, i, limit, grouped),
            lambda x, g, u, d, i: twins.routed_experts(x, g, u, d, i, limit),
            constants=(4,),
        )
    )


@cache
def _native_sparse_attention(scale: float) -> Callable[..., mx.array]:
    ops = native_ops()
    return mx.compile(
        with_twin_gradient(
            lambda q, w, r, c, i, s: ops.sparse_attention(q, w, r, c, i, s, scale),
            lambda q, w, r, c, i, s: twins.sparse_attention(q, w, r, c, i, s, scale),
            constants=(2, 4),
        )
    )


@cache
def _native_hc_mixes(hc: int, iters: int, eps: float) -> Callable[..., tuple[mx.array, ...]]:
    # Compiled, the gradient wrapper costs one primitive (four uncompiled).
    ops = native_ops()
    return mx.compile(
        with_twin_gradient(
            lambda m, s, b: tuple(ops.hc_mixes(m, s, b, hc, iters, eps)),
            lambda m, s, b: twins.hc_mixes(m, s, b, hc, iters, eps),
        )
    )


def sparse_attention(
    q: mx.array,
    window: mx.array,
    window_range: mx.array,
    comp: mx.array,
    comp_index: mx.array,
    sinks: mx.array,
    scale: float,
) -> mx.array:
    """Attention of each row over its window range and its selected compressed rows
    (``twins.sparse_attention`` says how). Each row's result depends on its own keys only."""
    if _native_cpu_ops() is not None and q.dtype == mx.float32:
        if _INFERENCE.get():
            return native_ops().sparse_attention(
                q, window, window_range, comp, comp_index, sinks, scale
            )
        return _native_sparse_attention(scale)(q, window, window_range, comp, comp_index, sinks)
    if _INFERENCE.get() and _metal_kernels() and metal.attention_head_dim_fits(q.shape[-1]):
        # No gradient is taken: the kernel without its twin-gradient wrapper (a primitive less).
        return metal._sparse_attention_kernel(
            q, window, window_range, comp, comp_index, sinks, scale
        )
    return _backend.sparse_attention(q, window, window_range, comp, comp_index, sinks, scale)


def indexer_top_k(
    q: mx.array,
    weights: mx.array,
    keys: mx.array,
    visible: mx.array,
    top_k: int,
    weight_scale: float = 1.0,
) -> mx.array:
    """The lightning indexer's top-k blocks for each row on its own (``twins.indexer_top_k``
    says how, of the head weights times ``weight_scale``): one native primitive on the CPU for
    the whole tile, in inference on the GPU two Metal launches for the whole tile (the scores,
    with the weights' scale inside, and the choice), a loop over rows else."""
    if _INFERENCE.get() and _metal_kernels() and keys.shape[0] >= top_k:
        return metal.indexer_top_k(q, weights, keys, visible, top_k, weight_scale)
    weights = _scaled_by(weight_scale)(weights)
    if _native_cpu_ops() is None or keys.dtype != mx.float32:
        return twins.indexer_top_k(q, weights, keys, visible, top_k)
    return native_ops().indexer_top_k(q, weights, keys, visible, top_k)


@cache
def _scaled_by(scale: float) -> Callable[[mx.array], mx.array]:
    # Compiled, a product with a constant is one primitive (eager, a Broadcast and a Multiply).
    return mx.compile(lambda x: x * scale)


def pool_blocks(
    kv: mx.array, score: mx.array, lo: int, n: int, ratio: int, dim: int, overlap: bool
) -> mx.array | None:
    """A compressor's softmax pooling of ``n`` completed blocks whose rows start at row ``lo``
    of kv and score [N, C] as one native primitive in inference on the CPU; None where that
    does not apply. ``models.compressed_attention.Compressor.pool`` computes the same with
    MLX ops (some twenty primitives). In inference on the GPU: one Metal launch
    (``metal/pool_blocks.metal``)."""
    if _INFERENCE.get() and _metal_kernels():
        return metal.pool_blocks(kv, score, lo, n, ratio, dim, overlap)
    if _inference_ops() is None or kv.dtype != mx.float32:
        return None
    return native_ops().pool_blocks(kv, score, lo, n, ratio, dim, overlap)


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
    w1_t, w2_t = _frozen_float32(w1), _frozen_float32(w2)
    if _inference_ops() is None or w1_t is None or w2_t is None or logits.dtype != mx.float32:
        return None
    rows, picks = native_ops().markov_chain(logits, w1_t, w2_t, anchor, scale, index, first, n)
    return rows, picks


def rms_norm(x: mx.array, weight: mx.array | None, eps: float) -> mx.array | None:
    """``mx.fast.rms_norm`` (also its derivative) as one native primitive on the CPU; None
    where that does not apply (not on the CPU, x not float32)."""
    if x.dtype != mx.float32 or _native_cpu_ops() is None:
        return None
    return native_ops().rms_norm(x, weight, eps)


def grouped_input_shape(w: Weight, tokens: int) -> tuple[int, ...]:
    """The layout ``grouped_linear`` reads x in for w [G, N, K] without a view of it:
    [T, G, 1, K] where each (row, group) is a gathered one-row product (quantized and packed
    weights off the CPU's blocks: the GPU's path), [T, G * K] else."""
    groups, _, width = w.shape
    if isinstance(w, mx.array) or _block_ops(w) is not None:
        return (tokens, groups * width)
    return (tokens, groups, 1, width)


def grouped_linear(x: mx.array, w: Weight, rows: int | None = None) -> mx.array:
    """x [T, G * K] (or [T, G, 1, K], ``grouped_input_shape``) -> [T, G * N]: group g's
    channels times its own matrix, w [G, N, K] stored GGUF-style (``rows``: see ``linear``).
    One native primitive in a CPU decode tile; else a batched matmul between the reshapes and
    transposes that line the groups up."""
    stored = _frozen(w) if isinstance(w, mx.array) else None
    if stored is not None and stored.ndim == 3 and _rows_linear_applies(x, []):
        return native_ops().grouped_rows_linear(x, stored, x.shape[0] if rows is None else rows)
    if _block_ops(w) is not None and x.ndim == 2:
        return _blocks_linear(x, w, rows)
    tokens, groups = x.shape[0], w.shape[0]
    if not isinstance(w, mx.array):
        # Each (row, group) one gathered one-row product: no transposes around it, and a row's
        # bits never depend on the other rows (quantized and packed weights: the GPU's path).
        per_group = x if x.ndim == 4 else x.reshape(tokens, groups, 1, -1)  # [T, G, 1, K]
        return gather_linear(per_group, w, _row_group_grid(tokens, groups)).reshape(tokens, -1)
    grouped = mx.swapaxes(x.reshape(tokens, groups, -1), 0, 1)  # [G, T, K]
    return mx.swapaxes(linear(grouped, w), 0, 1).reshape(tokens, -1)


def grow_rows(
    cached: Sequence[mx.array], new: Sequence[mx.array], take: int, keep: int
) -> list[mx.array]:
    """For each pair: the rows of ``cached[i]`` followed by the first ``take`` rows of
    ``new[i]``, of which the last ``keep`` (all if fewer): a cache growing by a chunk. One
    native primitive for all pairs in inference on the CPU, one Metal launch a pair on the GPU
    (``metal/grow_rows.metal``; two pairs of one shape, a compressor's pending rows, in one:
    ``metal/grow_row_pairs.metal``); MLX slices and concatenations (differentiable) else."""
    ops = _inference_ops()
    if ops is not None and all(a.ndim == 2 and a.dtype == mx.float32 for a in (*cached, *new)):
        return ops.grow_rows(list(cached), list(new), take, keep)
    on_gpu = _INFERENCE.get() and _metal_kernels()
    if on_gpu and _one_shape_pairs(cached, new) and cached[0].shape[0]:
        return list(metal.grow_row_pairs(tuple(cached), tuple(new), take, keep))
    out = []
    for old, fresh in zip(cached, new, strict=True):
        if on_gpu and old.shape[0] and min(old.shape[0] + take, keep):
            out.append(metal.grow_rows(old, fresh, take, keep))
            continue
        full = mx.concatenate([old, fresh[:take]]) if old.shape[0] else fresh[:take]
        out.append(full[full.shape[0] - keep :] if full.shape[0] > keep else full)
    return out


def grow_scored_rows(
    cached: Sequence[mx.array],
    kv: mx.array,
    gate: mx.array,
    embedding: mx.array,
    take: int,
    keep: int,
) -> list[mx.array]:
    """``grow_rows(cached, [kv, gate + embedding], take, keep)``: a compressor's pending kv rows
    and gate scores grown by a chunk's, its scores the gate products plus their position
    embedding; in inference on the GPU the sum is made inside the growth's launch
    (``metal/grow_row_pairs.metal``), a launch less."""
    fresh = (kv, gate)
    on_gpu = _INFERENCE.get() and _metal_kernels()
    if on_gpu and _one_shape_pairs(cached, fresh) and cached[0].shape[0]:
        return list(metal.grow_row_pairs(tuple(cached), fresh, take, keep, embedding))
    return grow_rows(cached, (kv, gate + embedding), take, keep)


def _one_shape_pairs(cached: Sequence[mx.array], new: Sequence[mx.array]) -> bool:
    """Whether ``grow_rows`` has two pairs whose caches, and whose new rows, share a shape."""
    return (
        len(cached) == 2
        and cached[0].shape == cached[1].shape
        and new[0].shape == new[1].shape
        and cached[0].dtype == cached[1].dtype
    )


def rotary(
    x: mx.array,
    cos: mx.array,
    sin: mx.array,
    offset: int,
    n_dims: int,
    interleaved: bool,
    inverse: bool,
    shape: tuple[int, ...] | None = None,
) -> mx.array | None:
    """``models.rope.RoPE.apply`` (its formula is the twin) as one native primitive on the CPU,
    or in inference on the GPU one Metal launch (``metal/rope.metal``; its result already in
    ``shape`` when given), from the angle tables cos/sin [T, n_dims / 2]
    (``RopeAngles.on_device``); None where that does not apply."""
    if _INFERENCE.get() and _metal_kernels():
        return metal.rope(x, cos, sin, offset, n_dims, interleaved, inverse, shape)
    if x.dtype != mx.float32 or _native_cpu_ops() is None:
        return None
    return native_ops().rope(x, cos, sin, offset, n_dims, interleaved, inverse)


def norm_rotary(
    x: mx.array,
    weight: mx.array | None,
    eps: float,
    cos: mx.array,
    sin: mx.array,
    offset: int,
    n_dims: int,
    interleaved: bool,
    heads: int | None = None,
) -> mx.array | None:
    """``models.rope.RoPE.apply_normed`` (an RMS norm, then ``rotary``) as one Metal launch in
    inference on the GPU (``metal/norm_rope.metal``); None elsewhere."""
    if not (_INFERENCE.get() and _metal_kernels()):
        return None
    return metal.norm_rope(x, weight, eps, cos, sin, offset, n_dims, interleaved, heads)


# What a KDA layer's decode tile reads besides its rows (models import it from here).
KDAWeights = twins.KDAWeights


def kda_tile(
    w: KDAWeights,
    qkv: Sequence[mx.array],
    beta: mx.array,
    decay: mx.array,
    gate: mx.array,
    conv_rows: mx.array,
    states: mx.array,
    newest: mx.array,
    n_real: int,
) -> tuple[mx.array, mx.array, mx.array]:
    """A KDA decode tile between its input and output projections (``twins.kda_tile`` says
    what it computes): (output [T, H * D], kept conv rows, the real rows' new states; ``states`` is
    only read). One native primitive
    in inference on the CPU, one Metal launch in inference on the GPU
    (``metal/kda_tile.metal``), the twin's MLX ops else."""
    if _INFERENCE.get() and _metal_kernels() and metal.kda_head_dim_fits(w.a, qkv[0]):
        return metal.kda_tile(w, qkv, beta, decay, gate, conv_rows, states, newest, n_real)
    ops = _inference_ops()
    if ops is None or qkv[0].dtype != mx.float32:
        return twins.kda_tile(w, qkv, beta, decay, gate, conv_rows, states, newest, n_real)
    out, rows, kept = ops.kda_tile(
        *qkv,
        beta,
        decay,
        gate,
        w.dt_bias,
        w.a,
        conv_rows,
        w.conv,
        states,
        w.norm_weight,
        newest,
        n_real,
        w.lower_bound,
        w.eps,
        w.keep_rows,
    )
    return out, rows, kept


def dequantize(w: Weight) -> mx.array:
    """The weight as a float32 array [..., out, in] (for checks and small one-off uses)."""
    if isinstance(w, mx.array):
        return w.astype(mx.float32)
    if isinstance(w, QuantizedWeight):
        return mx.dequantize(
            w.packed, w.scales, w.biases, w.group_size, w.bits, w.mode, dtype=mx.float32
        )
    if _block_ops(w) is not None:
        rows = w.data.reshape(-1, w.data.shape[-1])
        indices = mx.arange(rows.shape[0], dtype=mx.int32)
        return native_ops().blocks_rows(rows, int(w.qtype), indices).reshape(w.shape)
    return twins.dequantize_packed(w.data, w.qtype)


def embed_streams(w: Weight, tokens: mx.array, hc: int) -> mx.array | None:
    """The rows ``take_rows(w, tokens)`` as ``hc`` identical mHC streams, float32
    [T, hc * D] (the flat layout an mHC site reads): one Metal launch in inference on the GPU
    for MLX's affine layouts of whole values a word (``metal/embed_streams.metal``); None
    elsewhere."""
    if not (_INFERENCE.get() and _metal_kernels() and isinstance(w, QuantizedWeight)):
        return None
    if w.mode != "affine" or w.bits not in (2, 4, 8) or w.biases is None:
        return None
    return metal.embed_streams(tokens, w.packed, w.scales, w.biases, w.bits, w.group_size, hc)


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
    if _block_ops(w) is not None:
        return native_ops().blocks_rows(w.data, int(w.qtype), indices)
    return twins.dequantize_packed(w.data[indices], w.qtype)


__all__ = [
    "KDAWeights",
    "KERNEL_CHOICES",
    "PACKED_KERNELS",
    "PackedWeight",
    "QuantizedWeight",
    "RowCodes",
    "Weight",
    "attach_codes",
    "dequantize",
    "embed_streams",
    "freeze",
    "gather_linear",
    "grouped_input_shape",
    "grouped_linear",
    "grow_rows",
    "grow_scored_rows",
    "linear",
    "linear_many",
    "markov_chain",
    "moe_combine",
    "moe_route",
    "moe_tile",
    "norm_rotary",
    "pool_blocks",
    "rms_norm",
    "select_kernel_backend",
    "hc_expand",
    "hc_mixes",
    "hc_head_norm",
    "hc_pre",
    "hc_site_norm",
    "hc_site",
    "inference",
    "indexer_top_k",
    "kda_tile",
    "rotary",
    "routed_experts",
    "routed_pairs",
    "sinkhorn",
    "sparse_attention",
    "swiglu",
    "take_rows",
]
