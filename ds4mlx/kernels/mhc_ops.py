"""The mHC (manifold-constrained hyper-connection) operations: a site's mixes with their
Sinkhorn normalisation, the collapse of the streams into a block's input, and their expansion
after the block; one native primitive each on the CPU, one Metal launch each on a Mac.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from ds4mlx.kernels import dispatch, metal_fused, twins
from ds4mlx.kernels.dispatch import in_inference, metal_kernels, native_cpu_ops, row_count
from ds4mlx.kernels.gradients import with_twin_gradient
from ds4mlx.kernels.matmul import linear, transposed
from ds4mlx.kernels.native import native_ops
from ds4mlx.kernels.weights import Weight

import mlx.core as mx


def sinkhorn(comb: mx.array, iters: int, eps: float) -> mx.array:
    """Sinkhorn-normalised mHC mixing matrices [..., src, dst] (``twins.sinkhorn`` says how).
    On the CPU the models run it inside the native ``hc_pre`` / ``hc_mixes`` primitives."""
    return dispatch.backend.sinkhorn(comb, iters, eps)


def hc_mixes(
    mixes: mx.array, scale: mx.array, base: mx.array, hc: int, iters: int, eps: float
) -> tuple[mx.array, mx.array, mx.array]:
    """One mHC site's (pre, post, comb) from its projected mixes (``twins.hc_mixes`` says
    how): one native primitive on the CPU, the Sinkhorn in one Metal launch on Metal."""
    if native_cpu_ops() is not None:
        if in_inference():
            return tuple(native_ops().hc_mixes(mixes, scale, base, hc, iters, eps))
        return _native_hc_mixes(hc, iters, eps)(mixes, scale, base)
    return twins.hc_mixes(mixes, scale, base, hc, iters, eps, sinkhorn_fn=dispatch.backend.sinkhorn)


def hc_site(
    x: mx.array, mixes: mx.array, scale: mx.array, base: mx.array, hc: int, iters: int, eps: float
) -> tuple[mx.array, mx.array, mx.array]:
    """An mHC site after its projection (``twins.hc_site`` says how): the streams x [T, hc, D]
    collapsed into the block input [T, D], post and comb. One Metal launch on the GPU
    (``metal/hc_site.metal``); ``hc_mixes`` and the collapse else."""
    if metal_kernels():
        if in_inference():
            return metal_fused.hc_site_kernel(x, mixes, scale, base, hc, iters, eps)
        return metal_fused.hc_site(x, mixes, scale, base, hc, iters, eps)
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
    if not (in_inference() and metal_kernels()):
        return None
    mixes = linear(x if x.ndim == 2 else x.reshape(x.shape[0], -1), fn)
    return metal_fused.hc_site_norm(
        x, mixes, scale, base, weight, hc, iters, eps, norm_eps, out_eps
    )


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
    if not (in_inference() and metal_kernels()):
        return None
    hc = fn.shape[0]
    mixes = linear(x if x.ndim == 2 else x.reshape(x.shape[0], -1), fn, rows)
    return metal_fused.hc_site_norm(
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
    if native_cpu_ops() is None:
        return None
    # A frozen matrix's [in, out] memory as stored (else a transposed view, read as a copy).
    if in_inference():
        return tuple(
            native_ops().hc_pre(
                x, transposed(fn), scale, base, hc, iters, eps, norm_eps, row_count(rows)
            )
        )
    return _native_hc_pre(hc, iters, eps, norm_eps)(x, transposed(fn), scale, base)


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
    if metal_kernels():
        if in_inference():
            return metal_fused.hc_expand_kernel(out, residual, post, comb, flat)
        return metal_fused.hc_expand(out, residual, post, comb)
    if native_cpu_ops() is None or residual.dtype != mx.float32:
        return twins.hc_expand(out, residual, post, comb)
    if in_inference():
        return native_ops().hc_expand(out, residual, post, comb, row_count(rows))
    return _native_hc_expand()(out, residual, post, comb)


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
