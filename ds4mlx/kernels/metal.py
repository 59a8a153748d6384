"""Metal kernels built with ``mx.fast.metal_kernel`` from the sources in ``metal/``: the
packed-weight backend (the interface ``kernels.twins`` also has: ``linear``, ``gather_linear``,
``sinkhorn``, ``sparse_attention``) and the launch helpers ``kernels.metal_fused`` builds the
fused inference kernels with.

Packed GGML weights: the header is ``metal/common.metal`` + ``metal/<type>.metal`` (block layout
and decoder) + the format's lookup tables; the body is ``metal/linear.metal``, the packed mat-vec
shared by every format, its threadgroup shape chosen per (out features, x rows) by
``matvec_launch``. A plain matmul is the gather with one expert, so one kernel serves ``linear``
and ``gather_linear`` (every selected expert of a tile in one launch; ``pair_linear`` every
routed pair of a tile). Besides: ``metal/sinkhorn.metal`` (fused mHC Sinkhorn) and
``metal/sparse_attention.metal`` (CSA/HCA attention over selected compressed rows, 8 query heads
sharing each key read). No template argument follows the context length, so a session compiles
each kernel once. Semantics match ``kernels.twins``; tests/kernels/metal_emulation.cpp runs and
measures the sources without a Mac.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from ds4mlx.kernels import twins
from ds4mlx.kernels.gradients import with_twin_gradient
from ds4mlx.kernels.twins import iq2_xxs_tables
from ds4mlx.kernels.weights import PackedWeight
from ds4mlx.resources import data_dir

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType

METAL_SOURCE_DIR = data_dir("metal")
MAX_THREADGROUP = 256
SIMD_WIDTH = 32
MAX_SIMDGROUPS = 8  # simdgroups per threadgroup of the packed mat-vec
ROWS_PER_SIMDGROUP = 4  # weight rows a simdgroup computes from one load of x
X_ROW_TILES = (1, 2, 4, 8)  # x rows per threadgroup: decode, verify, and 8-row tiles beyond
MAX_ATTENTION_HEADS_PER_GROUP = 8  # query heads sharing one read of each key row
ATTENTION_SPLITS = 2  # simdgroups that split one head's keys
MAX_ATTENTION_HEAD_DIM = 512  # 8 staged key rows of float32 fill 16 KiB of threadgroup memory


def metal_available() -> bool:
    return hasattr(mx.fast, "metal_kernel") and mx.metal.is_available()


@dataclass(frozen=True)
class MatVecLaunch:
    """Template arguments of ``metal/linear.metal`` for one shape: its threadgroups hold
    ``simdgroups * rows`` weight rows and ``x_rows`` rows of x."""

    simdgroups: int
    rows: int
    x_rows: int

    def grid(self, n_out: int, n_rows: int, n_batches: int) -> tuple[int, int, int]:
        rows_per_group = self.simdgroups * self.rows
        return (
            SIMD_WIDTH * self.simdgroups * -(-n_out // rows_per_group),
            -(-n_rows // self.x_rows),
            n_batches,
        )


def matvec_launch(n_out: int, n_rows: int) -> MatVecLaunch:
    """The launch for ``n_rows`` x rows times ``n_out`` weight rows: the smallest x-row tile
    that holds them (8-row tiles beyond 8), and as many simdgroups (a power of two, at most 8)
    as the weight rows fill."""
    x_rows = next((tile for tile in X_ROW_TILES if tile >= n_rows), X_ROW_TILES[-1])
    simdgroups = 1
    while simdgroups < MAX_SIMDGROUPS and simdgroups * ROWS_PER_SIMDGROUP < n_out:
        simdgroups *= 2
    return MatVecLaunch(simdgroups, ROWS_PER_SIMDGROUP, x_rows)


def attention_heads_per_group(heads: int) -> int:
    """Query heads one sparse-attention threadgroup serves: the largest divisor of ``heads``
    up to 8, so each key row is read once per group of (usually) 8 heads."""
    return max(g for g in range(1, MAX_ATTENTION_HEADS_PER_GROUP + 1) if heads % g == 0)


def attention_head_dim_fits(dim: int) -> bool:
    """Whether the sparse-attention kernel serves heads of ``dim`` channels: whole simdgroup
    strides, and key rows small enough to stage in threadgroup memory."""
    return dim % SIMD_WIDTH == 0 and dim <= MAX_ATTENTION_HEAD_DIM


def table_words(qtype: GGMLQuantizationType) -> np.ndarray:
    """The lookup tables a format's kernel reads (``DS4_TABLE_WORDS`` uint32 words): for
    IQ2_XXS the grid (one 8-byte row in two words) then the 128 ksigns bytes, from
    ``gguf.quants``; a single unused word for the formats without tables."""
    if qtype != GGMLQuantizationType.IQ2_XXS:
        return np.zeros(1, dtype=np.uint32)
    grid, ksigns = iq2_xxs_tables()
    table_bytes = np.concatenate([np.array(grid, dtype=np.uint8).reshape(-1), np.array(ksigns)])
    return table_bytes.view(np.uint32)


def format_header(qtype: GGMLQuantizationType) -> str:
    """The kernel header of a packed format: the shared helpers, the format's decoder and its
    lookup tables as a constant array."""
    sources = ("common.metal", f"{qtype.name.lower()}.metal")
    words = ", ".join(f"{word}u" for word in table_words(qtype))
    tables = f"constant uint ds4_table_words[] = {{{words}}};\n"
    return "\n".join((METAL_SOURCE_DIR / name).read_text() for name in sources) + tables


@cache
def host_constant(value: float | int, dtype: mx.Dtype) -> mx.array:
    """A one-element array made on the host: a placeholder input is then no primitive (an
    ``mx.zeros`` is one on every call)."""
    return mx.array([value], dtype=dtype)


@cache
def host_ints(*values: int) -> mx.array:
    """int32 ``values`` made on the host (no primitive): sizes a kernel reads, where MLX passes
    no output's shape."""
    return mx.array(values, dtype=mx.int32)


@cache
def _kernel(qtype: GGMLQuantizationType):
    return mx.fast.metal_kernel(
        name=f"ds4_{qtype.name.lower()}_linear",
        input_names=["x", "w", "expert_indices", "real_rows"],
        output_names=["y"],
        source=(METAL_SOURCE_DIR / "linear.metal").read_text(),
        header=format_header(qtype),
    )


def _run(
    x: mx.array, w: PackedWeight, expert_indices: mx.array, real_rows: int | None = None
) -> mx.array:
    """x [P, M, K], expert_indices [P] -> y [P, M, N] with y[p] = x[p] @ W[expert_indices[p]].T
    (of each x[p]'s first ``real_rows`` rows, zeros past them, when given)."""
    n_batches, n_rows, _ = x.shape
    shape = (n_batches, n_rows, w.shape[-2])
    return _launch(x, w, expert_indices, n_batches, n_rows, 1, shape, real_rows)


def _launch(
    x: mx.array,
    w: PackedWeight,
    expert_indices: mx.array,
    n_batches: int,
    n_rows: int,
    x_share: int,
    shape: tuple[int, ...],
    real_rows: int | None = None,
) -> mx.array:
    """``metal/linear.metal`` over ``n_batches`` batches of ``n_rows`` x rows, ``x_share``
    consecutive batches reading one x batch; the result declared as ``shape``. ``real_rows``:
    only each batch's first rows are computed (the others come back zeros), in the x-row tile
    of all ``n_rows``, so each row's bits are those of the whole launch's."""
    n_out, k = w.shape[-2:]
    launch = matvec_launch(n_out, n_rows)
    computed = n_rows if real_rows is None else min(real_rows, n_rows)
    # Rows not computed are zeros, as the CPU leaves them (MLX fills the output first).
    padding = {"init_value": 0.0} if computed < n_rows else {}
    return _kernel(w.qtype)(
        inputs=[
            x,
            w.data,
            expert_indices.astype(mx.uint32),  # no-op for moe_route's
            host_constant(computed, mx.int32),
        ],
        template=[
            ("T", x.dtype),
            ("K", k),
            ("N", n_out),
            ("SIMDGROUPS", launch.simdgroups),
            ("ROWS", launch.rows),
            ("XROWS", launch.x_rows),
            ("XSHARE", x_share),
        ],
        grid=launch.grid(n_out, computed, n_batches),
        threadgroup=(SIMD_WIDTH * launch.simdgroups, 1, 1),
        output_shapes=[shape],
        output_dtypes=[x.dtype],
        **padding,
    )[0]


def linear(x: mx.array, w: PackedWeight, rows: int | None = None) -> mx.array:
    """x @ W.T for a 2-D packed W [out, in]; ``rows``: only x's first rows (of its flattened
    rows) are computed, the others are zeros (``kernels.linear``'s rows hint)."""
    *outer, k = x.shape
    y = _run(x.reshape(1, -1, k), w, host_constant(0, mx.uint32), rows)
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


def pair_linear(x: mx.array, w: PackedWeight, indices: mx.array, rows: int) -> mx.array:
    """Each routed pair's product [R, k, 1, N] for the first R = ``rows`` rows of a tile's
    experts ``indices`` [T, k]: pair (r, s) is x's row r times W[indices[r, s]], x being the
    tile [T, K] (each row read where it lies by its k experts: XSHARE k) or one row a pair
    [R, k, 1, K]. No view or copy of x or the indices comes first (the launch reads the
    indices' first R * k values)."""
    slots = indices.shape[1]
    shape = (rows, slots, 1, w.shape[-2])
    return _launch(x, w, indices, rows * slots, 1, slots if x.ndim == 2 else 1, shape)


@cache
def body_kernel(
    name: str,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...] = ("out",),
    header: str | tuple[str, ...] = "",
):
    """A kernel whose whole body is ``metal/<name>.metal`` (after ``metal/<header>.metal``, or
    each of several headers in order)."""
    headers = (header,) if isinstance(header, str) else header
    return mx.fast.metal_kernel(
        name=f"ds4_{name}",
        input_names=list(inputs),
        output_names=list(outputs),
        source=(METAL_SOURCE_DIR / f"{name}.metal").read_text(),
        header="".join((METAL_SOURCE_DIR / f"{h}.metal").read_text() for h in headers if h),
    )


def sinkhorn(comb: mx.array, iters: int, eps: float) -> mx.array:
    """``twins.sinkhorn`` in one launch: one thread per [hc, hc] matrix."""
    return _sinkhorn_function(iters, eps)(comb)


@cache
def _sinkhorn_function(iters: int, eps: float):
    # Built once per model configuration, not once per layer call: Sinkhorn runs twice a layer.
    return with_twin_gradient(
        lambda c: _sinkhorn_kernel(c, iters, eps), lambda c: twins.sinkhorn(c, iters, eps)
    )


def _sinkhorn_kernel(comb: mx.array, iters: int, eps: float) -> mx.array:
    hc = comb.shape[-1]
    flat = comb.astype(mx.float32).reshape(-1, hc, hc)
    n = flat.shape[0]
    out = body_kernel("sinkhorn", ("comb", "eps"), header="hc")(
        inputs=[flat, mx.array([eps], dtype=mx.float32)],
        template=[("HC", hc), ("ITERS", iters)],
        grid=(n, 1, 1),
        threadgroup=(max(1, min(n, MAX_THREADGROUP)), 1, 1),
        output_shapes=[flat.shape],
        output_dtypes=[mx.float32],
    )[0]
    return out.reshape(comb.shape)


def sparse_attention(
    q: mx.array,
    window: mx.array,
    window_range: mx.array,
    comp: mx.array,
    comp_index: mx.array,
    sinks: mx.array,
    scale: float,
) -> mx.array:
    """``twins.sparse_attention`` without the gathered key copy; head dims that are not a
    multiple of the SIMD width, or wider than the kernel stages, fall back to the twin."""
    if not attention_head_dim_fits(q.shape[-1]):
        return twins.sparse_attention(q, window, window_range, comp, comp_index, sinks, scale)
    return _sparse_attention_function(scale)(q, window, window_range, comp, comp_index, sinks)


@cache
def _sparse_attention_function(scale: float):
    # Built once per attention scale (once per model), not once per call: the window ranges
    # and block indices are inputs, not captured values.
    return with_twin_gradient(
        lambda q, w, r, c, i, s: _sparse_attention_kernel(q, w, r, c, i, s, scale),
        lambda q, w, r, c, i, s: twins.sparse_attention(q, w, r, c, i, s, scale),
        constants=(2, 4),
    )


@cache
def _no_compressed_rows(
    dim: int, dtype: mx.Dtype, slots: tuple[int, ...]
) -> tuple[mx.array, mx.array]:
    """One zero row and slots that all say unused: made on the host, no primitives."""
    return mx.array(np.zeros((1, dim), np.float32), dtype=dtype), mx.array(
        np.full(slots, -1, np.int32)
    )


def _sparse_attention_kernel(
    q: mx.array,
    window: mx.array,
    window_range: mx.array,
    comp: mx.array,
    comp_index: mx.array,
    sinks: mx.array,
    scale: float,
) -> mx.array:
    tokens, heads, dim = q.shape
    if comp.shape[0] == 0:  # an empty input cannot be bound; no slot may point into it
        comp, comp_index = _no_compressed_rows(dim, q.dtype, tuple(comp_index.shape))
    group = attention_heads_per_group(heads)
    threads = SIMD_WIDTH * group * ATTENTION_SPLITS
    return body_kernel(
        "sparse_attention", ("q", "window", "window_range", "comp", "comp_index", "sinks", "scale")
    )(
        inputs=[
            q,
            window.astype(q.dtype),
            window_range.astype(mx.int32),
            comp.astype(q.dtype),
            comp_index.astype(mx.int32),
            sinks.astype(mx.float32),
            mx.array([scale], dtype=mx.float32),
        ],
        template=[("T_", q.dtype), ("D", dim), ("HEADS", group), ("SPLITS", ATTENTION_SPLITS)],
        grid=(threads, heads // group, tokens),
        threadgroup=(threads, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )[0]
