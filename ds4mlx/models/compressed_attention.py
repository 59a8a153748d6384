"""DeepSeek-V4's compressed attention (CSA and HCA): the compressor that pools each block of
positions into one row, the lightning indexer that picks the blocks a query attends (CSA), the
layer cache that holds them beside the sliding window's raw keys, and the attention of queries
over the window and the compressed rows they see.

Follows llama.cpp (commit 0c1e570) ``build_*_compressed_kv`` and its DSV4 KV cache; see
``models.deepseek4`` for the layer around it and where llama.cpp's semantics are the contract.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ds4mlx.kernels import grow_scored_rows, indexer_top_k, pool_blocks, sparse_attention
from ds4mlx.models.attention import sink_attention, sliding_window_mask
from ds4mlx.models.base import DECODE_TILE, SCORE_BUDGET
from ds4mlx.models.cache import keep_rows
from ds4mlx.models.rope import RoPE, RopeAngles
from ds4mlx.models.weights import Weights

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# The compress ratios a layer may have besides 0: CSA (overlapping blocks, with a lightning
# indexer) and HCA (every completed block).
CSA_RATIO = 4
HCA_RATIO = 128
#: Chunks up to this many rows (decode tiles, verify passes) attend CSA blocks sparsely; longer
#: prefill chunks use one mask over all blocks, which batches better.
SPARSE_ATTENTION_ROWS = DECODE_TILE


def compressor_shapes(
    prefix: str, *, hidden: int, dim: int, ratio: int
) -> dict[str, tuple[int, ...]]:
    """The tensors of a compressor of ``hidden``-wide input into ``dim``-wide rows."""
    width = (2 if ratio == CSA_RATIO else 1) * dim  # CSA rows overlap two blocks
    return {
        f"{prefix}_kv.weight": (width, hidden),
        f"{prefix}_gate.weight": (width, hidden),
        f"{prefix}_ape.weight": (ratio, width),
        f"{prefix}_norm.weight": (dim,),
    }


@dataclass(frozen=True)
class PendingRows:
    """Compressor rows (kv and gate scores, [n, width]) of positions ``start ..``: the rows not
    yet consumed by a completed block, plus the compressor's last ``slack`` rows so that a
    rejected speculative suffix can be cut off (``truncate``) without recomputing anything."""

    start: int
    kv: mx.array
    score: mx.array

    def truncate(self, pos: int) -> PendingRows:
        return PendingRows(self.start, self.kv[: pos - self.start], self.score[: pos - self.start])


class Compressor(nn.Module):
    """Pools each block of ``ratio`` positions into one row (llama.cpp ``build_*_compressed_kv``).

    Every position contributes a kv row and a gate-score row (``wgate x + ape[pos % ratio]``);
    a block's row is the per-channel softmax(score)-weighted sum of its rows, RMS-normed and
    RoPE'd at the block's first position. With ``overlap`` (CSA) rows are twice as wide: the first
    half feeds the next block, the second half the block itself. ``slack``: how many rows it
    keeps beyond those the next chunk needs (``PendingRows``).
    """

    def __init__(
        self,
        w: Weights,
        prefix: str,
        *,
        dim: int,
        ratio: int,
        rope: RoPE,
        eps: float,
        slack: int,
    ):
        super().__init__()
        self.overlap = ratio == CSA_RATIO
        self.wkv = w.matrix(f"{prefix}_kv.weight")
        self.wgate = w.matrix(f"{prefix}_gate.weight")
        self.ape = w.param(f"{prefix}_ape.weight")
        # ``ape`` copied to the host on the first ``on_host`` use (inference, whose weights
        # never change): read from the device at every step it was a host read per compressor.
        self._host_ape: np.ndarray | None = None
        self.norm = w.param(f"{prefix}_norm.weight")
        self.dim = dim
        self.ratio = ratio
        self.rope = rope
        self.eps = eps
        self.slack = slack

    def pending_start(self, pos: int) -> int:
        """First position whose rows must be kept once ``pos`` positions have been seen."""
        block = pos // self.ratio - (1 if self.overlap else 0)
        return max(0, block * self.ratio)

    def position_embedding(self, positions: np.ndarray, on_host: bool = False) -> mx.array:
        """``ape[p % ratio]`` for each position [T, width]; ``on_host`` gathers it on the host
        from the tiny table (an input of a decode tile, inference only, rather than three
        primitives in it), else MLX gathers it (differentiable)."""
        phase = np.asarray(positions) % self.ratio
        if not on_host:
            return self.ape[mx.array(phase)]
        if self._host_ape is None:
            self._host_ape = np.array(self.ape)
        return mx.array(self._host_ape[phase])

    def pool(
        self,
        kv: mx.array,
        gate: mx.array,
        embedding: mx.array,
        pos0: int,
        pending: PendingRows | None,
        take: int,
    ) -> tuple[mx.array | None, PendingRows]:
        """Pools the blocks that the first ``take`` of the rows of positions pos0 .. complete,
        from their products ``wkv x`` and ``wgate x`` and their ``position_embedding`` (a row's
        gate score is its gate product plus its embedding, summed where the rows join the kept
        ones: ``kernels.grow_scored_rows``): (the pooled rows, or None when no block completes;
        the rows kept). ``take``: all the rows of a chunk, a decode tile's real ones."""
        r, dim, end = self.ratio, self.dim, pos0 + take
        start = pos0 if pending is None else pending.start  # position of the first row
        keep_from = max(start, self.pending_start(max(0, end - self.slack)))
        b0, b1 = pos0 // r, end // r  # blocks completed in this chunk: [b0, b1)
        # The rows read from here on: those kept, and those of the blocks completed now (each
        # with the block before it, CSA).
        read_from = keep_from if b1 == b0 else max(start, min(keep_from, (b0 - self.overlap) * r))
        cached = (kv[:0], gate[:0]) if pending is None else (pending.kv, pending.score)
        kv, score = grow_scored_rows(cached, kv, gate, embedding, take, end - read_from)
        start, skip = read_from, keep_from - read_from
        kept = PendingRows(keep_from, kv[skip:] if skip else kv, score[skip:] if skip else score)
        if b1 == b0:
            return None, kept
        n = b1 - b0
        lo = b0 * r - start
        # One native primitive in a decode tile on the CPU, else the MLX ops (its twin).
        pooled = pool_blocks(kv, score, lo, n, r, dim, self.overlap)
        if pooled is None:
            pooled = self._pooled(kv, score, lo, n, b0)
        angles = self.rope.angles(np.arange(b0, b1) * r)
        offset = dim - self.rope.n_dims
        return self.rope.apply_normed(pooled, self.norm, self.eps, angles, offset=offset), kept

    def _pooled(self, kv: mx.array, score: mx.array, lo: int, n: int, b0: int) -> mx.array:
        """The softmax pooling of the ``n`` blocks whose rows start at row ``lo`` of kv and
        score (block b0 first): [n, dim]."""
        r, dim = self.ratio, self.dim
        hi = lo + n * r
        if self.overlap:
            prev_kv, prev_score = kv[lo - r : hi - r, :dim], score[lo - r : hi - r, :dim]
            if b0 == 0:
                # Block 0 has no previous block: pool against a zero row with a -inf gate.
                prev_kv = mx.concatenate([mx.zeros((r, dim)), kv[: hi - r, :dim]])
                prev_score = mx.concatenate([mx.full((r, dim), -mx.inf), score[: hi - r, :dim]])
            values = mx.concatenate(
                [prev_kv.reshape(n, r, dim), kv[lo:hi, dim:].reshape(n, r, dim)], axis=1
            )
            scores = mx.concatenate(
                [prev_score.reshape(n, r, dim), score[lo:hi, dim:].reshape(n, r, dim)], axis=1
            )
        else:
            values = kv[lo:hi].reshape(n, r, dim)
            scores = score[lo:hi].reshape(n, r, dim)
        return mx.sum(values * mx.softmax(scores, axis=1, precise=True), axis=1)


class LightningIndexer(nn.Module):
    """Scores compressed blocks per query and keeps the top-k (CSA layers)."""

    def __init__(
        self,
        w: Weights,
        prefix: str,
        *,
        heads: int,
        dim: int,
        top_k: int,
        rope: RoPE,
        eps: float,
        slack: int,
    ):
        """The indexer of block ``prefix`` (``blk.N``): ``heads`` query heads of width ``dim``
        scoring the blocks of its own compressor, of which each query keeps ``top_k``."""
        super().__init__()
        self.q_b = w.matrix(f"{prefix}.indexer.attn_q_b.weight")
        self.proj = w.matrix(f"{prefix}.indexer.proj.weight")
        self.compressor = Compressor(
            w,
            f"{prefix}.indexer_compressor",
            dim=dim,
            ratio=CSA_RATIO,
            rope=rope,
            eps=eps,
            slack=slack,
        )
        self.heads, self.dim, self.top_k = heads, dim, top_k
        self.rope = rope
        # Scales the head weights where they meet the scores (``top_blocks``,
        # ``kernels.indexer_top_k``: inside the scores' launch on the GPU).
        self.weight_scale = 1.0 / math.sqrt(dim * heads)

    def from_products(
        self, q: mx.array, weights: mx.array, angles: RopeAngles
    ) -> tuple[mx.array, mx.array]:
        """Indexer queries [T, heads, dim] and head weights [T, heads] (not yet times
        ``weight_scale``) from the products ``q_b qr`` and ``proj x`` (``Attention._project``
        makes them with its own)."""
        q = q.reshape(q.shape[0], self.heads, self.dim)
        q = self.rope.apply(q, angles, offset=self.dim - self.rope.n_dims)
        return q, weights

    def select(self, q: mx.array, weights: mx.array, keys: mx.array, visible: mx.array) -> mx.array:
        """Which visible blocks each query attends: bool [T, N] (at most top_k per row)."""
        if keys.shape[0] <= self.top_k:
            return visible
        top = self.top_blocks(q, weights, keys, visible)
        # A selection has no gradient; stop_gradient says so to MLX, which cannot differentiate
        # a scatter with respect to its indices.
        chosen = mx.put_along_axis(
            mx.zeros(visible.shape, mx.bool_), mx.maximum(top, 0), mx.array(True), axis=-1
        )
        return chosen & visible

    def top_blocks(
        self, q: mx.array, weights: mx.array, keys: mx.array, visible: mx.array
    ) -> mx.array:
        """The top_k visible blocks of each query, int32 [T, top_k] in no particular order;
        -1 fills the slots of a row that sees fewer blocks. Needs N > top_k keys."""
        scores = mx.maximum(mx.matmul(q, keys.T), 0.0)  # [T, heads, N]
        scores = mx.sum(scores * (weights * self.weight_scale)[..., None], axis=1)
        scores = mx.where(visible, scores, -mx.inf)
        top = mx.argpartition(-scores, self.top_k - 1, axis=-1)[:, : self.top_k]
        top = mx.where(mx.take_along_axis(visible, top, axis=-1), top.astype(mx.int32), -1)
        return mx.stop_gradient(top)


@dataclass(frozen=True)
class LayerCache:
    """One layer's cache. ``window``: the last raw keys; ``comp``/``index``: compressed attention
    keys and lightning-indexer keys of every completed block, with their compressors' rows."""

    window: mx.array | None = None
    comp: mx.array | None = None
    comp_pending: PendingRows | None = None
    index: mx.array | None = None
    index_pending: PendingRows | None = None

    def truncate(self, old_pos: int, pos: int, ratio: int) -> LayerCache:
        """This cache as it was after position ``pos`` (``old_pos - pos`` at most the model's
        ``deepseek4.ROLLBACK_DEPTH``)."""
        cut = old_pos - pos
        blocks = pos // ratio if ratio else 0

        def pending(rows: PendingRows | None) -> PendingRows | None:
            return None if rows is None else rows.truncate(pos)

        return LayerCache(
            window=None if self.window is None else self.window[: self.window.shape[0] - cut],
            comp=None if self.comp is None else keep_rows(self.comp, blocks),
            comp_pending=pending(self.comp_pending),
            index=None if self.index is None else keep_rows(self.index, blocks),
            index_pending=pending(self.index_pending),
        )


class CompressedAttention(nn.Module):
    """The attention proper of a DeepSeek-V4 layer: queries over the raw keys of a sliding
    window and the compressed rows they see (every visible block, or the indexer's top-k).
    ``deepseek4.Attention`` adds the projections and the cache update, and sets the
    attributes annotated here."""

    window: int  # sliding window, in positions
    ratio: int  # compress ratio: 0, CSA_RATIO or HCA_RATIO
    heads: int
    head_dim: int
    scale: float
    sinks: mx.array
    indexer: LightningIndexer | None

    def _attend_tile(
        self,
        q: mx.array,
        positions: np.ndarray,
        window: mx.array,
        cache: LayerCache,
        index_q: mx.array | None,
        index_w: mx.array | None,
        n_real: int,
    ) -> mx.array:
        """A decode tile's attention in one call: each of the first ``n_real`` rows over exactly
        the keys its position sees (its window rows, its visible or indexer-selected compressed
        rows), padding rows over none (zeros out). ``kernels.sparse_attention`` reads each
        row's keys on their own, so a row's result does not depend on the other rows: a verify
        row equals decoding its token alone, bit for bit."""
        tokens = q.shape[0]
        real = np.arange(tokens) < n_real
        window_start = int(positions[n_real - 1]) + 1 - window.shape[0]  # holds real rows only
        hi = positions + 1 - window_start
        ranges = np.where(real[:, None], np.stack([np.maximum(hi - self.window, 0), hi], 1), 0)
        comp, index = self._tile_blocks(positions, real, cache, index_q, index_w)
        return sparse_attention(
            q, window, mx.array(ranges.astype(np.int32)), comp, index, self.sinks, self.scale
        )

    def _tile_blocks(
        self,
        positions: np.ndarray,
        real: np.ndarray,
        cache: LayerCache,
        index_q: mx.array | None,
        index_w: mx.array | None,
    ) -> tuple[mx.array, mx.array]:
        """The compressed rows and, per tile row, the ones it attends (int32 [T, K], -1 for an
        unused slot): every visible block, or the indexer's top-k where a row sees more."""
        n_comp = 0 if cache.comp is None else cache.comp.shape[0]
        n_vis = np.where(real, np.minimum((positions + 1) // max(self.ratio, 1), n_comp), 0)
        if not n_vis.any():
            return _no_blocks(self.head_dim, len(positions))
        top_k = self.indexer.top_k if self.indexer is not None else 0
        if not top_k or n_vis.max() <= top_k:
            slots = np.arange(n_vis.max())
            return cache.comp, mx.array(
                np.where(slots < n_vis[:, None], slots, -1).astype(np.int32)
            )
        # The indexer's choice for each row over exactly that row's blocks, as a one-row
        # decode makes it (one primitive for the tile on the CPU).
        visible = mx.array(n_vis.astype(np.int32))
        return cache.comp, indexer_top_k(
            index_q, index_w, cache.index, visible, top_k, self.indexer.weight_scale
        )

    def _attend(
        self,
        q: mx.array,
        positions: np.ndarray,
        window: mx.array,
        cache: LayerCache,
        index_q: mx.array | None,
        index_w: mx.array | None,
    ) -> mx.array:
        """Sink attention of q [T, H, hd] over the raw window plus the visible compressed rows.

        ``window`` holds the raw keys of the positions just before and including the queries';
        ``cache`` the compressed rows of every block completed so far.
        """
        tokens = q.shape[0]
        window_start = int(positions[-1]) + 1 - window.shape[0]
        n_comp = 0 if cache.comp is None else cache.comp.shape[0]
        n_vis = (int(positions[-1]) + 1) // self.ratio if n_comp else 0
        if (
            self.indexer is not None
            and tokens <= SPARSE_ATTENTION_ROWS
            and n_vis > self.indexer.top_k
        ):
            # Few rows of a CSA layer whose indexer keeps fewer blocks than are visible: each
            # row reads its window and its top-k rows in place, as a decode tile does.
            return self._attend_tile(q, positions, window, cache, index_q, index_w, tokens)
        # Query blocks bound the [heads, rows, keys] score memory of long prefills.
        n_keys = min(window.shape[0], tokens + self.window) + n_comp
        per_row = n_keys * (self.heads + (self.indexer.heads if self.indexer else 0))
        step = max(1, SCORE_BUDGET // per_row)
        outs = []
        for t0 in range(0, tokens, step):
            q_pos = positions[t0 : t0 + step]
            k0 = max(0, int(q_pos[0]) - self.window + 1 - window_start)
            k1 = int(q_pos[-1]) + 1 - window_start
            keys = window[k0:k1]
            mask = mx.array(
                sliding_window_mask(q_pos, np.arange(k0, k1) + window_start, self.window)
            )
            n_vis = (int(q_pos[-1]) + 1) // self.ratio if n_comp else 0
            if n_vis:
                visible = self._visible_blocks(q_pos, n_vis)
                if self.indexer is not None:
                    t1 = t0 + len(q_pos)
                    visible = self.indexer.select(
                        index_q[t0:t1], index_w[t0:t1], cache.index[:n_vis], visible
                    )
                keys = mx.concatenate([keys, cache.comp[:n_vis]])
                mask = mx.concatenate([mask, visible], axis=1)
            outs.append(sink_attention(q[t0 : t0 + step], keys, mask, self.sinks, self.scale))
        return outs[0] if len(outs) == 1 else mx.concatenate(outs)

    def _visible_blocks(self, positions: np.ndarray, n_blocks: int) -> mx.array:
        """bool [T, n_blocks]: a block is visible to the query that completes it and to all
        later ones."""
        return mx.array(np.arange(n_blocks) < ((positions + 1) // self.ratio)[:, None])


@functools.cache
def _no_blocks(dim: int, tokens: int) -> tuple[mx.array, mx.array]:
    """No compressed rows [0, dim] and no slots [tokens, 0]: constants made from host arrays,
    not primitives on every call."""
    return mx.array(np.zeros((0, dim), np.float32)), mx.array(np.zeros((tokens, 0), np.int32))
