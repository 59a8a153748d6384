"""How a DeepSeek-V4 block's decode tile runs compiled (``models.deepseek4.Block.tile``).

The attention proper (the caches' update and the sparse attention) depends on the caches'
shapes, which grow, so a tile runs as compiled parts around it: everything before it (mHC, norm,
projections) and everything after it (output projection, mHC, FFN). Over streamed experts the
part after it is cut again at the host's one read of the routing. The same operations as the
uncompiled tile, so the same bits. Kept beside the architecture file, which holds the math.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ds4mlx.experts import ExpertBatch
from ds4mlx.kernels import hc_expand, inference
from ds4mlx.kernels.weights import weight_of_tree, weight_tree
from ds4mlx.models.compressed_attention import CompressedAttention, LayerCache
from ds4mlx.models.mhc import HyperConnection
from ds4mlx.models.moe import SharedExpertMoE, gathered_outputs
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.rope import RopeAngles
from ds4mlx.models.tiles import CompiledTiles

import mlx.core as mx
import numpy as np


@dataclass
class ProjectedRows:
    """What attention computes from its input rows alone, before any cache is involved."""

    angles: RopeAngles
    q: mx.array | None  # [T, H, hd]
    kv: mx.array  # [T, hd]
    # The compressors' rows (``Compressor.pool``'s first three arguments): kv and gate
    # products and the position embedding, attention's then the indexer's.
    comp: tuple[mx.array, mx.array, mx.array] | None = None
    index: tuple[mx.array, mx.array, mx.array] | None = None
    index_q: mx.array | None = None
    index_w: mx.array | None = None

    def flat(self) -> list[mx.array]:
        """The arrays, in a fixed order (a compiled tile's outputs); ``from_flat`` inverts."""
        rows = [a for three in (self.comp, self.index) if three is not None for a in three]
        rest = [a for a in (self.index_q, self.index_w) if a is not None]
        return [self.q, self.kv, *rows, *rest]

    @classmethod
    def from_flat(
        cls, angles: RopeAngles, arrays: Sequence[mx.array], compressed: bool, indexed: bool
    ) -> ProjectedRows:
        q, kv, *rest = arrays
        rows = cls(angles, q, kv)
        if compressed:
            rows.comp, rest = (rest[0], rest[1], rest[2]), rest[3:]
        if indexed:
            rows.index = (rest[0], rest[1], rest[2])
            rows.index_q, rows.index_w = rest[3], rest[4]
        return rows

    def row(self, r: int) -> ProjectedRows:
        def take(three: tuple[mx.array, ...] | None) -> tuple[mx.array, ...] | None:
            return None if three is None else tuple(a[r : r + 1] for a in three)

        at = slice(r, r + 1)
        return ProjectedRows(
            self.angles.row(r),
            self.q[at],
            self.kv[at],
            take(self.comp),
            take(self.index),
            None if self.index_q is None else self.index_q[at],
            None if self.index_w is None else self.index_w[at],
        )


class CompiledBlockTiles:
    """The compiled parts of a block's decode tile; ``Block`` inherits them and calls
    ``_compile_tiles`` once its pieces exist."""

    hc_attn: HyperConnection
    hc_ffn: HyperConnection
    attn_norm: RMSNorm
    ffn_norm: RMSNorm
    attn: CompressedAttention  # ``deepseek4.Attention``
    moe: SharedExpertMoE
    # and ``_tile_ffn(x, tokens, n_real)``: the FFN half of a tile (``Block``'s)

    def _compile_tiles(self) -> None:
        self._before_attention = CompiledTiles(self._tile_before_attention)
        self._after_attention = CompiledTiles(self._tile_after_attention)
        self._to_routing = CompiledTiles(self._tile_to_routing)
        self._after_routing = CompiledTiles(self._tile_after_routing)

    def _compiled_tile(
        self, x: mx.array, tokens: mx.array, pos0: int, cache: LayerCache, n_real: int
    ) -> tuple[mx.array, LayerCache]:
        """``tile`` as three calls: everything before the attention proper (mHC, norm,
        projections) compiled, the cache update and the sparse attention, which depend on the
        caches' shapes, as they are, and everything after (output projection, mHC, FFN)
        compiled. The same operations as the uncompiled tile, so the same bits."""
        out, before, new_cache = self._attend_compiled(x, pos0, cache, n_real)
        x = self._after_attention.get(n_real)(tokens, out, x, *before)
        return x, new_cache

    def _attend_compiled(
        self, x: mx.array, pos0: int, cache: LayerCache, n_real: int
    ) -> tuple[mx.array, list[mx.array], LayerCache]:
        """A tile's part up to the attention's result: that result, what the parts after it
        take besides (mHC's post and comb, the rope's cos and sin) and the new cache."""
        attn = self.attn
        positions = np.arange(pos0, pos0 + x.shape[0])
        angles = attn.rope.angles(positions)
        cos, sin = angles.on_device
        before = self._before_attention.get(n_real)(
            x, cos, sin, *attn.position_embeddings(positions, True)
        )
        rows = ProjectedRows.from_flat(
            angles, before[2:], attn.compressor is not None, attn.indexer is not None
        )
        window, new_cache = attn._extend_tile(cache, rows, pos0, n_real)
        out = attn._attend_tile(
            rows.q, positions, window, new_cache, rows.index_q, rows.index_w, n_real
        )
        return out, [before[0], before[1], cos, sin], new_cache

    def _streamed_tile(
        self, x: mx.array, tokens: mx.array, pos0: int, cache: LayerCache, n_real: int
    ) -> tuple[mx.array, LayerCache]:
        """``_compiled_tile`` over streamed experts: after the attention, one compiled part up
        to the routing, the host's one read of the expert ids (the store finds or reads their
        slots), and one compiled part over the slab from the expert launches to the mHC
        expansion. The same operations as the uncompiled tile, so the same bits. A routing
        that needs more experts than the slab holds at once runs in batches, uncompiled."""
        out, before, new_cache = self._attend_compiled(x, pos0, cache, n_real)
        x, post, comb, h, indices, weights, gate, up = self._to_routing.get(n_real)(
            tokens, out, x, *before
        )
        moe = self.moe
        k = indices.shape[1]

        def finish(batch: ExpertBatch) -> mx.array:
            if batch.pairs is not None:
                return moe.experts._batch_outputs(h[:n_real], batch, k, True)
            trees = [weight_tree(w) for w in (batch.gate, batch.up, batch.down)]
            out = self._after_routing.get(n_real)(
                x, post, comb, h, weights, gate, up, batch.indices, trees
            )
            # Queued now, the expert launches run while the host builds the next layer's
            # parts and does its bookkeeping for that layer's routing, instead of from when
            # the host reads it. Measured on ds4-tiny, CPU, 48 decoded tokens, 10 interleaved
            # rounds under load 16-18 on 2 cores: 85 / 102 / 124 t/s against 78 / 95 / 122
            # (f32 / native / f32 weights) for reading the routing with this layer's work
            # unqueued; paired median 1.06x. (Reading every layer's ids once per step is not
            # possible: a layer's routing depends on the previous layer's output.)
            mx.async_eval(out)
            return out

        results = list(moe.experts.layer.map_batches(indices, finish))
        if results[0][0].pairs is None:
            return results[0][1], new_cache
        outputs = gathered_outputs(results, n_real, k)
        with inference():
            ffn = moe.tile_with_outputs(h, weights, gate, up, outputs)
            return hc_expand(ffn, x, post, comb, flat=True, rows=n_real), new_cache

    def _tile_before_attention(
        self, x: mx.array, cos: mx.array, sin: mx.array, *embeddings: mx.array, n_real: int
    ) -> list[mx.array]:
        h, post, comb = self.hc_attn(x, self.attn_norm, n_real)
        rows = self.attn._project(h, RopeAngles(cos, sin), embeddings, n_real)
        return [post, comb, *rows.flat()]

    def _tile_after_attention(self, tokens: mx.array, *attended: mx.array, n_real: int) -> mx.array:
        """``_attention_done`` of ``attended``, then the FFN: the streams after the block."""
        return self._tile_ffn(self._attention_done(*attended, n_real=n_real), tokens, n_real)

    def _attention_done(
        self,
        out: mx.array,
        x: mx.array,
        post: mx.array,
        comb: mx.array,
        cos: mx.array,
        sin: mx.array,
        n_real: int,
    ) -> mx.array:
        """The streams after the attention's output projection and mHC expansion."""
        out = self.attn.output(out, RopeAngles(cos, sin), n_real)
        return hc_expand(out, x, post, comb, flat=True, rows=n_real)

    def _tile_to_routing(
        self, tokens: mx.array, *attended: mx.array, n_real: int
    ) -> list[mx.array]:
        """``_tile_after_attention`` up to the MoE's routing: the streams, the FFN site's post
        and comb, its input h, and ``SharedExpertMoE.tile_routing``'s results."""
        x = self._attention_done(*attended, n_real=n_real)
        h, post, comb = self.hc_ffn(x, self.ffn_norm, n_real)
        return [x, post, comb, h, *self.moe.tile_routing(h, tokens, n_real)]

    def _tile_after_routing(
        self,
        x: mx.array,
        post: mx.array,
        comb: mx.array,
        h: mx.array,
        weights: mx.array,
        gate: mx.array,
        up: mx.array,
        indices: mx.array,
        trees: list[dict[str, Any]],
        n_real: int,
    ) -> mx.array:
        """The rest of a streamed tile over the store's one batch (its ``indices`` into the
        weights ``trees``, ``kernels.weight_tree``): the streams after the block."""
        batch = ExpertBatch(*(weight_of_tree(t) for t in trees), indices)
        ffn = self.moe.tile_with_batch(h, weights, gate, up, batch, n_real)
        return hc_expand(ffn, x, post, comb, flat=True, rows=n_real)
