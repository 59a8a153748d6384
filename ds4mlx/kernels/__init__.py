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
from collections.abc import Callable
from functools import cache
from types import ModuleType

from ds4mlx.kernels import metal, twins
from ds4mlx.kernels.gradients import with_twin_gradient
from ds4mlx.kernels.native import native_ops
from ds4mlx.kernels.twins import swiglu
from ds4mlx.kernels.weights import PackedWeight, QuantizedWeight, Weight

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
    leading = w.shape[:-2]
    return mx.arange(math.prod(leading), dtype=mx.uint32).reshape(leading)


# The [..., in, out] copies of frozen weights (``freeze``), by the id of the [..., out, in] view
# the model holds; an entry leaves with its weight (a weak reference's callback).
_TRANSPOSED: dict[int, tuple[weakref.ref, mx.array]] = {}


def freeze(w: Weight) -> Weight:
    """Declare an inference matrix that is never updated nor differentiated, and store a plain
    array as [..., in, out] contiguous: MLX's CPU matmul takes a transposed operand at a third
    of the speed (38 vs 13 µs for a decode tile's [8, 256] x [256, 256]), and a Transpose
    primitive each call besides. Returns the same values as a [..., out, in] view of that
    memory (no second copy is kept), which ``linear`` recognises."""
    if not (isinstance(w, mx.array) and w.ndim >= 2):
        return w
    stored = mx.contiguous(mx.swapaxes(w, -1, -2))
    view = mx.swapaxes(stored, -1, -2)
    mx.eval(stored, view)
    key = id(view)
    _TRANSPOSED[key] = (weakref.ref(view, lambda _: _TRANSPOSED.pop(key, None)), stored)
    return view


def _transposed(w: mx.array) -> mx.array:
    entry = _TRANSPOSED.get(id(w))
    if entry is not None and entry[0]() is w:
        return entry[1]
    return mx.swapaxes(w, -1, -2)


def linear(x: mx.array, w: Weight) -> mx.array:
    """x @ w.T for a weight stored GGUF-style as [out_features, in_features].

    A weight with leading dims [..., out, in] is a stack of matrices: the product broadcasts over
    them like ``x @ w.swapaxes(-1, -2)``.
    """
    if isinstance(w, mx.array):
        return (x @ _transposed(w)).astype(x.dtype)
    if len(w.shape) > 2:
        return gather_linear(x, w, _expert_grid(w))
    if isinstance(w, QuantizedWeight):
        out = mx.quantized_matmul(
            x, w.packed, w.scales, w.biases, True, w.group_size, w.bits, w.mode
        )
        return out.astype(x.dtype)
    return _backend.linear(x, w)


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
            x, _transposed(w), rhs_indices=expert_indices, sorted_indices=sorted_indices
        )
        return out.astype(x.dtype)
    if isinstance(w, QuantizedWeight):
        out = mx.gather_qmm(
            x,
            w.packed,
            w.scales,
            w.biases,
            rhs_indices=expert_indices,
            transpose=True,
            group_size=w.group_size,
            bits=w.bits,
            mode=w.mode,
            sorted_indices=sorted_indices,
        )
        return out.astype(x.dtype)
    return _backend.gather_linear(x, w, expert_indices, sorted_indices)


def _native_cpu_ops() -> ModuleType | None:
    """The native CPU operations when computing on the CPU (``kernels.native``)."""
    if mx.default_device() != mx.cpu:
        return None
    return native_ops()


def sinkhorn(comb: mx.array, iters: int, eps: float) -> mx.array:
    """Sinkhorn-normalised mHC mixing matrices [..., src, dst] (``twins.sinkhorn`` says how).
    On the CPU the models run it inside the native ``hc_pre`` / ``hc_mixes`` primitives."""
    return _backend.sinkhorn(comb, iters, eps)


def hc_mixes(mixes: mx.array, scale: mx.array, base: mx.array, hc: int, iters: int,
             eps: float) -> tuple[mx.array, mx.array, mx.array]:
    """One mHC site's (pre, post, comb) from its projected mixes (``twins.hc_mixes`` says
    how): one native primitive on the CPU, the Sinkhorn in one Metal launch on Metal."""
    if _native_cpu_ops() is not None:
        return _native_hc_mixes(hc, iters, eps)(mixes, scale, base)
    return twins.hc_mixes(mixes, scale, base, hc, iters, eps, sinkhorn_fn=_backend.sinkhorn)


def hc_pre(x: mx.array, fn: Weight, scale: mx.array, base: mx.array, hc: int, iters: int,
           eps: float, norm_eps: float) -> tuple[mx.array, mx.array, mx.array] | None:
    """A whole mHC site before its block as one native primitive on the CPU
    (``twins.hc_pre`` says what it computes): (block input [T, D], post, comb). None where
    that does not apply (not on the CPU, ``fn`` not a float32 array)."""
    if not (isinstance(fn, mx.array) and fn.dtype == mx.float32 and x.dtype == mx.float32):
        return None
    if _native_cpu_ops() is None:
        return None
    # A frozen matrix's [in, out] memory as stored (else a transposed view, read as a copy).
    return _native_hc_pre(hc, iters, eps, norm_eps)(x, _transposed(fn), scale, base)


def hc_expand(out: mx.array, residual: mx.array, post: mx.array, comb: mx.array) -> mx.array:
    """The mHC streams after a block (``twins.hc_expand`` says how): one native primitive on
    the CPU."""
    if _native_cpu_ops() is None or residual.dtype != mx.float32:
        return twins.hc_expand(out, residual, post, comb)
    return _native_hc_expand()(out, residual, post, comb)


@cache
def _native_hc_pre(hc: int, iters: int, eps: float, norm_eps: float
                   ) -> Callable[..., tuple[mx.array, ...]]:
    ops = native_ops()
    return mx.compile(with_twin_gradient(
        lambda x, f, s, b: tuple(ops.hc_pre(x, f, s, b, hc, iters, eps, norm_eps)),
        lambda x, f, s, b: twins.hc_pre(x, f, s, b, hc, iters, eps, norm_eps)))


@cache
def _native_hc_expand() -> Callable[..., mx.array]:
    ops = native_ops()
    return mx.compile(with_twin_gradient(ops.hc_expand, twins.hc_expand))


def routed_experts(x: mx.array, gate: Weight, up: Weight, down: Weight, indices: mx.array,
                   limit: float, *, row_invariant: bool) -> mx.array | None:
    """Every (token, slot) pair's routed SwiGLU expert output [T, k, D] as one fused native
    operation on the CPU (``twins.routed_experts`` says what it computes): the pairs of one
    expert share one GEMM, unless ``row_invariant`` asks for every row on its own (decode
    tiles). None where it does not apply (not on the CPU, weights not float32 arrays): the
    caller runs its own matmuls."""
    if not all(isinstance(w, mx.array) and w.dtype == mx.float32 for w in (gate, up, down)):
        return None
    if _native_cpu_ops() is None:
        return None
    return _native_routed_experts(limit, not row_invariant)(x, gate, up, down, indices)


@cache
def _native_routed_experts(limit: float, grouped: bool) -> Callable[..., mx.array]:
    ops = native_ops()
    return mx.compile(with_twin_gradient(
        lambda x, g, u, d, i: ops.routed_experts(x, g, u, d, i, limit, grouped),
        lambda x, g, u, d, i: twins.routed_experts(x, g, u, d, i, limit),
        constants=(4,)))


@cache
def _native_sparse_attention(scale: float) -> Callable[..., mx.array]:
    ops = native_ops()
    return mx.compile(with_twin_gradient(
        lambda q, w, r, c, i, s: ops.sparse_attention(q, w, r, c, i, s, scale),
        lambda q, w, r, c, i, s: twins.sparse_attention(q, w, r, c, i, s, scale),
        constants=(2, 4)))


@cache
def _native_hc_mixes(hc: int, iters: int, eps: float) -> Callable[..., tuple[mx.array, ...]]:
    # Compiled, the gradient wrapper costs one primitive (four uncompiled).
    ops = native_ops()
    return mx.compile(with_twin_gradient(
        lambda m, s, b: tuple(ops.hc_mixes(m, s, b, hc, iters, eps)),
        lambda m, s, b: twins.hc_mixes(m, s, b, hc, iters, eps)))


def sparse_attention(q: mx.array, window: mx.array, window_range: mx.array, comp: mx.array,
                     comp_index: mx.array, sinks: mx.array, scale: float) -> mx.array:
    """Attention of each row over its window range and its selected compressed rows
    (``twins.sparse_attention`` says how). Each row's result depends on its own keys only."""
    if _native_cpu_ops() is not None and q.dtype == mx.float32:
        return _native_sparse_attention(scale)(q, window, window_range, comp, comp_index, sinks)
    return _backend.sparse_attention(q, window, window_range, comp, comp_index, sinks, scale)


def indexer_top_k(q: mx.array, weights: mx.array, keys: mx.array, visible: mx.array,
                  top_k: int) -> mx.array:
    """The lightning indexer's top-k blocks for each row on its own (``twins.indexer_top_k``
    says how): one native primitive on the CPU for the whole tile, a loop over rows else."""
    if _native_cpu_ops() is None or keys.dtype != mx.float32:
        return twins.indexer_top_k(q, weights, keys, visible, top_k)
    return native_ops().indexer_top_k(q, weights, keys, visible, top_k)


def rotary(x: mx.array, cos: np.ndarray, sin: np.ndarray, offset: int, n_dims: int,
           interleaved: bool, inverse: bool) -> mx.array | None:
    """``models.rope.RoPE.apply`` (its formula is the twin) as one native primitive on the CPU,
    from the host's angle tables cos/sin [T, n_dims / 2]; None where that does not apply (not
    on the CPU, x not float32)."""
    if x.dtype != mx.float32 or _native_cpu_ops() is None:
        return None
    return native_ops().rope(x, mx.array(cos), mx.array(sin), offset, n_dims, interleaved,
                             inverse)


def dequantize(w: Weight) -> mx.array:
    """The weight as a float32 array [..., out, in] (for checks and small one-off uses)."""
    if isinstance(w, mx.array):
        return w.astype(mx.float32)
    if isinstance(w, QuantizedWeight):
        return mx.dequantize(
            w.packed, w.scales, w.biases, w.group_size, w.bits, w.mode, dtype=mx.float32
        )
    return twins.dequantize_packed(w.data, w.qtype)


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
    return twins.dequantize_packed(w.data[indices], w.qtype)


__all__ = [
    "KERNEL_CHOICES",
    "PACKED_KERNELS",
    "PackedWeight",
    "QuantizedWeight",
    "Weight",
    "dequantize",
    "freeze",
    "gather_linear",
    "linear",
    "select_kernel_backend",
    "hc_expand",
    "hc_mixes",
    "hc_pre",
    "indexer_top_k",
    "rotary",
    "routed_experts",
    "sinkhorn",
    "sparse_attention",
    "swiglu",
    "take_rows",
]
