"""GLM-5.3-Flash's DSA indexer over k-pools (llama.cpp ``build_kpool_select``), with its cache
and the selection it hands the MLA layers.

Every position caches a LayerNorm'd key and a gate row; each complete pool of ``kpool``
positions (counted from position 0) is pooled by a per-channel softmax over ``gate + ape``. A
query scores the pools it has fully seen with ``sum_h relu(q_h . pooled) * w_h`` and attends the
positions of its top ``top_k / kpool`` pools (all of them when fewer are visible) plus, with
``kpool_select_tail``, its own incomplete pool up to itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ds4mlx.kernels import Weight, grow_rows, indexer_top_k, linear, linear_many, pool_blocks
from ds4mlx.models.base import SCORE_BUDGET
from ds4mlx.models.cache import append_rows, keep_rows
from ds4mlx.models.weights import Weights

import mlx.core as mx
import mlx.nn as nn
import numpy as np


@dataclass(frozen=True)
class IndexCache:
    """A full indexer's cache: pooled keys of every complete pool [pools, dim], and the key and
    gate rows [n, dim] of the positions ``start ..``: those of the incomplete pool, plus those of
    the pools completed within the last ``PoolIndexer.rollback`` positions, so that a rollback
    can reopen them."""

    pooled: mx.array | None = None
    start: int = 0
    keys: mx.array | None = None
    gates: mx.array | None = None

    def truncate(self, pos: int, kpool: int) -> IndexCache:
        """This cache as it was after ``pos`` positions."""
        return IndexCache(
            pooled=None if self.pooled is None else keep_rows(self.pooled, pos // kpool),
            start=self.start,
            keys=None if self.keys is None else self.keys[: pos - self.start],
            gates=None if self.gates is None else self.gates[: pos - self.start],
        )


@dataclass(frozen=True)
class Selection:
    """Which positions each query of a chunk attends (llama.cpp's ``indexer_sel``).

    ``positions`` [T] are the queries'; ``pools`` [T, P] bool marks the complete pools each one
    selected (only pools it has fully seen). Layers sharing an indexer reuse it as is.
    """

    positions: np.ndarray
    pools: mx.array
    kpool: int
    tail: bool

    def mask(self, t0: int, t1: int) -> mx.array:
        """bool [t1 - t0, positions[t1 - 1] + 1]: the keys of queries t0 .. t1 - 1."""
        q_pos = self.positions[t0:t1]
        n_keys = int(q_pos[-1]) + 1
        r = self.kpool
        pools = self.pools[t0:t1, : n_keys // r]
        mask = mx.repeat(pools, r, axis=1)
        if mask.shape[1] < n_keys:
            pad = mx.zeros((len(q_pos), n_keys - mask.shape[1]), dtype=mx.bool_)
            mask = mx.concatenate([mask, pad], axis=1)
        if self.tail:
            # The query's own incomplete pool, up to the query itself.
            keys, queries = np.arange(n_keys)[None, :], q_pos[:, None]
            own = (keys // r == (queries + 1) // r) & (keys <= queries)
            mask = mask | mx.array(own)
        return mask


@dataclass(frozen=True)
class TileSelection:
    """Which cached latents each row of a decode tile attends, as ``kernels.sparse_attention``
    reads them: ``window`` int32 [T, 2], a run of rows [lo, hi) (every position a row sees
    while it sees at most the top pools' worth of complete pools, else its own incomplete
    pool), and ``index`` int32 [T, K], the further rows of its chosen pools (-1: none). A row's
    choice depends on its own position and scores alone, as one-token decode makes it."""

    window: mx.array
    index: mx.array


@mx.compile
def _pool_rows(pools: mx.array, offsets: mx.array) -> mx.array:
    """The positions [T, K * kpool] of the pools [T, K] (-1: none) that a tile's rows chose,
    ``offsets`` = arange(kpool); compiled: one fused primitive where MLX ops take a dozen."""
    chosen = pools[:, :, None]
    rows = mx.where(chosen >= 0, chosen * offsets.shape[0] + offsets, -1)
    return rows.reshape(pools.shape[0], -1)


class PoolIndexer(nn.Module):
    """The DSA indexer over k-pools (llama.cpp ``build_kpool_select``)."""

    def __init__(
        self,
        w: Weights,
        prefix: str,
        *,
        heads: int,
        dim: int,
        kpool: int,
        top_k: int,
        select_tail: bool,
        eps: float,
        rollback: int,
    ):
        """The indexer of block ``prefix`` (``blk.N``): ``heads`` query heads of width ``dim``
        scoring pools of ``kpool`` positions, of which each query keeps ``top_k / kpool``
        (``select_tail``: and its own incomplete pool); ``eps``: the key norm's; ``rollback``:
        how many positions a state can be rolled back by (their rows stay cached)."""
        super().__init__()
        p = prefix
        self.q_b = w.matrix(f"{p}.indexer.attn_q_b.weight")
        self.wk = w.matrix(f"{p}.indexer.attn_k.weight")
        self.k_norm = w.param(f"{p}.indexer.k_norm.weight")
        self.k_norm_bias = w.param(f"{p}.indexer.k_norm.bias")
        self.proj = w.matrix(f"{p}.indexer.proj.weight")
        self.wgate = w.matrix(f"{p}.indexer_compressor_gate.weight")
        self.ape = w.param(f"{p}.indexer_compressor_ape.weight")  # [kpool, dim]
        self.heads, self.dim, self.kpool = heads, dim, kpool
        self.top_pools = top_k // kpool
        self.tail = select_tail
        self.norm_eps = eps
        self.rollback = rollback
        self._offsets = np.arange(kpool, dtype=np.int32)  # a position's place in its pool

    def pool(
        self, keys: mx.array, gates: mx.array, pos0: int, cache: IndexCache | None
    ) -> IndexCache:
        """Caches the key and gate rows of a chunk (its ``products``; positions pos0 ..),
        pooling the pools they complete."""
        return self._pool(keys, gates, pos0, cache, keys.shape[0], one_at_a_time=False)

    @property
    def input_weights(self) -> list[Weight]:
        """The matrices applied to the layer's input (``products``), for one fused product (a
        property: a list attribute would join the module's parameters a second time)."""
        return [self.wk, self.wgate, self.proj]

    def products(self, x: mx.array) -> list[mx.array]:
        """The products of the layer's input x [T, D] the indexer reads: its normed keys and
        gate rows [T, dim] and its head weights [T, heads]."""
        return self.finish_products(*linear_many(x, self.input_weights))

    def finish_products(self, keys: mx.array, gates: mx.array, weights: mx.array) -> list[mx.array]:
        """``products`` from the products of x with ``input_weights``."""
        keys = mx.fast.layer_norm(keys, self.k_norm, self.k_norm_bias, self.norm_eps)
        return [keys, gates, weights * (1.0 / math.sqrt(self.dim * self.heads))]

    def pool_tile(
        self,
        keys: mx.array,
        gates: mx.array,
        pos0: int,
        cache: IndexCache | None,
        n_real: int,
    ) -> IndexCache:
        """``pool`` of a decode tile's first ``n_real`` rows (their ``products``), one pool at
        a time, so that a pool's key does not depend on the chunk that completed it."""
        return self._pool(keys, gates, pos0, cache, n_real, one_at_a_time=True)

    def _pool(
        self,
        keys: mx.array,
        gates: mx.array,
        pos0: int,
        cache: IndexCache | None,
        real: int,
        one_at_a_time: bool,
    ) -> IndexCache:
        r = self.kpool
        end = pos0 + real
        first, last = pos0 // r, end // r  # the pools completed now: [first, last)
        start, pooled = pos0, None
        if cache is not None:
            start, pooled = cache.start, cache.pooled
        keep = max(start, max(0, end - self.rollback) // r * r)
        if cache is not None and one_at_a_time and keep <= first * r:
            # A decode tile: the rows it keeps hold every pool it completes, so its real rows
            # join the cached ones, and the rows before ``keep`` leave, in one primitive on the
            # CPU (bounded rows: the incomplete pool and the rollback's).
            keys, gates = grow_rows([cache.keys, cache.gates], [keys, gates], real, end - keep)
            start = keep
        else:
            keys, gates = keys[:real], gates[:real]
            if cache is not None:
                keys, gates = append_rows(cache.keys, keys), append_rows(cache.gates, gates)
        if last > first:
            new = self._pool_span(keys, gates, first * r - start, last - first, one_at_a_time)
            pooled = append_rows(pooled, new)
        if start < keep:
            keys, gates = keys[keep - start :], gates[keep - start :]
        return IndexCache(pooled=pooled, start=keep, keys=keys, gates=gates)

    def _pool_span(
        self, keys: mx.array, gates: mx.array, lo: int, n: int, one_at_a_time: bool
    ) -> mx.array:
        """The pooled keys [n, dim] of the n pools whose rows start at row ``lo`` of keys and
        gates: a per-channel softmax of gate + ape over each pool's positions. A decode tile's
        (``one_at_a_time``) in one native primitive on the CPU, one Metal launch on the GPU
        (``kernels.pool_blocks``), each pool on its own; else with MLX ops, a tile's pools one
        at a time, so that a pool's key does not depend on the chunk that completed it."""
        r, hi = self.kpool, lo + n * self.kpool
        rows, scores = keys[lo:hi], gates[lo:hi].reshape(n, r, self.dim) + self.ape
        if one_at_a_time:
            new = pool_blocks(rows, scores.reshape(n * r, self.dim), 0, n, r, self.dim, False)
            if new is not None:
                return new
        rows = rows.reshape(n, r, self.dim)
        spans = [(b, b + 1) for b in range(n)] if one_at_a_time else [(0, n)]
        outs = [
            mx.sum(rows[b0:b1] * mx.softmax(scores[b0:b1], axis=1, precise=True), axis=1)
            for b0, b1 in spans
        ]
        return outs[0] if len(outs) == 1 else mx.concatenate(outs)

    def select(
        self, weights: mx.array, qr: mx.array, positions: np.ndarray, pooled: mx.array | None
    ) -> Selection:
        """The top pools of each query of a chunk among those it has fully seen (``weights``:
        the head weights of its ``products``, qr: MLA's query input)."""
        n_pools = 0 if pooled is None else pooled.shape[0]
        visible = mx.array(np.arange(n_pools)[None, :] < ((positions + 1) // self.kpool)[:, None])
        chosen = visible
        if n_pools > self.top_pools:
            chosen = self._top_pools(self.queries(qr), weights, pooled, visible)
        return Selection(positions, chosen, self.kpool, self.tail)

    def select_tile(
        self,
        q: mx.array,
        weights: mx.array,
        positions: np.ndarray,
        pooled: mx.array | None,
        n_real: int,
    ) -> TileSelection:
        """``select`` of a decode tile from its ``queries`` and head weights: each of the first
        ``n_real`` rows is scored on its own over exactly the pools its position sees
        (``kernels.indexer_top_k``, one primitive for the tile), as one-token decode scores it;
        the padding rows select nothing. A row that sees at most the top pools attends every
        position up to itself as one window, and is not scored."""
        r = self.kpool
        window = np.zeros((len(positions), 2), np.int32)
        real = positions[:n_real].astype(np.int64)
        seen = (real + 1) // r  # complete pools
        scored = seen > self.top_pools
        window[:n_real, 0] = np.where(scored, seen * r, 0)
        window[:n_real, 1] = real + 1 if self.tail else seen * r
        if not scored.any():
            unused = np.full((len(positions), 1), -1, np.int32)
            return TileSelection(mx.array(window), mx.array(unused))
        visible = np.zeros(len(positions), np.int32)
        visible[:n_real] = np.where(scored, seen, 0)
        pools = indexer_top_k(q, weights, pooled, mx.array(visible), self.top_pools)
        return TileSelection(mx.array(window), _pool_rows(pools, mx.array(self._offsets)))

    def queries(self, qr: mx.array) -> mx.array:
        """Indexer queries [T, heads, dim] of MLA's query input qr."""
        return self.query_heads(linear(qr, self.q_b))

    def query_heads(self, q: mx.array) -> mx.array:
        """The product of qr with ``q_b`` as indexer queries [T, heads, dim]."""
        return q.reshape(q.shape[0], self.heads, self.dim)

    def _top_pools(
        self, q: mx.array, weights: mx.array, pooled: mx.array, visible: mx.array
    ) -> mx.array:
        if self.top_pools == 0:
            return mx.zeros(visible.shape, dtype=mx.bool_)
        tokens, n_pools = visible.shape
        step = max(1, SCORE_BUDGET // (self.heads * n_pools))
        chosen = []
        for t0 in range(0, tokens, step):
            t1 = t0 + step
            scores = mx.maximum(mx.matmul(q[t0:t1], pooled.T), 0.0)  # [t, heads, P]
            scores = mx.sum(scores * weights[t0:t1, :, None], axis=1)
            scores = mx.where(visible[t0:t1], scores, -mx.inf)
            # A selection has no gradient; stop_gradient says so to MLX, which cannot
            # differentiate a scatter with respect to its indices.
            top = mx.stop_gradient(
                mx.argpartition(-scores, self.top_pools - 1, axis=-1)[:, : self.top_pools]
            )
            picked = mx.put_along_axis(
                mx.zeros(scores.shape, dtype=mx.bool_), top, mx.array(True), axis=-1
            )
            chosen.append(picked & visible[t0:t1])
        return chosen[0] if len(chosen) == 1 else mx.concatenate(chosen)
