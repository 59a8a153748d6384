"""GLM-5.3-Flash's MLA layers: nope-only multi-head latent attention over the positions a DSA
k-pool indexer selects (llama.cpp ``build_dsa_layer``), and their cache.

``q = wq_b norm(wq_a x)``; the key/value is the normed latent ``norm(wkv_a x)`` (the only thing
cached); queries are absorbed through ``wk_b``, the attended latent is expanded through
``wv_b``; scale ``1/sqrt(key_length_mla)``. A layer without an indexer of its own attends the
selection of the last full indexer layer before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

from ds4mlx.kernels import grouped_linear, linear, linear_many, sparse_attention
from ds4mlx.models.base import SCORE_BUDGET
from ds4mlx.models.cache import append_rows, keep_rows
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.pool_indexer import IndexCache, PoolIndexer, Selection, TileSelection
from ds4mlx.models.weights import Weights

import mlx.core as mx
import mlx.nn as nn
import numpy as np

AnySelection = TypeVar("AnySelection", Selection, TileSelection)


@dataclass(frozen=True)
class MLACache:
    """An MLA layer's cache: the normed latent of every position [N, kv_lora_rank]."""

    latent: mx.array | None = None
    index: IndexCache | None = None

    def truncate(self, pos: int, kpool: int) -> MLACache:
        """This cache as it was after ``pos`` positions."""
        return MLACache(
            latent=None if self.latent is None else keep_rows(self.latent, pos),
            index=None if self.index is None else self.index.truncate(pos, kpool),
        )


class SparseMLA(nn.Module):
    """Nope-only MLA attending the indexer's selection (llama.cpp ``build_dsa_layer``)."""

    def __init__(
        self,
        w: Weights,
        prefix: str,
        *,
        heads: int,
        head_dim: int,
        eps: float,
        indexer: PoolIndexer | None,
        tail: bool,
    ):
        """The MLA of block ``prefix`` (``blk.N``): ``heads`` query heads of width ``head_dim``
        (``key_length_mla``); ``eps``: its norms'; ``indexer``: its own full indexer, if any;
        ``tail``: a query also attends its own incomplete pool (``kpool_select_tail``)."""
        super().__init__()
        p = prefix
        self.wq_a = w.matrix(f"{p}.attn_q_a.weight")
        self.q_a_norm = RMSNorm(w.param(f"{p}.attn_q_a_norm.weight"), eps)
        self.wq_b = w.matrix(f"{p}.attn_q_b.weight")
        self.wkv_a = w.matrix(f"{p}.attn_kv_a_mqa.weight")
        self.kv_norm = RMSNorm(w.param(f"{p}.attn_kv_a_norm.weight"), eps)
        self.wk_b = w.matrix_stack(f"{p}.attn_k_b.weight")  # [H, kv_lora_rank, qk_head_dim]
        self.wv_b = w.matrix_stack(f"{p}.attn_v_b.weight")  # [H, v_head_dim, kv_lora_rank]
        self.wo = w.matrix(f"{p}.attn_output.weight")
        self.indexer = indexer
        self.heads, self.head_dim = heads, head_dim
        self.scale = 1.0 / math.sqrt(head_dim)
        self.tail = tail

    def __call__(
        self, x: mx.array, pos0: int, cache: MLACache, shared: Selection | None
    ) -> tuple[mx.array, MLACache, Selection]:
        """A chunk (prefill): x [T, D] at positions pos0 .. -> (output [T, D], new cache, the
        selection used). ``shared`` is the selection of the last full indexer layer (for a
        layer without one)."""
        qr, q, rows = self._project(x)
        latent = append_rows(cache.latent, rows)
        index = cache.index
        if self.indexer is not None:
            keys, gates, weights = self.indexer.products(x)
            index = self.indexer.pool(keys, gates, pos0, index)
            positions = np.arange(pos0, pos0 + x.shape[0])
            shared = self.indexer.select(weights, qr, positions, index.pooled)
        out = self._attend(q, latent, _required(shared))
        return self._output(out), MLACache(latent=latent, index=index), shared

    def project_tile(self, x: mx.array, n_real: int) -> list[mx.array]:
        """What a decode tile's attention reads of its input x [T, D]: the absorbed queries
        [T, H, kv_lora_rank], the normed latent rows and, with an indexer of its own, the
        indexer's keys, gate rows, head weights and queries. Functions of x alone: a compiled
        tile computes them (``attend_tile`` takes them)."""
        indexer, tokens = self.indexer, x.shape[0]
        if indexer is None:
            q_a, kv_a = linear_many(x, [self.wq_a, self.wkv_a], n_real)
            qr = self.q_a_norm(q_a)
            q, index = linear(qr, self.wq_b, n_real), []
        else:
            # The indexer's products of x and of qr join MLA's own: one primitive each.
            q_a, kv_a, *products = linear_many(
                x, [self.wq_a, self.wkv_a, *indexer.input_weights], n_real
            )
            qr = self.q_a_norm(q_a)
            q, index_q = linear_many(qr, [self.wq_b, indexer.q_b], n_real)
            index = [*indexer.finish_products(*products), indexer.query_heads(index_q)]
        # Absorbed per head, on the real rows only: [T, H * head_dim] -> [T, H, kv_lora_rank].
        q = grouped_linear(q, self.wk_b, n_real).reshape(tokens, self.heads, -1)
        return [q, self.kv_norm(kv_a), *index]

    def attend_tile(
        self,
        projected: list[mx.array],
        pos0: int,
        cache: MLACache,
        shared: TileSelection | None,
        n_real: int,
    ) -> tuple[mx.array, MLACache, TileSelection]:
        """A decode tile's attention (see ``DECODE_TILE``; only its first ``n_real`` rows are
        real) between ``project_tile`` and ``output_tile``: the cache update, the indexer
        and the attention, whose shapes grow with the context (a compiled tile leaves them
        out). Each real row attends exactly the latents its position selects, in one
        ``kernels.sparse_attention`` for the tile (keys are values; no sink); padding rows
        select none and get zeros."""
        q, rows, *index_inputs = projected
        latent = append_rows(cache.latent, rows, n_real)
        index = cache.index
        if self.indexer is not None:
            keys, gates, weights, index_q = index_inputs
            index = self.indexer.pool_tile(keys, gates, pos0, index, n_real)
            positions = np.arange(pos0, pos0 + q.shape[0])
            shared = self.indexer.select_tile(index_q, weights, positions, index.pooled, n_real)
        shared = _required(shared)
        out = sparse_attention(
            q, latent, shared.window, latent, shared.index, _no_sink(self.heads), self.scale
        )
        return out, MLACache(latent=latent, index=index), shared

    def output_tile(self, out: mx.array, n_real: int) -> mx.array:
        """``_output`` of a decode tile's attended latents [T, H, kv_lora_rank]: each head's
        expanded on the real rows only, as one grouped product."""
        expanded = grouped_linear(out.reshape(out.shape[0], -1), self.wv_b, n_real)
        return linear(expanded, self.wo, n_real)

    def _project(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The query input qr [T, q_lora_rank], the absorbed queries [H, T, kv_lora_rank] and
        the normed latents [T, kv_lora_rank] of a chunk x [T, D]."""
        q_a, kv_a = linear_many(x, [self.wq_a, self.wkv_a])
        qr = self.q_a_norm(q_a)
        q = linear(qr, self.wq_b).reshape(x.shape[0], self.heads, self.head_dim)
        q = linear(mx.swapaxes(q, 0, 1), self.wk_b)  # absorbed: [H, T, kv_lora_rank]
        return qr, q, self.kv_norm(kv_a)

    def _output(self, out: mx.array, rows: int | None = None) -> mx.array:
        """The attended latents [H, T, kv_lora_rank] expanded and projected: [T, D]."""
        out = mx.swapaxes(linear(out, self.wv_b), 0, 1)
        return linear(out.reshape(out.shape[0], -1), self.wo, rows)

    def _attend(self, q: mx.array, latent: mx.array, selection: Selection) -> mx.array:
        """Attention of the absorbed queries over the selected latents (keys = values), in
        blocks of queries that bound the score memory."""
        heads, tokens = q.shape[:2]
        step = max(1, SCORE_BUDGET // (heads * latent.shape[0]))
        outs = [
            self._attend_block(q, latent, selection, t0, min(tokens, t0 + step))
            for t0 in range(0, tokens, step)
        ]
        return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1)

    def _attend_block(
        self, q: mx.array, latent: mx.array, selection: Selection, t0: int, t1: int
    ) -> mx.array:
        """The attention of queries t0 .. t1 - 1: [H, t1 - t0, kv_lora_rank]."""
        mask = selection.mask(t0, t1)
        keys = latent[None, None, : mask.shape[1]]
        out = mx.fast.scaled_dot_product_attention(
            q[None, :, t0:t1], keys, keys, scale=self.scale, mask=mask[None, None]
        )[0]
        if not self.tail:
            # A query that sees no position gets zeros, as from ggml's flash attention.
            out = mx.where(mx.any(mask, axis=-1)[None, :, None], out, 0.0)
        return out


@cache
def _no_sink(heads: int) -> mx.array:
    """Sink logits [heads] that add nothing: exp of one underflows to exactly 0 beside any real
    score, and a row that sees no key gets zeros (as from ggml's flash attention)."""
    return mx.array(np.full(heads, -1e30, np.float32))


def _required(selection: AnySelection | None) -> AnySelection:
    if selection is None:
        raise ValueError(
            "an MLA layer without its own indexer needs a full indexer layer before it"
        )
    return selection
