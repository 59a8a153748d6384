"""The deepseek4 model of one rank: sharded attention and experts, partial sums ``all_sum``'d.

Every rank runs the same program on the same tokens (SPMD): the collectives are the only
communication, and since an ``all_sum`` hands every rank the same bits, every rank computes the
same logits and so makes the same sampling and speculation decisions; rank 0 alone talks to
the user. Per layer and chunk two [T, D] float32 partials are summed: the attention output and
the routed experts' output (in a decode tile, of its real rows only).
"""

from __future__ import annotations

from typing import cast

from ds4mlx.distributed.group import RankGroup
from ds4mlx.distributed.plan import ShardPlan
from ds4mlx.distributed.weights import ShardedGGUFWeights
from ds4mlx.experts import ExpertStore, LayerExperts
from ds4mlx.gguf import GGUFFile
from ds4mlx.models.deepseek4 import (
    DECODE_TILE,
    Attention,
    Block,
    Model,
    ModelArgs,
    tensor_shapes,
)
from ds4mlx.models.moe import RoutedExperts, SharedExpertMoE
from ds4mlx.models.rope import RopeAngles
from ds4mlx.models.weights import Weights

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def _sharded(w: Weights) -> ShardedGGUFWeights:
    if not isinstance(w, ShardedGGUFWeights):
        raise TypeError("sharded modules are built from ShardedGGUFWeights")
    return w


class ShardedAttention(Attention):
    """Attention over this rank's heads (its output groups); ``wo_b`` is row-parallel, so the
    output is this rank's partial sum, completed across the ranks."""

    def __init__(self, args: ModelArgs, w: Weights, layer: int):
        super().__init__(args, w, layer)
        self.ranks = _sharded(w).ranks

    def output(self, out: mx.array, angles: RopeAngles, real_rows: int | None = None) -> mx.array:
        partial = super().output(out, angles)
        if real_rows is None or real_rows == partial.shape[0]:
            return self.ranks.all_sum(partial)
        # A decode tile's padding rows are discarded, so only the real rows travel (on the
        # tiny model 54 -> 12 KiB a token); the padding rows become zeros, the same bits on
        # every rank, as rows past real_rows must be for the ranks to stay in step.
        real = self.ranks.all_sum(partial[:real_rows])
        return mx.concatenate([real, mx.zeros_like(partial[real_rows:])])


class ExpertShard(nn.Module):
    """The routed experts [lo, lo + n) of a layer, applied to globally routed (indices, weights):
    this rank adds the contributions of the pairs routed to its experts, and the ranks' outputs
    are summed.

    Decode and verify chunks (at most DECODE_TILE rows) keep the single-process shapes: pairs
    routed elsewhere run through local expert 0 with weight 0. That needs no host sync, and
    each row's result stays independent of the chunk, which keeps greedy speculation exact.
    (Running only the local pairs costs a routing sync per layer; on loopback that made decode
    slower, 1.8-2.0 vs 2.3-3.1 tok/s.) Longer prefill chunks are compute-bound: there each
    rank runs only its own pairs, 1/size of the expert work.
    """

    def __init__(self, inner: RoutedExperts, lo: int, n: int, ranks: RankGroup):
        super().__init__()
        self.inner = inner
        self.lo, self.n = lo, n
        self.ranks = ranks

    @property
    def layer(self) -> LayerExperts:
        """The local experts' store view (``link_expert_prefetch`` reads it)."""
        return self.inner.layer

    def __call__(
        self, x: mx.array, indices: mx.array, weights: mx.array, row_invariant: bool = False
    ) -> mx.array:
        local = indices - self.lo
        mine = (local >= 0) & (local < self.n)
        if indices.shape[0] <= DECODE_TILE:
            out = self.inner(
                x,
                mx.where(mine, local, 0),
                mx.where(mine, weights, 0.0),
                row_invariant=row_invariant,
            )
        else:
            out = self._local_pairs(x, local, mine, weights)
        return self.ranks.all_sum(out)

    def _local_pairs(
        self, x: mx.array, local: mx.array, mine: mx.array, weights: mx.array
    ) -> mx.array:
        """The routed output [T, D] from this rank's (token, expert) pairs alone."""
        tokens, k = local.shape
        pairs = np.flatnonzero(np.array(mine).reshape(-1))
        # [T * k, D]: the weighted pair outputs, zero where another rank's expert was chosen,
        # then summed over k as the single-process path sums them.
        slots = mx.zeros((tokens * k, x.shape[-1]), x.dtype)
        if pairs.size:
            at = mx.array(pairs.astype(np.int32))
            out = self.inner(
                x[at // k], local.reshape(-1)[at][:, None], weights.reshape(-1)[at][:, None]
            )
            slots = slots.at[at].add(out)
        return mx.sum(slots.reshape(tokens, k, -1), axis=1)


class ShardedMoE(SharedExpertMoE):
    """``SharedExpertMoE`` whose routed experts are this rank's range (router and shared expert
    replicated: every rank routes identically and adds the shared expert after the sum)."""

    def __init__(self, w: Weights, prefix: str, **kwargs):
        super().__init__(w, prefix, **kwargs)
        sharded = _sharded(w)
        lo, hi = sharded.plan.experts
        self.experts = cast(RoutedExperts, ExpertShard(self.experts, lo, hi - lo, sharded.ranks))


class ShardedBlock(Block):
    attention_class = ShardedAttention
    moe_class = ShardedMoE


class ShardedModel(Model):
    """The deepseek4 ``Model`` of one rank. ``args`` stays the whole model's (drafters and
    callers see the model they loaded); ``plan.local_args`` built this rank's blocks."""

    block_class = ShardedBlock

    def __init__(self, plan: ShardPlan, w: ShardedGGUFWeights):
        super().__init__(plan.local_args, w)
        self.args = plan.args
        self.plan = plan

    @classmethod
    def from_gguf(
        cls,
        gguf_file: GGUFFile,
        weights_dtype: str | None = None,
        expert_store: ExpertStore | None = None,
        *,
        ranks: RankGroup | None = None,
    ) -> ShardedModel:
        """This rank's shard of the model in ``gguf_file`` (raises ShardError when the model
        does not split over ``ranks``)."""
        if ranks is None:
            raise TypeError("ShardedModel.from_gguf needs the rank group")
        args = ModelArgs.from_gguf(gguf_file)
        plan = ShardPlan.for_model(args, ranks.rank, ranks.size)
        return cls(
            plan,
            ShardedGGUFWeights(
                tensor_shapes(args), gguf_file, weights_dtype, plan, ranks, expert_store
            ),
        )
