"""Metal kernels for packed GGML weights, built with ``mx.fast.metal_kernel`` from ``metal/``.

The header is ``metal/common.metal`` + ``metal/<type>.metal`` (block layout and decoder); the
body is ``metal/linear.metal``, shared by every format. A plain matmul is the gather with one
expert, so one kernel serves ``linear`` and ``gather_linear``. Semantics match ``kernels.twins``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from ds4mlx.kernels.twins import iq2_xxs_tables
from ds4mlx.kernels.weights import PackedWeight

import mlx.core as mx
from gguf import GGMLQuantizationType

METAL_SOURCE_DIR = Path(__file__).resolve().parents[2] / "metal"
ROWS_PER_SIMDGROUP = 8  # x rows that share one decode of a weight sub-block
MAX_THREADGROUP = 256
SIMD_WIDTH = 32


def metal_available() -> bool:
    return hasattr(mx.fast, "metal_kernel") and mx.metal.is_available()


@cache
def _kernel(qtype: GGMLQuantizationType):
    sources = ("common.metal", f"{qtype.name.lower()}.metal")
    header = "\n".join((METAL_SOURCE_DIR / name).read_text() for name in sources)
    return mx.fast.metal_kernel(
        name=f"ds4_{qtype.name.lower()}_linear",
        input_names=["x", "w", "tables", "expert_indices"],
        output_names=["y"],
        source=(METAL_SOURCE_DIR / "linear.metal").read_text(),
        header=header,
    )


@cache
def _tables(qtype: GGMLQuantizationType) -> mx.array:
    if qtype == GGMLQuantizationType.IQ2_XXS:
        grid, ksigns = iq2_xxs_tables()
        return mx.concatenate([grid.astype(mx.uint8).flatten(), ksigns])
    return mx.zeros((1,), dtype=mx.uint8)  # formats without tables ignore the input


def _run(x: mx.array, w: PackedWeight, expert_indices: mx.array) -> mx.array:
    """x [P, M, K], expert_indices [P] -> y [P, M, N] with y[p] = x[p] @ W[expert_indices[p]].T."""
    n_out, k = w.shape[-2:]
    n_batches, n_rows, _ = x.shape
    return _kernel(w.qtype)(
        inputs=[x, w.data, _tables(w.qtype), expert_indices.astype(mx.uint32)],
        template=[("T", x.dtype), ("K", k), ("N", n_out), ("ROWS", ROWS_PER_SIMDGROUP)],
        grid=(SIMD_WIDTH * n_out, -(-n_rows // ROWS_PER_SIMDGROUP), n_batches),
        threadgroup=(min(MAX_THREADGROUP, SIMD_WIDTH * n_out), 1, 1),
        output_shapes=[(n_batches, n_rows, n_out)],
        output_dtypes=[x.dtype],
    )[0]


def linear(x: mx.array, w: PackedWeight) -> mx.array:
    """x @ W.T for a 2-D packed W [out, in]."""
    *outer, k = x.shape
    y = _run(x.reshape(1, -1, k), w, mx.zeros((1,), dtype=mx.uint32))
    return y.reshape(*outer, w.shape[-2])


def gather_linear(
    x: mx.array, w: PackedWeight, expert_indices: mx.array, sorted_indices: bool = False
) -> mx.array:
    """``mx.gather_mm(x, W.swapaxes(-1, -2), rhs_indices=expert_indices)`` for a packed W.

    ``sorted_indices`` is accepted for the common signature; the kernel does not need it.
    """
    batch = mx.broadcast_shapes(x.shape[:-2], expert_indices.shape)
    n_rows, k = x.shape[-2:]
    x_flat = mx.broadcast_to(x, (*batch, n_rows, k)).reshape(-1, n_rows, k)
    indices = mx.broadcast_to(expert_indices, batch).reshape(-1)
    return _run(x_flat, w, indices).reshape(*batch, n_rows, w.shape[-2])
