"""Manifold-constrained hyper-connections (mHC): ``hc`` residual streams mixed around each block.

Per token the streams ``x`` [hc, D] are RMS-normed as one flat vector and projected to
``(2 + hc) * hc`` mixes: ``pre`` weights collapse the streams into the block input, ``post`` weights
spread the block output back over the streams, and ``comb`` (made doubly stochastic by Sinkhorn)
mixes the residual streams. On the CPU a whole site is one native primitive (``kernels.hc_pre``)
and so is the expansion (``kernels.hc_expand``); on the GPU the site after its projection is one
Metal launch (``kernels.hc_site``) and so is the expansion; elsewhere the MLX twins run.
Layouts follow llama.cpp: ``comb`` is [T, src, dst].
"""

from __future__ import annotations

from ds4mlx import kernels
from ds4mlx.kernels import Weight, linear
from ds4mlx.models.norms import RMSNorm, rms_norm
from ds4mlx.models.weights import Weights

import mlx.core as mx
import mlx.nn as nn


def hc_collapse(x: mx.array, weights: mx.array) -> mx.array:
    """Weighted sum of the streams: x [T, hc, D], weights [T, hc] -> [T, D]. As a batched
    [1, hc] x [hc, D] product it is three primitives (a multiply and a sum were five)."""
    return (weights[:, None, :] @ x)[:, 0]


def hc_mean(x: mx.array) -> mx.array:
    """The mean of the streams [T, hc, D] -> [T, D] (what drafters tap)."""
    return mx.mean(x, axis=1)


class HyperConnection(nn.Module):
    """The mixes of one mHC site (before attention or before the FFN)."""

    def __init__(
        self,
        fn: Weight,
        base: mx.array,
        scale: mx.array,
        *,
        hc: int,
        sinkhorn_iters: int,
        hc_eps: float,
        norm_eps: float,
    ):
        super().__init__()
        self.fn = fn  # [(2 + hc) * hc, hc * D]
        self.base = base  # [(2 + hc) * hc]
        self.scale = scale  # [3]: pre, post, comb
        self.hc = hc
        self.sinkhorn_iters = sinkhorn_iters
        self.hc_eps = hc_eps
        self.norm_eps = norm_eps

    def __call__(
        self, x: mx.array, norm: RMSNorm | None = None, rows: int | None = None
    ) -> tuple[mx.array, mx.array, mx.array]:
        """x [T, hc, D] (with ``norm``, also as ``hc_expand(flat=True)`` leaves it) -> the
        block's input (the streams collapsed by pre, then ``norm``ed when given: the block's
        input norm) [T, D], post [T, hc], comb [T, hc(src), hc(dst)]. In
        inference on the GPU with a ``norm``, the projection of the raw streams and one Metal
        launch (``kernels.hc_site_norm``: both norms carried in); else ``_site``, then the norm.
        ``rows``: a decode tile's real rows (the others unspecified)."""
        if norm is not None:
            fused = kernels.hc_site_norm(
                x,
                self.fn,
                self.scale,
                self.base,
                norm.weight,
                self.hc,
                self.sinkhorn_iters,
                self.hc_eps,
                self.norm_eps,
                norm.eps,
            )
            if fused is not None:
                return fused
        h, post, comb = self._site(x, rows)
        return (h if norm is None else norm(h)), post, comb

    def _site(self, x: mx.array, rows: int | None) -> tuple[mx.array, mx.array, mx.array]:
        """The site without the block's input norm: one native primitive on the CPU
        (``kernels.hc_pre``); the composition below elsewhere and for other weight kinds."""
        fused = kernels.hc_pre(
            x,
            self.fn,
            self.scale,
            self.base,
            self.hc,
            self.sinkhorn_iters,
            self.hc_eps,
            self.norm_eps,
            rows,
        )
        if fused is not None:
            return fused
        flat = rms_norm(x.reshape(x.shape[0], -1), None, self.norm_eps)
        return kernels.hc_site(
            x,
            linear(flat, self.fn),
            self.scale,
            self.base,
            self.hc,
            self.sinkhorn_iters,
            self.hc_eps,
        )


BLOCK_SITES = ("attn", "ffn")


def block_site_shapes(prefix: str, hc: int, hidden: int) -> dict[str, tuple[int, ...]]:
    """The tensors of a block's two sites, ``{prefix}.hc_{attn,ffn}_{fn,base,scale}.weight``."""
    mix = (2 + hc) * hc
    shapes: dict[str, tuple[int, ...]] = {}
    for site in BLOCK_SITES:
        shapes |= {
            f"{prefix}.hc_{site}_fn.weight": (mix, hc * hidden),
            f"{prefix}.hc_{site}_base.weight": (mix,),
            f"{prefix}.hc_{site}_scale.weight": (3,),
        }
    return shapes


def load_block_sites(
    w: Weights, prefix: str, *, hc: int, sinkhorn_iters: int, hc_eps: float, norm_eps: float
) -> tuple[HyperConnection, HyperConnection]:
    """The sites before the token mixer and before the FFN of block ``prefix`` (``blk.{i}``)."""
    attn, ffn = (
        HyperConnection(
            w.matrix(f"{prefix}.hc_{site}_fn.weight"),
            w.param(f"{prefix}.hc_{site}_base.weight"),
            w.param(f"{prefix}.hc_{site}_scale.weight"),
            hc=hc,
            sinkhorn_iters=sinkhorn_iters,
            hc_eps=hc_eps,
            norm_eps=norm_eps,
        )
        for site in BLOCK_SITES
    )
    return attn, ffn


class HyperHead(nn.Module):
    """The final collapse of the streams before the output norm (llama.cpp ``build_hc_head``)."""

    def __init__(
        self, fn: Weight, base: mx.array, scale: mx.array, *, hc_eps: float, norm_eps: float
    ):
        super().__init__()
        self.fn = fn  # [hc, hc * D]
        self.base = base  # [hc]
        self.scale = scale  # [1]
        self.hc_eps = hc_eps
        self.norm_eps = norm_eps

    def __call__(
        self, x: mx.array, rows: int | None = None, norm: RMSNorm | None = None
    ) -> mx.array:
        """The streams x [T, hc, D] (or flat [T, hc * D], as a block's decode tile leaves them
        on the GPU) collapsed into [T, D], then ``norm``ed when given (the output norm): in
        inference on the GPU the raw streams' projection and one Metal launch
        (``kernels.hc_head_norm``: both norms inside); ``rows``: see ``kernels.linear``."""
        if norm is not None:
            fused = kernels.hc_head_norm(
                x,
                self.fn,
                self.scale,
                self.base,
                norm.weight,
                self.hc_eps,
                self.norm_eps,
                norm.eps,
                rows,
            )
            if fused is not None:
                return fused
            return norm(self(x, rows))
        streams = x if x.ndim == 3 else x.reshape(x.shape[0], self.fn.shape[0], -1)
        flat = rms_norm(streams.reshape(x.shape[0], -1), None, self.norm_eps)
        pre = mx.sigmoid(linear(flat, self.fn, rows) * self.scale + self.base) + self.hc_eps
        return hc_collapse(streams, pre)
