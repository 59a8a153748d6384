"""Mixture-of-experts pieces: expert gating/routing and the routed-expert FFN.

``RoutedExperts`` applies one layer's routed experts with gathered matmuls over the stacked weights
an expert store (``ds4mlx.experts``: resident, or streamed from the GGUF through a slab cache)
hands it. ``SharedExpertMoE`` is the DeepSeek-style FFN around it (router, selection bias or hash
routing, shared expert), as llama.cpp's ``build_moe_ffn`` plus ``build_ffn`` compute it.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from ds4mlx.experts import ExpertBatch, LayerExperts, PrefetchHint, ResidentLayer
from ds4mlx.kernels import (
    Weight,
    gather_linear,
    inference,
    linear,
    linear_many,
    moe_combine,
    moe_route,
    moe_tile,
    routed_experts,
    routed_pairs,
    swiglu,
)
from ds4mlx.kernels.twins import softplus
from ds4mlx.models.tiles import CompiledTiles
from ds4mlx.models.weights import Weights

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# ggml clamps the routing-weight sum to the smallest normal float16 before dividing.
_MIN_WEIGHT_SUM = 6.103515625e-5
# Above this many (token, expert) pairs, sorting them by expert makes gather_mm faster.
_SORT_THRESHOLD = 64


class GatingFunc(IntEnum):
    """``<arch>.expert_gating_func`` values (llama.cpp ``llama_expert_gating_func_type``)."""

    SOFTMAX = 1
    SIGMOID = 2
    SOFTMAX_WEIGHT = 3  # softmax over the selected logits, not over all experts
    SQRT_SOFTPLUS = 4


def gate_probs(logits: mx.array, func: GatingFunc) -> mx.array:
    """Per-expert router probabilities from the router logits [T, E]."""
    if func == GatingFunc.SOFTMAX:
        return mx.softmax(logits, axis=-1, precise=True)
    if func == GatingFunc.SIGMOID:
        return mx.sigmoid(logits)
    if func == GatingFunc.SOFTMAX_WEIGHT:
        return logits
    if func == GatingFunc.SQRT_SOFTPLUS:
        return mx.sqrt(softplus(logits))
    raise ValueError(f"unsupported expert gating function {func}")


def route(
    probs: mx.array,
    n_used: int,
    *,
    func: GatingFunc,
    bias: mx.array | None = None,
    selected: mx.array | None = None,
    normalize: bool,
    scale: float,
) -> tuple[mx.array, mx.array]:
    """Pick ``n_used`` experts per token and their weights, as llama.cpp's ``build_moe_ffn``.

    Experts are chosen on ``probs + bias`` (the bias only steers selection) unless ``selected``
    (e.g. hash routing) fixes them; weights are the unbiased probs of the chosen experts, optionally
    renormalised to sum 1, then multiplied by ``scale`` (skipped for 0 and 1, as llama.cpp does).
    Returns (indices [T, k] int32, weights [T, k]).
    """
    if selected is None:
        scores = probs if bias is None else probs + bias
        # stop_gradient: a selection has no gradient (MLX cannot differentiate a gather with
        # respect to its indices), which matters when training differentiates through routing.
        selected = mx.stop_gradient(mx.argsort(-scores, axis=-1)[:, :n_used])
    selected = selected.astype(mx.int32)
    weights = mx.take_along_axis(probs, selected, axis=-1)
    if func == GatingFunc.SOFTMAX_WEIGHT:
        weights = mx.softmax(weights, axis=-1, precise=True)
    if normalize:
        total = mx.maximum(mx.sum(weights, axis=-1, keepdims=True), _MIN_WEIGHT_SUM)
        weights = weights / total
    if scale not in (0.0, 1.0):
        weights = weights * scale
    return selected, weights


class RoutedExperts(nn.Module):
    """One layer's routed SwiGLU experts, stacked [E, out, in], applied with gathered matmuls
    (``kernels.gather_linear``) over the batches its ``LayerExperts`` yields."""

    def __init__(
        self,
        gate: Weight | None = None,
        up: Weight | None = None,
        down: Weight | None = None,
        *,
        swiglu_limit: float,
        layer: LayerExperts | None = None,
    ):
        """gate/up [E, F, D] and down [E, D, F] as GGUF stores them ([expert, out, in]), held
        resident; or ``layer``, an expert store's view of them."""
        super().__init__()
        if layer is None:
            if gate is None or up is None or down is None:
                raise ValueError("RoutedExperts needs gate, up and down weights or a layer")
            layer = ResidentLayer(gate, up, down)
        if isinstance(layer, ResidentLayer):
            # Resident weights stay module members (parameter tree, training subclasses).
            self.gate, self.up, self.down = layer.gate, layer.up, layer.down
        self.layer = layer
        self.swiglu_limit = swiglu_limit

    def _ffn(self, xs: mx.array, batch: ExpertBatch, idx: mx.array, sort: bool) -> mx.array:
        gate = gather_linear(xs, batch.gate, idx, sort)
        up = gather_linear(xs, batch.up, idx, sort)
        return gather_linear(swiglu(gate, up, self.swiglu_limit), batch.down, idx, sort)

    def __call__(
        self, x: mx.array, indices: mx.array, weights: mx.array, row_invariant: bool = False
    ) -> mx.array:
        """x [T, D], indices/weights [T, k] -> sum_k weights * expert_k(x), [T, D].

        ``row_invariant``: each row's result must not depend on the other rows (decode tiles),
        so the rows of one expert are not batched into one product."""
        out = self.outputs(x, indices, row_invariant)
        return mx.sum(out * weights[..., None], axis=1)

    def outputs(self, x: mx.array, indices: mx.array, row_invariant: bool = False) -> mx.array:
        """Each chosen expert's output, x [T, D], indices [T, k] -> [T, k, D]."""
        tokens, k = indices.shape
        results = self.layer.map_batches(
            indices, lambda batch: self._batch_outputs(x, batch, k, row_invariant)
        )
        return gathered_outputs(list(results), tokens, k)

    def _batch_outputs(
        self, x: mx.array, batch: ExpertBatch, k: int, row_invariant: bool
    ) -> mx.array:
        """One batch's outputs: [T, k, (1,) D] for every pair, or [P, (1,) D] for ``pairs``."""
        if batch.pairs is None:
            out = routed_experts(
                x,
                batch.gate,
                batch.up,
                batch.down,
                batch.indices,
                self.swiglu_limit,
                row_invariant=row_invariant,
            )
            return self._all_pairs(x, batch) if out is None else out
        # Some pairs only (a streamed layer needing more experts than its cache holds): each
        # pair's result is the same product on the same rows, so the same bits.
        rows = x[mx.array(batch.pairs // k)]
        part = routed_experts(
            rows,
            batch.gate,
            batch.up,
            batch.down,
            batch.indices[:, None],
            self.swiglu_limit,
            row_invariant=row_invariant,
        )
        return self._ffn(rows[:, None, :], batch, batch.indices, True) if part is None else part

    def _all_pairs(self, x: mx.array, batch: ExpertBatch) -> mx.array:
        """Every (token, expert) pair: [T, k, 1, D] or, sorted, [T * k, 1, D]."""
        k = batch.indices.shape[1]
        sort = batch.indices.size >= _SORT_THRESHOLD
        if not sort:
            # x [T, 1, 1, D] broadcasts against indices [T, k]
            return self._ffn(x[:, None, None, :], batch, batch.indices, False)
        # Grouping the (token, expert) pairs by expert lets gather_mm run per-expert GEMMs.
        flat = batch.indices.flatten()
        order = mx.argsort(flat)
        out = self._ffn(x[order // k][:, None, :], batch, flat[order], True)
        return out[mx.argsort(order)]


def gathered_outputs(
    results: Sequence[tuple[ExpertBatch, mx.array]], tokens: int, k: int
) -> mx.array:
    """The outputs [T, k, D] of a routing's batches and their results
    (``RoutedExperts._batch_outputs``): one batch of every pair, or batches of some pairs each,
    put back in the routing's order."""
    if results[0][0].pairs is None:
        out = results[0][1]
    else:
        pairs = np.concatenate([batch.pairs for batch, _ in results])
        out = mx.concatenate([result for _, result in results])[mx.array(np.argsort(pairs))]
    return out.reshape(tokens, k, -1)


class SwiGLU(nn.Module):
    """A dense SwiGLU FFN, ``down(swiglu(gate x, up x, limit))`` (llama.cpp ``build_ffn`` with
    LLM_FFN_SILU / LLM_FFN_PAR); weights [out, in] as GGUF stores them."""

    def __init__(self, gate: Weight, up: Weight, down: Weight, limit: float = 0.0):
        super().__init__()
        self.gate = gate
        self.up = up
        self.down = down
        self.limit = limit

    def __call__(self, x: mx.array, rows: int | None = None) -> mx.array:
        """``rows``: see ``kernels.linear``."""
        return self.down_of(*linear_many(x, [self.gate, self.up], rows), rows)

    def down_of(self, gate: mx.array, up: mx.array, rows: int | None = None) -> mx.array:
        """The FFN's output from the products ``gate x`` and ``up x``."""
        return linear(swiglu(gate, up, self.limit), self.down, rows)


def shared_expert_moe_shapes(
    prefix: str,
    *,
    hidden: int,
    n_experts: int,
    expert_ff: int,
    shared_ff: int,
    hash_table: tuple[int, int] | None = None,
) -> dict[str, tuple[int, ...]]:
    """The tensors ``SharedExpertMoE`` reads; ``hash_table`` (vocab, n_used) for a hash-routed
    layer, which has no selection bias."""
    d, e, f = hidden, n_experts, expert_ff
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}.ffn_gate_inp.weight": (e, d)}
    if hash_table is not None:
        shapes[f"{prefix}.ffn_gate_tid2eid.weight"] = hash_table
    else:
        shapes[f"{prefix}.exp_probs_b.bias"] = (e,)
    return shapes | {
        f"{prefix}.ffn_gate_exps.weight": (e, f, d),
        f"{prefix}.ffn_up_exps.weight": (e, f, d),
        f"{prefix}.ffn_down_exps.weight": (e, d, f),
        f"{prefix}.ffn_gate_shexp.weight": (shared_ff, d),
        f"{prefix}.ffn_up_shexp.weight": (shared_ff, d),
        f"{prefix}.ffn_down_shexp.weight": (d, shared_ff),
    }


class SharedExpertMoE(nn.Module):
    """Routed experts plus the shared expert of one layer (tensors ``{prefix}.ffn_*``).

    Experts are chosen on the router's ``gating`` probabilities plus the selection bias
    ``exp_probs_b`` or, with ``hash_routed``, by the token id through ``ffn_gate_tid2eid``
    (no bias then); see ``route`` for the weights.
    """

    def __init__(
        self,
        w: Weights,
        prefix: str,
        *,
        n_used: int,
        gating: GatingFunc,
        normalize: bool,
        weights_scale: float,
        swiglu_limit: float,
        swiglu_limit_shared: float,
        hash_routed: bool = False,
    ):
        super().__init__()
        self.router = w.matrix(f"{prefix}.ffn_gate_inp.weight")
        self.hash_routes: mx.array | None = None
        self.bias: mx.array | None = None
        if hash_routed:
            self.hash_routes = w.ints(f"{prefix}.ffn_gate_tid2eid.weight")
        else:
            self.bias = w.param(f"{prefix}.exp_probs_b.bias")
        names = (
            f"{prefix}.ffn_gate_exps.weight",
            f"{prefix}.ffn_up_exps.weight",
            f"{prefix}.ffn_down_exps.weight",
        )
        self.experts = RoutedExperts(
            layer=w.routed_experts(names, n_used), swiglu_limit=swiglu_limit
        )
        self.shared = SwiGLU(
            w.matrix(f"{prefix}.ffn_gate_shexp.weight"),
            w.matrix(f"{prefix}.ffn_up_shexp.weight"),
            w.matrix(f"{prefix}.ffn_down_shexp.weight"),
            swiglu_limit_shared,
        )
        self.n_used = n_used
        self.gating = gating
        self.normalize = normalize
        self.weights_scale = weights_scale
        self.prefix = prefix
        # Set by ``link_expert_prefetch`` when the next layer's experts are streamed; a plain
        # object, not a module, so the next layer does not join this one's parameter tree.
        self.prefetch_next: PrefetchHint | None = None
        # Compiled, the routing and SwiGLU elementwise chains fuse (77 -> 46 primitives a layer
        # on ds4-tiny). Only resident experts qualify: a streamed store reads the routing on
        # the host.
        self._tiles = CompiledTiles(self._tile)

    @property
    def compiles_tiles(self) -> bool:
        """Whether decode tiles run compiled: only over resident experts (a streamed store
        reads the routing on the host)."""
        return type(self.experts) is RoutedExperts and isinstance(self.experts.layer, ResidentLayer)

    @property
    def streams_experts(self) -> bool:
        """Whether the routed experts come from a store that reads the routing on the host (a
        streamed one): a decode tile then runs as ``tile_routing``, the store's batches and
        ``tile_with_batch``, which a block compiles on either side of the read."""
        return type(self.experts) is RoutedExperts and not isinstance(
            self.experts.layer, ResidentLayer
        )

    def select(
        self, x: mx.array, tokens: mx.array | None = None, rows: int | None = None
    ) -> tuple[mx.array, mx.array]:
        """The routing of x [T, D]: (indices, weights) [T, k] (``rows``: see
        ``kernels.linear``)."""
        probs = gate_probs(linear(x, self.router, rows), self.gating)
        return self._route(probs, self._hashed(tokens))

    def guess_experts(self, x: mx.array, tokens: mx.array | None) -> mx.array:
        """This layer's routing [T, k] of the previous layer's FFN input x: a guess to prefetch
        by (the residual stream changes little between layers; hash-routed layers are exact)."""
        return self.select(x, tokens)[0]

    def _hashed(self, tokens: mx.array | None) -> mx.array | None:
        """The experts a hash-routed layer takes for ``tokens`` (None for a routed layer)."""
        if self.hash_routes is None:
            return None
        if tokens is None:
            raise ValueError("a hash-routed MoE layer needs the token ids")
        return self.hash_routes[tokens]

    def _route(self, probs: mx.array, selected: mx.array | None) -> tuple[mx.array, mx.array]:
        return route(
            probs,
            self.n_used,
            func=self.gating,
            bias=self.bias,
            selected=selected,
            normalize=self.normalize,
            scale=self.weights_scale,
        )

    def __call__(self, x: mx.array, tokens: mx.array | None = None) -> mx.array:
        """A chunk (prefill): x [T, D] (``tokens`` [T] int32 for hash-routed layers) -> [T, D]."""
        indices, weights = self.select(x, tokens)
        routed = self.experts(x, indices, weights)
        if self.prefetch_next is not None:  # prefill: overlap the next layer's reads
            self.prefetch_next(x, tokens)
        return routed + self.shared(x)

    def tile(self, x: mx.array, tokens: mx.array | None, n_real: int) -> mx.array:
        """A fixed-shape decode tile whose first ``n_real`` rows are real: the routed experts
        run on those alone (their per-row results do not depend on the number of rows, and
        padding rows would only cost expert reads); padding rows get the shared expert only."""
        if self.compiles_tiles:
            return self._tiles.get(n_real)(x, tokens)
        # Streamed experts: the same native routing and sum as the compiled tile (which runs in
        # inference, models.tiles), so resident and streamed experts give the same bits.
        with inference():
            return self._tile(x, tokens, n_real)

    def _tile(self, x: mx.array, tokens: mx.array | None, n_real: int) -> mx.array:
        """``tile``'s graph: routed experts on the first ``n_real`` rows, the shared expert on
        all."""
        # The router's and the shared expert's products of x as one call.
        router, gate, up = linear_many(x, [self.router, self.shared.gate, self.shared.up], n_real)
        hashed = self._hashed(tokens)
        if self.compiles_tiles:  # this module's own resident experts
            experts = self.experts.layer
            fused = moe_tile(
                router,
                x,
                experts.gate,
                experts.up,
                experts.down,
                gate,
                up,
                self.shared.down,
                self.bias,
                hashed,
                n_real,
                **self._routing,
                limit=self.experts.swiglu_limit,
                shared_limit=self.shared.limit,
            )
            if fused is not None:
                return fused
        if type(self.experts) is RoutedExperts:
            # Streamed experts: the same routing and sum as the fused tile (the same bits),
            # around the store's reads, which need the chosen experts on the host.
            indices, weights = self._tile_route(router, hashed, n_real)
            outputs = self._routed_outputs(x, indices, n_real)
            return self._tile_combine(x, outputs, weights, gate, up, n_real)
        indices, weights = self._route(gate_probs(router, self.gating), hashed)
        routed = self.experts(x[:n_real], indices[:n_real], weights[:n_real], row_invariant=True)
        return self._plus_shared(routed, x.shape[0], gate, up)

    @property
    def _routing(self) -> dict[str, int | bool | float]:
        return {
            "n_used": self.n_used,
            "func": int(self.gating),
            "normalize": self.normalize,
            "scale": self.weights_scale,
        }

    def _tile_route(
        self, router: mx.array, hashed: mx.array | None, n_real: int
    ) -> tuple[mx.array, mx.array]:
        """The routing (indices, weights) of a tile from the router's logits: the fused tile's
        own where there is one (``kernels.moe_route``)."""
        routed = moe_route(router, self.bias, hashed, n_real, **self._routing)
        if routed is not None:
            return routed
        return self._route(gate_probs(router, self.gating), hashed)

    def _tile_combine(
        self,
        x: mx.array,
        outputs: mx.array,
        weights: mx.array,
        gate: mx.array,
        up: mx.array,
        n_real: int,
    ) -> mx.array:
        """The routed experts' ``outputs`` [R, k, D] weighted and summed, plus the shared expert
        (its products ``gate``, ``up`` of the tile x): the fused tile's sum where there is one
        (``kernels.moe_combine``, which exists only beside ``moe_route``)."""
        combined = moe_combine(outputs, weights, gate, up, self.shared.down, self.shared.limit)
        if combined is not None:
            return combined
        routed = mx.sum(outputs * weights[:n_real][..., None], axis=1)
        return self._plus_shared(routed, x.shape[0], gate, up)

    def _plus_shared(self, routed: mx.array, tokens: int, gate: mx.array, up: mx.array) -> mx.array:
        """The routed sum of a tile's real rows [R, D], zeros for its padding rows up to
        ``tokens``, plus the shared expert from its products ``gate``, ``up``."""
        real = routed.shape[0]
        padding = mx.zeros((tokens - real, routed.shape[1]), routed.dtype)
        return mx.concatenate([routed, padding]) + self.shared.down_of(gate, up, real)

    def tile_routing(self, x: mx.array, tokens: mx.array | None, n_real: int) -> list[mx.array]:
        """A streamed tile up to its routing: [indices [R, k] of the real rows, weights, and the
        shared expert's products gate, up of x], all the host waits for before the store finds
        (or reads) the experts (``streams_experts``)."""
        router, gate, up = linear_many(x, [self.router, self.shared.gate, self.shared.up], n_real)
        indices, weights = self._tile_route(router, self._hashed(tokens), n_real)
        return [indices[:n_real], weights, gate, up]

    def tile_with_batch(
        self,
        x: mx.array,
        weights: mx.array,
        gate: mx.array,
        up: mx.array,
        batch: ExpertBatch,
        n_real: int,
    ) -> mx.array:
        """A streamed tile's rest from ``tile_routing``'s results and the store's one batch of
        every pair: ``tile``'s result, the same bits."""
        k = batch.indices.shape[1]
        outputs = self.experts._batch_outputs(x[:n_real], batch, k, True).reshape(n_real, k, -1)
        return self._tile_combine(x, outputs, weights, gate, up, n_real)

    def tile_with_outputs(
        self, x: mx.array, weights: mx.array, gate: mx.array, up: mx.array, outputs: mx.array
    ) -> mx.array:
        """``tile_with_batch`` from the routed ``outputs`` [R, k, D] of several batches."""
        return self._tile_combine(x, outputs, weights, gate, up, outputs.shape[0])

    def _routed_outputs(self, x: mx.array, indices: mx.array, n_real: int) -> mx.array:
        """The routed experts' outputs [R, k, (1,) D] of the tile x's first R = ``n_real`` rows
        from the routing's ``indices`` [T, k]: on the GPU over resident experts, launches that
        read x and the indices as they are (``kernels.routed_pairs``); the store's batches
        else."""
        if self.compiles_tiles:
            layer = self.experts.layer
            limit = self.experts.swiglu_limit
            pairs = routed_pairs(x, layer.gate, layer.up, layer.down, indices, n_real, limit)
            if pairs is not None:
                return pairs
        return self.experts.outputs(x[:n_real], indices[:n_real], row_invariant=True)


def moe_layers(network: nn.Module, num_layers: int) -> list[SharedExpertMoE]:
    """The main model's MoE layers (``blk.N`` with N < ``num_layers``) in layer order."""
    found = [m for _, m in network.named_modules() if isinstance(m, SharedExpertMoE)]
    main = [m for m in found if int(m.prefix.split(".")[1]) < num_layers]
    return sorted(main, key=lambda m: int(m.prefix.split(".")[1]))


def link_expert_prefetch(moes: Sequence[SharedExpertMoE]) -> None:
    """Each layer of ``moes`` (in execution order) hints the next one's store during prefill,
    where that store reads experts (a streamed one)."""
    for current, following in zip(moes, moes[1:], strict=False):
        layer = following.experts.layer
        current.prefetch_next = (
            PrefetchHint(following.guess_experts, layer) if layer.prefetches else None
        )
