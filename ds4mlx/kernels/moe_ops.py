"""A mixture-of-experts FFN's fused operations: a decode tile's whole FFN (``moe_tile``), or its
routing (``moe_route``), its expert products (``routed_pairs``, ``routed_experts``) and their
weighted sum with the shared expert (``moe_combine``) where the experts are not all resident
or the tile runs on a Mac.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from ds4mlx.kernels import metal, metal_fused, twins
from ds4mlx.kernels.dispatch import in_inference, inference_ops, metal_kernels, native_cpu_ops
from ds4mlx.kernels.gradients import with_twin_gradient
from ds4mlx.kernels.matmul import (
    block_ops,
    blocks_linear,
    expert_operand,
    float32_arrays,
    frozen_float32,
    gather_linear,
    linear,
    row_operand,
)
from ds4mlx.kernels.native import native_ops
from ds4mlx.kernels.twins import swiglu
from ds4mlx.kernels.weights import PackedWeight, QuantizedWeight, Weight

import mlx.core as mx


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
    ops, down_t = inference_ops(), frozen_float32(shared_down)
    if ops is None or down_t is None or not float32_arrays(gate, up, down):
        return None
    return ops.moe_tile(
        logits,
        x,
        expert_operand(gate),
        expert_operand(up),
        expert_operand(down),
        shared_gate,
        shared_up,
        row_operand(shared_down, down_t),
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
    if in_inference() and metal_kernels():
        routing = {"n_used": n_used, "func": func, "normalize": normalize, "scale": scale}
        return metal_fused.moe_route(logits, bias, hashed, **routing, rows=rows)
    ops = inference_ops()
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
    if in_inference() and metal_kernels():
        shared = linear(swiglu(shared_gate, shared_up, shared_limit), shared_down)
        return metal_fused.moe_combine(expert_out, weights, shared)
    ops, down_t = inference_ops(), frozen_float32(shared_down)
    if ops is not None and down_t is None and block_ops(shared_down) is not None:
        return _combine_on_blocks(
            expert_out, weights, shared_gate, shared_up, shared_down, shared_limit
        )
    if ops is None or down_t is None:
        return None
    shared = row_operand(shared_down, down_t)
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
    return routed + blocks_linear(hidden, shared_down, real)


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
    if not (in_inference() and metal_kernels()):
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
    if block_ops(gate, up, down) is not None:
        types = [int(w.qtype) for w in (gate, up, down)]
        data = (gate.data, up.data, down.data)
        grouped = not row_invariant
        return native_ops().blocks_experts(x, *data, types, indices, limit, grouped).astype(x.dtype)
    if not float32_arrays(gate, up, down) or native_cpu_ops() is None:
        return None
    if in_inference():
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
