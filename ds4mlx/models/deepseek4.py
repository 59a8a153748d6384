"""DeepSeek-V4(-Flash): llama.cpp architecture ``deepseek4``.

Follows llama.cpp (commit 0c1e570) ``src/models/deepseek4.cpp`` and its DSV4 KV cache
(``llama-kv-cache-dsv4.cpp``) rather than the paper where the two differ. Per layer:

* mHC: ``hc`` residual streams, collapsed before and re-expanded after attention and the FFN.
* Attention: a low-rank query (``wq_a`` -> norm -> ``wq_b``, then a weightless per-head RMS norm),
  one shared key head that is also the value head (K = V), RoPE on the last ``n_rot`` channels,
  per-head attention sinks, the output de-rotated at the query position, then a grouped low-rank
  output projection (``wo_a`` per group, ``wo_b``).
* Keys: the raw keys of the last ``sliding_window`` positions, plus compressed keys when the layer
  has a compress ratio: 4 (CSA: overlapping blocks, a lightning indexer picks the top-k blocks
  per query) or 128 (HCA: every completed block). A block of ``ratio`` positions is pooled by a
  per-channel softmax over learned gate scores and becomes visible to the query that completes it.
* FFN: routed experts (sqrt-softplus scores, selection bias, or hash routing by token id in the
  first layers) plus one shared expert, both with a clamped SwiGLU.

Notes where llama.cpp's semantics are the contract:

* Layers with a compress ratio use the compressed-RoPE base (and YaRN) for their queries and raw
  keys too; layers without use the plain base without YaRN.
* A compressed row is RoPE'd at the first position of its block (``ratio * block``).
* The CSA block ``b`` pools the first half of the gate/kv channels of block ``b - 1`` with the
  second half of block ``b`` (block 0 sees a -inf gate for the missing previous block).
* The indexer's top-k is taken over the visible blocks only; with at most ``top_k`` visible
  blocks all are used. llama.cpp Hadamard-rotates the indexer queries and keys; the rotation is
  orthonormal, so scores and selection are unchanged and it is omitted here.
* YaRN's beta_fast/beta_slow are llama.cpp's defaults (32, 1): its deepseek4 loader ignores the
  ``rope.scaling.yarn_*`` keys. The YaRN magnitude factor is cancelled (``dsv4_rope_attn_factor``).
* Per-tensor ``.scale`` / ``.input_scale`` companions of the FFN weights are not applied:
  llama.cpp's deepseek4 graph passes none of them to its matmuls.

All math is float32; llama.cpp's default F16 KV cache and F16 flash-attention accumulation are
not emulated. How a block's decode tile runs compiled around its attention is in
``models.deepseek4_tiles``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

from ds4mlx import kernels
from ds4mlx.gguf import GGUFError, GGUFFile, MetaValue
from ds4mlx.kernels import (
    grouped_input_shape,
    grouped_linear,
    grow_rows,
    hc_expand,
    linear,
    linear_many,
)
from ds4mlx.models.base import DECODE_TILE, TiledModel, pad_to_tile
from ds4mlx.models.cache import ModelState, append_rows
from ds4mlx.models.compressed_attention import (
    CSA_RATIO,
    HCA_RATIO,
    CompressedAttention,
    Compressor,
    LayerCache,
    LightningIndexer,
    compressor_shapes,
)
from ds4mlx.models.deepseek4_tiles import CompiledBlockTiles, ProjectedRows
from ds4mlx.models.metadata import ArchMetadata, first
from ds4mlx.models.mhc import HyperHead, block_site_shapes, load_block_sites
from ds4mlx.models.moe import (
    GatingFunc,
    SharedExpertMoE,
    shared_expert_moe_shapes,
)
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.rope import RoPE, RopeAngles, RopeConfig
from ds4mlx.models.tiles import CompiledTiles
from ds4mlx.models.weights import Weights

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import GGUFValueType

ARCH = "deepseek4"
# Positions a state can be rolled back by (``Model.truncate``), however they were fed: a
# speculative verify pass feeds at most this many rows, and the rejected ones are cut off
# afterwards (the caches keep the history for it, ``CACHE_SLACK``).
ROLLBACK_DEPTH = 16
# Rows of history caches keep beyond what the next chunk needs: a tile drops its padding rows
# (up to DECODE_TILE - 1) and then a caller may still roll back ROLLBACK_DEPTH positions.
CACHE_SLACK = ROLLBACK_DEPTH + DECODE_TILE

# --------------------------------------------------------------------------------------------
# Hyper-parameters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelArgs:
    """Hyper-parameters from the GGUF metadata (keys ``deepseek4.*``), as llama.cpp reads them."""

    vocab_size: int
    hidden_size: int
    num_layers: int  # main layers, without the MTP (nextn) block
    num_heads: int
    head_dim: int
    rope_dims: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    compress_ratios: tuple[int, ...]
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    rope_scaling_type: str
    rope_freq_scale: float
    rope_orig_ctx: int
    n_experts: int
    n_experts_used: int
    n_shared_experts: int
    expert_ff: int
    expert_weights_scale: float
    expert_weights_norm: bool
    gating_func: GatingFunc
    swiglu_limits: tuple[float, ...]
    swiglu_limits_shared: tuple[float, ...]
    n_hash_layers: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ModelArgs:
        meta = ArchMetadata(gguf, ARCH)
        key, req, opt = meta.key, meta.req, meta.opt
        block_count = int(req("block_count"))
        n_nextn = int(opt("nextn_predict_layers", 0))
        # As llama.cpp: the MTP block only counts when its tensors are in the file.
        if n_nextn and not gguf.has_tensor(f"blk.{block_count - n_nextn}.nextn.eh_proj.weight"):
            n_nextn = 0

        def per_layer(name: str, value: Any) -> tuple[float, ...]:
            return tuple(float(v) for v in meta.per_layer(name, value, block_count))

        ratios = tuple(int(r) for r in req("attention.compress_ratios"))
        if len(ratios) < block_count:
            raise GGUFError(
                f"{gguf.path}: metadata '{key('attention.compress_ratios')}' has {len(ratios)} "
                f"entries, shorter than block_count {block_count}"
            )
        bad = sorted({r for r in ratios if r not in (0, CSA_RATIO, HCA_RATIO)})
        if bad:
            raise GGUFError(
                f"{gguf.path}: compress ratios {bad} are not supported (only 0, 4 and 128)"
            )

        gating = int(req("expert_gating_func"))
        if gating != GatingFunc.SQRT_SOFTPLUS:
            raise GGUFError(
                f"{gguf.path}: '{key('expert_gating_func')}' is {gating}; deepseek4 expects "
                f"{int(GatingFunc.SQRT_SOFTPLUS)} (sqrt-softplus)"
            )

        clamp_exp = per_layer("swiglu_clamp_exp", req("swiglu_clamp_exp"))
        clamp_shexp = opt("swiglu_clamp_shexp", None)
        if clamp_shexp is not None:
            clamp_shexp = per_layer("swiglu_clamp_shexp", clamp_shexp)

        head_dim = int(req("attention.key_length"))
        num_heads = int(first(req("attention.head_count")))
        o_groups = int(req("attention.output_group_count"))
        if num_heads % o_groups:
            raise GGUFError(f"{gguf.path}: {num_heads} heads do not split into {o_groups} groups")
        value_dim = int(opt("attention.value_length", head_dim))
        if value_dim != head_dim:
            raise GGUFError(
                f"{gguf.path}: deepseek4 needs value_length == key_length, got {value_dim} "
                f"and {head_dim}"
            )

        factor = float(opt("rope.scaling.factor", 0.0))
        return cls(
            vocab_size=meta.vocab_size(),
            hidden_size=int(req("embedding_length")),
            num_layers=block_count - n_nextn,
            num_heads=num_heads,
            head_dim=head_dim,
            rope_dims=int(req("rope.dimension_count")),
            q_lora_rank=int(req("attention.q_lora_rank")),
            o_groups=o_groups,
            o_lora_rank=int(req("attention.output_lora_rank")),
            sliding_window=int(req("attention.sliding_window")),
            compress_ratios=ratios[:block_count],
            rms_norm_eps=float(req("attention.layer_norm_rms_epsilon")),
            rope_theta=float(opt("rope.freq_base", 10000.0)),
            compress_rope_theta=float(req("attention.compress_rope_freq_base")),
            rope_scaling_type=str(opt("rope.scaling.type", "linear")),
            rope_freq_scale=1.0 if factor == 0.0 else 1.0 / factor,
            rope_orig_ctx=int(
                opt("rope.scaling.original_context_length", opt("context_length", 0))
            ),
            n_experts=int(req("expert_count")),
            n_experts_used=int(first(req("expert_used_count"))),
            n_shared_experts=int(req("expert_shared_count")),
            expert_ff=int(first(req("expert_feed_forward_length"))),
            expert_weights_scale=float(req("expert_weights_scale")),
            expert_weights_norm=bool(req("expert_weights_norm")),
            gating_func=GatingFunc(gating),
            swiglu_limits=clamp_exp,
            swiglu_limits_shared=clamp_exp if clamp_shexp is None else clamp_shexp,
            n_hash_layers=int(req("hash_layer_count")),
            index_heads=int(req("attention.indexer.head_count")),
            index_head_dim=int(req("attention.indexer.key_length")),
            index_topk=int(req("attention.indexer.top_k")),
            hc_mult=int(req("hyper_connection.count")),
            hc_sinkhorn_iters=int(req("hyper_connection.sinkhorn_iterations")),
            hc_eps=float(req("hyper_connection.epsilon")),
        )

    def rope_config(self, layer: int) -> RopeConfig:
        """The RoPE of a layer's queries and raw keys (llama.cpp ``build_attention_impl``)."""
        if self.compress_ratios[layer] == 0:
            return RopeConfig(n_dims=self.rope_dims, base=self.rope_theta)
        return self.compress_rope_config()

    def compress_rope_config(self) -> RopeConfig:
        """The RoPE of compressed rows, indexer queries and compressed layers' queries."""
        scaling = self.rope_scaling_type
        freq_scale = 1.0 if scaling == "none" else self.rope_freq_scale
        ext_factor = 1.0 if scaling == "yarn" else 0.0
        # dsv4_rope_attn_factor: cancels the magnitude factor ggml applies under YaRN.
        attn_factor = 1.0 / (1.0 + 0.1 * math.log(1.0 / freq_scale)) if ext_factor else 1.0
        return RopeConfig(
            n_dims=self.rope_dims,
            base=self.compress_rope_theta,
            freq_scale=freq_scale,
            ext_factor=ext_factor,
            attn_factor=attn_factor,
            n_ctx_orig=self.rope_orig_ctx,
        )

    def to_gguf_metadata(self, context_length: int) -> dict[str, MetaValue]:
        """The ``deepseek4.*`` keys that describe these hyper-parameters, typed as llama.cpp's
        loader reads them (it rejects a key of another type), so ``from_gguf`` reads them back.

        ``context_length`` (the trained context) is not a ModelArgs field: inference never
        needs it.
        """
        u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
        values: dict[str, MetaValue] = {
            "vocab_size": MetaValue(self.vocab_size, u32),
            "context_length": MetaValue(context_length, u32),
            "embedding_length": MetaValue(self.hidden_size, u32),
            "embedding_length_out": MetaValue(self.hc_mult * self.hidden_size, u32),
            "block_count": MetaValue(self.num_layers, u32),
            "attention.head_count": MetaValue(self.num_heads, u32),
            "attention.head_count_kv": MetaValue(1, u32),  # one shared key/value head
            "attention.key_length": MetaValue(self.head_dim, u32),
            "attention.value_length": MetaValue(self.head_dim, u32),
            "attention.layer_norm_rms_epsilon": MetaValue(self.rms_norm_eps, f32),
            "attention.q_lora_rank": MetaValue(self.q_lora_rank, u32),
            "attention.output_group_count": MetaValue(self.o_groups, u32),
            "attention.output_lora_rank": MetaValue(self.o_lora_rank, u32),
            "attention.sliding_window": MetaValue(self.sliding_window, u32),
            "attention.compress_ratios": MetaValue(list(self.compress_ratios), u32),
            "attention.compress_rope_freq_base": MetaValue(self.compress_rope_theta, f32),
            "attention.indexer.head_count": MetaValue(self.index_heads, u32),
            "attention.indexer.key_length": MetaValue(self.index_head_dim, u32),
            "attention.indexer.top_k": MetaValue(self.index_topk, u32),
            "rope.dimension_count": MetaValue(self.rope_dims, u32),
            "rope.freq_base": MetaValue(self.rope_theta, f32),
            "rope.scaling.type": MetaValue(self.rope_scaling_type, GGUFValueType.STRING),
            "rope.scaling.factor": MetaValue(1.0 / self.rope_freq_scale, f32),
            "rope.scaling.original_context_length": MetaValue(self.rope_orig_ctx, u32),
            "expert_count": MetaValue(self.n_experts, u32),
            "expert_used_count": MetaValue(self.n_experts_used, u32),
            "expert_shared_count": MetaValue(self.n_shared_experts, u32),
            "expert_feed_forward_length": MetaValue(self.expert_ff, u32),
            "expert_weights_scale": MetaValue(self.expert_weights_scale, f32),
            "expert_weights_norm": MetaValue(self.expert_weights_norm, GGUFValueType.BOOL),
            "expert_gating_func": MetaValue(int(self.gating_func), u32),
            "swiglu_clamp_exp": MetaValue(list(self.swiglu_limits), f32),
            "swiglu_clamp_shexp": MetaValue(list(self.swiglu_limits_shared), f32),
            "hash_layer_count": MetaValue(self.n_hash_layers, u32),
            "hyper_connection.count": MetaValue(self.hc_mult, u32),
            "hyper_connection.sinkhorn_iterations": MetaValue(self.hc_sinkhorn_iters, u32),
            "hyper_connection.epsilon": MetaValue(self.hc_eps, f32),
        }
        return {f"{ARCH}.{name}": value for name, value in values.items()}


def tensor_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor of a deepseek4 model (without the MTP block), name -> shape in numpy order:
    [out, in] for matmul weights, [expert, out, in] for stacked experts (ggml's ne reversed).

    The loader checks each tensor against this table; exporters write exactly these tensors.
    """
    d, hc, vocab = args.hidden_size, args.hc_mult, args.vocab_size
    h, hd, q_rank = args.num_heads, args.head_dim, args.q_lora_rank
    e, f = args.n_experts, args.expert_ff
    fs = f * args.n_shared_experts
    o_rank, group_dim = args.o_lora_rank, h * hd // args.o_groups

    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (vocab, d),
        "output_hc_fn.weight": (hc, hc * d),
        "output_hc_base.weight": (hc,),
        "output_hc_scale.weight": (1,),
        "output_norm.weight": (d,),
        "output.weight": (vocab, d),
    }
    for layer in range(args.num_layers):
        p = f"blk.{layer}"
        shapes |= block_site_shapes(p, hc, d)
        shapes |= {
            f"{p}.attn_norm.weight": (d,),
            f"{p}.attn_q_a.weight": (q_rank, d),
            f"{p}.attn_q_a_norm.weight": (q_rank,),
            f"{p}.attn_q_b.weight": (h * hd, q_rank),
            f"{p}.attn_kv.weight": (hd, d),
            f"{p}.attn_kv_a_norm.weight": (hd,),
            f"{p}.attn_sinks.weight": (h,),
            # Block diagonal: one [o_lora_rank, group_dim] projection per group, stacked by rows
            # (files may also store it as [groups, o_lora_rank, group_dim]).
            f"{p}.attn_output_a.weight": (args.o_groups * o_rank, group_dim),
            f"{p}.attn_output_b.weight": (d, args.o_groups * o_rank),
        }
        ratio = args.compress_ratios[layer]
        if ratio:
            shapes |= compressor_shapes(f"{p}.attn_compressor", hidden=d, dim=hd, ratio=ratio)
        if ratio == CSA_RATIO:
            shapes |= {
                f"{p}.indexer.attn_q_b.weight": (args.index_heads * args.index_head_dim, q_rank),
                f"{p}.indexer.proj.weight": (args.index_heads, d),
            }
            shapes |= compressor_shapes(
                f"{p}.indexer_compressor", hidden=d, dim=args.index_head_dim, ratio=CSA_RATIO
            )
        shapes[f"{p}.ffn_norm.weight"] = (d,)
        hashed = layer < args.n_hash_layers
        shapes |= shared_expert_moe_shapes(
            p,
            hidden=d,
            n_experts=e,
            expert_ff=f,
            shared_ff=fs,
            hash_table=(vocab, args.n_experts_used) if hashed else None,
        )
    return shapes


# --------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------


class Attention(CompressedAttention):
    def __init__(self, args: ModelArgs, w: Weights, layer: int):
        super().__init__()
        p = f"blk.{layer}"
        h, hd = args.num_heads, args.head_dim
        self.wq_a = w.matrix(f"{p}.attn_q_a.weight")
        self.q_a_norm = RMSNorm(w.param(f"{p}.attn_q_a_norm.weight"), args.rms_norm_eps)
        self.wq_b = w.matrix(f"{p}.attn_q_b.weight")
        self.wkv = w.matrix(f"{p}.attn_kv.weight")
        self.kv_norm = RMSNorm(w.param(f"{p}.attn_kv_a_norm.weight"), args.rms_norm_eps)
        self.sinks = w.param(f"{p}.attn_sinks.weight")
        # wo_a is block diagonal: one [o_lora_rank, group_dim] projection per group of heads.
        self.wo_a = w.grouped(f"{p}.attn_output_a.weight", args.o_groups)
        self.wo_b = w.matrix(f"{p}.attn_output_b.weight")

        self.heads, self.head_dim, self.groups = h, hd, args.o_groups
        self.eps = args.rms_norm_eps
        self.window = args.sliding_window
        self.scale = 1.0 / math.sqrt(hd)
        self.rope = RoPE(args.rope_config(layer))
        self.ratio = args.compress_ratios[layer]
        self.compressor: Compressor | None = None
        self.indexer: LightningIndexer | None = None
        if self.ratio:
            comp_rope = RoPE(args.compress_rope_config())
            self.compressor = Compressor(
                w,
                f"{p}.attn_compressor",
                dim=hd,
                ratio=self.ratio,
                rope=comp_rope,
                eps=args.rms_norm_eps,
                slack=CACHE_SLACK,
            )
            if self.ratio == CSA_RATIO:
                self.indexer = LightningIndexer(
                    w,
                    p,
                    heads=args.index_heads,
                    dim=args.index_head_dim,
                    top_k=args.index_topk,
                    rope=comp_rope,
                    eps=args.rms_norm_eps,
                    slack=CACHE_SLACK,
                )

    def __call__(self, x: mx.array, pos0: int, cache: LayerCache) -> tuple[mx.array, LayerCache]:
        """A chunk (prefill): x [T, D] at positions pos0.. -> attention output [T, D] and the
        updated cache."""
        positions = np.arange(pos0, pos0 + x.shape[0])
        angles = self.rope.angles(positions)
        rows = self._project(x, angles, self.position_embeddings(positions))
        window, new_cache = self._extend(cache, rows, pos0)
        out = self._attend(rows.q, positions, window, new_cache, rows.index_q, rows.index_w)
        return self.output(out, angles), new_cache

    def tile(
        self, x: mx.array, pos0: int, cache: LayerCache, n_real: int
    ) -> tuple[mx.array, LayerCache]:
        """``__call__`` of a decode tile (see DECODE_TILE): only the first ``n_real`` rows are
        real; each attends on its own, the padding rows get zeros and stay out of the cache."""
        positions = np.arange(pos0, pos0 + x.shape[0])
        angles = self.rope.angles(positions)
        rows = self._project(x, angles, self.position_embeddings(positions), n_real)
        window, new_cache = self._extend_tile(cache, rows, pos0, n_real)
        out = self._attend_tile(
            rows.q, positions, window, new_cache, rows.index_q, rows.index_w, n_real
        )
        return self.output(out, angles, n_real), new_cache

    def batched(
        self, x: mx.array, positions: np.ndarray, caches: Sequence[LayerCache]
    ) -> tuple[mx.array, list[LayerCache]]:
        """One decode step of independent sessions: row r of x [T, D] is the next token of the
        session with cache ``caches[r]``, at ``positions[r]``; rows past ``len(caches)`` are
        padding (zeros out). The projections run once over all rows; the cache update and the
        attention run per session, exactly as that session's own one-token decode runs them."""
        rows = self._project(
            x, self.rope.angles(positions), self.position_embeddings(positions), len(caches)
        )
        outs, new_caches = [], []
        for r, cache in enumerate(caches):
            row = rows.row(r)
            window, new_cache = self._extend_tile(cache, row, int(positions[r]), 1)
            outs.append(
                self._attend_tile(
                    row.q, positions[r : r + 1], window, new_cache, row.index_q, row.index_w, 1
                )
            )
            new_caches.append(new_cache)
        outs.append(mx.zeros((x.shape[0] - len(caches), *rows.q.shape[1:]), rows.q.dtype))
        return self.output(mx.concatenate(outs), rows.angles, len(caches)), new_caches

    def _project(
        self,
        x: mx.array,
        angles: RopeAngles,
        embeddings: Sequence[mx.array],
        real_rows: int | None = None,
    ) -> ProjectedRows:
        """Everything attention computes from its input rows alone, given the rows' RoPE
        ``angles`` and the compressors' ``embeddings`` (``position_embeddings``). ``real_rows``:
        only the first rows are needed (of a tile, its real rows; ``kernels.linear``'s
        ``rows``); the others' results are unspecified."""
        comp, indexer = self.compressor, self.indexer
        embedding = iter(embeddings)
        # Every product of x, then every product of the query input qr, as one call each: one
        # primitive each in a decode tile on the CPU (``kernels.linear_many``).
        weights = [self.wq_a, self.wkv]
        if comp is not None:
            weights += [comp.wkv, comp.wgate]
        if indexer is not None:
            weights += [indexer.compressor.wkv, indexer.compressor.wgate, indexer.proj]
        products = iter(linear_many(x, weights, real_rows))
        qr = self.q_a_norm(next(products))
        rows = ProjectedRows(angles, None, self._rotated_keys(next(products), angles))
        q_products = linear_many(qr, [self.wq_b] + ([indexer.q_b] if indexer else []), real_rows)
        rows.q = self._rotated_queries(q_products[0], angles)
        if comp is not None:
            rows.comp = (next(products), next(products), next(embedding))
        if indexer is not None:
            rows.index = (next(products), next(products), next(embedding))
            rows.index_q, rows.index_w = indexer.from_products(
                q_products[1], next(products), angles
            )
        return rows

    def position_embeddings(self, positions: np.ndarray, on_host: bool = False) -> list[mx.array]:
        """The compressors' ``position_embedding`` rows at ``positions`` (attention's, then the
        indexer's; as many as the layer has compressors)."""
        compressors = (self.compressor, self.indexer and self.indexer.compressor)
        return [c.position_embedding(positions, on_host) for c in compressors if c is not None]

    def _extend(
        self, cache: LayerCache, rows: ProjectedRows, pos0: int
    ) -> tuple[mx.array, LayerCache]:
        """The raw keys up to and including those of a chunk's ``rows`` (positions pos0..),
        and the new cache."""
        window = append_rows(cache.window, rows.kv)
        # The next chunk needs the keys of the last sliding_window - 1 positions; the slack lets
        # a rejected speculative suffix be cut off.
        keep = self.window - 1 + CACHE_SLACK
        kept = window[window.shape[0] - keep :] if window.shape[0] > keep else window
        return window, self._pool(cache, LayerCache(window=kept), rows, pos0, rows.kv.shape[0])

    def _extend_tile(
        self, cache: LayerCache, rows: ProjectedRows, pos0: int, n_real: int
    ) -> tuple[mx.array, LayerCache]:
        """``_extend`` of a decode tile: only the first ``n_real`` rows enter the caches
        (padding rows would only complete compressed blocks to be cut off again, a CSA block
        every step). Its rows see no key older than sliding_window - 1 positions before the
        first of them, which the kept rows hold (sliding_window - 1 + CACHE_SLACK of them, and
        CACHE_SLACK >= DECODE_TILE)."""
        old = rows.kv[:0] if cache.window is None else cache.window
        window = grow_rows([old], [rows.kv], n_real, self.window - 1 + CACHE_SLACK)[0]
        return window, self._pool(cache, LayerCache(window=window), rows, pos0, n_real)

    def _pool(
        self, cache: LayerCache, new_cache: LayerCache, rows: ProjectedRows, pos0: int, take: int
    ) -> LayerCache:
        """``new_cache`` with the compressed rows of the blocks that the first ``take`` of
        ``rows`` (positions pos0..) complete."""
        if self.compressor is not None and rows.comp is not None:
            pooled, pending = self.compressor.pool(*rows.comp, pos0, cache.comp_pending, take)
            comp = cache.comp if pooled is None else append_rows(cache.comp, pooled)
            new_cache = replace(new_cache, comp=comp, comp_pending=pending)
        if self.indexer is not None and rows.index is not None:
            pooled, pending = self.indexer.compressor.pool(
                *rows.index, pos0, cache.index_pending, take
            )
            index = cache.index if pooled is None else append_rows(cache.index, pooled)
            new_cache = replace(new_cache, index=index, index_pending=pending)
        return new_cache

    # The pieces around the attention proper, shared with drafters that attend differently.

    def queries(self, x: mx.array, angles: RopeAngles) -> tuple[mx.array, mx.array]:
        """The low-rank query input [T, q_lora_rank] and the queries [T, H, hd] of x [T, D]."""
        qr = self.q_a_norm(linear(x, self.wq_a))
        return qr, self._rotated_queries(linear(qr, self.wq_b), angles)

    def keys(self, x: mx.array, angles: RopeAngles) -> mx.array:
        """The keys of x [T, D], which are also the values: [T, hd]."""
        return self._rotated_keys(linear(x, self.wkv), angles)

    def _rotated_queries(self, q: mx.array, angles: RopeAngles) -> mx.array:
        """The queries [T, H, hd] from the product ``wq_b qr`` [T, H * hd]."""
        nope = self.head_dim - self.rope.n_dims
        return self.rope.apply_normed(q, None, self.eps, angles, offset=nope, heads=self.heads)

    def _rotated_keys(self, kv: mx.array, angles: RopeAngles) -> mx.array:
        """The keys [T, hd] from the product ``wkv x``."""
        nope = self.head_dim - self.rope.n_dims
        norm = self.kv_norm
        return self.rope.apply_normed(kv, norm.weight, norm.eps, angles, offset=nope)

    def output(self, out: mx.array, angles: RopeAngles, real_rows: int | None = None) -> mx.array:
        """Attention results [T, H, hd] -> [T, D]: de-rotated at the query positions, then the
        grouped low-rank output projection. ``real_rows``: only the first rows are needed (of
        a decode tile, its real rows; a sharded rank then sums only those)."""
        tokens, nope = out.shape[0], self.head_dim - self.rope.n_dims
        layout = grouped_input_shape(self.wo_a, tokens)  # the rows as the projection reads them
        out = self.rope.apply(out, angles, offset=nope, inverse=True, shape=layout)
        lora = grouped_linear(out, self.wo_a, real_rows)  # [T, G * o_rank]
        return linear(lora, self.wo_b, real_rows)


class Block(CompiledBlockTiles, nn.Module):
    # The module kinds a block is made of; ``ds4mlx.distributed`` substitutes sharded ones.
    attention_class: type[Attention] = Attention
    moe_class: type[SharedExpertMoE] = SharedExpertMoE

    def __init__(self, args: ModelArgs, w: Weights, layer: int, attention: nn.Module | None = None):
        """``attention``: the module that stands in for the layer's own ``attention_class``
        (a drafter stage's attention over whole blocks), called as that one is."""
        super().__init__()
        p = f"blk.{layer}"

        self.hc_attn, self.hc_ffn = load_block_sites(
            w,
            p,
            hc=args.hc_mult,
            sinkhorn_iters=args.hc_sinkhorn_iters,
            hc_eps=args.hc_eps,
            norm_eps=args.rms_norm_eps,
        )
        self.attn_norm = RMSNorm(w.param(f"{p}.attn_norm.weight"), args.rms_norm_eps)
        self.ffn_norm = RMSNorm(w.param(f"{p}.ffn_norm.weight"), args.rms_norm_eps)
        self.attn = self.attention_class(args, w, layer) if attention is None else attention
        # Hash layers route by token id through a fixed table (no selection bias).
        self.moe = self.moe_class(
            w,
            p,
            n_used=args.n_experts_used,
            gating=args.gating_func,
            normalize=args.expert_weights_norm,
            weights_scale=args.expert_weights_scale,
            swiglu_limit=args.swiglu_limits[layer],
            swiglu_limit_shared=args.swiglu_limits_shared[layer],
            hash_routed=layer < args.n_hash_layers,
        )

        self._compile_tiles()

    def new_cache(self) -> LayerCache:
        return LayerCache()

    @property
    def _compiles_tiles(self) -> bool:
        """Decode tiles run compiled around the attention proper (``_compiled_tile``) where the
        block's pieces are this module's own (not a sharded model's or a drafter's stand-ins)
        and its experts are resident (a streamed store reads the routing on the host)."""
        return self._own_pieces and self.moe.compiles_tiles

    @property
    def _compiles_streamed_tiles(self) -> bool:
        """Decode tiles over streamed experts run compiled in three parts (``_streamed_tile``)
        around the attention proper and the host's read of the routing."""
        return self._own_pieces and self.moe.streams_experts

    @property
    def _own_pieces(self) -> bool:
        return type(self.attn) is Attention and type(self.moe) is SharedExpertMoE

    def __call__(
        self, x: mx.array, tokens: mx.array, pos0: int, cache: LayerCache
    ) -> tuple[mx.array, LayerCache]:
        """A chunk (prefill): the streams x [T, hc, D] of ``tokens`` at positions pos0.. ->
        the streams after the block, and its new cache."""
        h, post, comb = self.hc_attn(x, self.attn_norm)
        h, cache = self.attn(h, pos0, cache)
        return self._ffn(hc_expand(h, x, post, comb), tokens), cache

    def tile(
        self, x: mx.array, tokens: mx.array, pos0: int, cache: LayerCache, n_real: int
    ) -> tuple[mx.array, LayerCache]:
        """``__call__`` of a decode tile whose first ``n_real`` rows are real (DECODE_TILE)."""
        if self._compiles_tiles:
            return self._compiled_tile(x, tokens, pos0, cache, n_real)
        if self._compiles_streamed_tiles:
            return self._streamed_tile(x, tokens, pos0, cache, n_real)
        h, post, comb = self.hc_attn(x, self.attn_norm, n_real)
        h, cache = self.attn.tile(h, pos0, cache, n_real)
        return self._tile_ffn(hc_expand(h, x, post, comb, rows=n_real), tokens, n_real), cache

    def batched(
        self, x: mx.array, tokens: mx.array, positions: np.ndarray, caches: Sequence[LayerCache]
    ) -> tuple[mx.array, list[LayerCache]]:
        """A decode tile whose row r is the next token of the session with ``caches[r]``."""
        real = len(caches)
        h, post, comb = self.hc_attn(x, self.attn_norm, real)
        h, new_caches = self.attn.batched(h, positions, caches)
        return self._tile_ffn(hc_expand(h, x, post, comb, rows=real), tokens, real), new_caches

    def _ffn(self, x: mx.array, tokens: mx.array) -> mx.array:
        """The block's second half: its FFN between the mHC site's collapse and expansion."""
        h, post, comb = self.hc_ffn(x, self.ffn_norm)
        return hc_expand(self.moe(h, tokens), x, post, comb)

    def _tile_ffn(self, x: mx.array, tokens: mx.array, n_real: int) -> mx.array:
        """``_ffn`` of a decode tile whose first ``n_real`` rows are real. In inference on the
        GPU the streams come out flat, [T, hc * D], as the next block's site and the head read
        them (``hc_expand``'s ``flat``): no view between blocks."""
        h, post, comb = self.hc_ffn(x, self.ffn_norm, n_real)
        return hc_expand(self.moe.tile(h, tokens, n_real), x, post, comb, flat=True, rows=n_real)


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class Model(TiledModel):
    args_class = ModelArgs
    tensor_shapes = staticmethod(tensor_shapes)
    block_class: type[Block] = Block  # ``ds4mlx.distributed`` substitutes a sharded one

    def __init__(self, args: ModelArgs, w: Weights):
        super().__init__()
        self.args = args
        self.embed = w.matrix("token_embd.weight")
        self.blocks = [self.block_class(args, w, i) for i in range(args.num_layers)]
        self.hc_head = HyperHead(
            w.matrix("output_hc_fn.weight"),
            w.param("output_hc_base.weight"),
            w.param("output_hc_scale.weight"),
            hc_eps=args.hc_eps,
            norm_eps=args.rms_norm_eps,
        )
        self.output_norm = RMSNorm(w.param("output_norm.weight"), args.rms_norm_eps)
        self.output = w.matrix("output.weight")
        self._head_tiles = CompiledTiles(self._tile_head_graph)

    def truncate(self, state: ModelState, pos: int) -> None:
        """Roll ``state`` back to just after position ``pos - 1`` (at most ROLLBACK_DEPTH
        positions back): how a speculative verify drops its rejected rows without recomputing
        the accepted ones."""
        if not 0 <= state.pos - pos <= ROLLBACK_DEPTH:
            raise ValueError(
                f"cannot roll back from {state.pos} to {pos} tokens "
                f"(at most {ROLLBACK_DEPTH} positions)"
            )
        ratios = self.args.compress_ratios
        state.layers = [
            cache.truncate(state.pos, pos, ratios[i]) for i, cache in enumerate(state.layers)
        ]
        state.pos = pos

    def _layers(
        self, x: mx.array, tokens: mx.array, pos0: int, caches: list[Any]
    ) -> Iterator[mx.array]:
        for i, block in enumerate(self.blocks):
            x, caches[i] = block(x, tokens, pos0, caches[i])
            yield x

    def _embed(self, tokens: mx.array) -> mx.array:
        # In a decode tile on the GPU one launch makes the streams, flat as the first site
        # reads them (``kernels.embed_streams``).
        streams = kernels.embed_streams(self.embed, tokens, self.args.hc_mult)
        return super()._embed(tokens) if streams is None else streams

    def _tile_layers(
        self, x: mx.array, tokens: mx.array, pos0: int, caches: list[Any], n_real: int
    ) -> Iterator[mx.array]:
        hc = self.args.hc_mult
        for i, block in enumerate(self.blocks):
            x, caches[i] = block.tile(x, tokens, pos0, caches[i], n_real)
            # The next block reads flat streams as they come; the caller sees [T, hc, D] (a
            # view, made only where the caller uses it: the last block's, a captured layer's).
            yield x if x.ndim == 3 else x.reshape(x.shape[0], hc, -1)

    def _tile_head(self, x: mx.array, n_real: int) -> tuple[mx.array, mx.array]:
        return self._head_tiles.get(n_real)(x)

    def _tile_context(self) -> AbstractContextManager[Any]:
        # Decode tiles are inference only: the kernels need not be differentiable there.
        return kernels.inference()

    def forward_batch(self, tokens: Sequence[int], states: Sequence[ModelState]) -> mx.array:
        """Logits [N, vocab] of one decode step of N independent sequences: ``tokens[i]``
        continues ``states[i]``, which it advances by one position.

        Everything row-independent (embeddings, mHC mixing, projections, experts, the head) runs
        once over a tile of up to ``max_invariant_rows`` sessions; attention, with its
        compressor and indexer, runs per session on its own caches. Each row is bit-identical to
        that sequence's own ``forward`` of its one token: the tile has the shape of the decode
        tile, and the routed experts stay in the row count where their per-row results are
        invariant. Larger batches run tile after tile.
        """
        if len(tokens) != len(states):
            raise ValueError(f"{len(tokens)} tokens for {len(states)} states")
        if len({id(state) for state in states}) != len(states):
            raise ValueError("a state appears twice in one batched step")
        if not states:
            raise ValueError("forward_batch() needs at least one state")
        step = self.max_invariant_rows
        logits = [
            self._decode_tile(tokens[i : i + step], states[i : i + step])
            for i in range(0, len(states), step)
        ]
        return logits[0] if len(logits) == 1 else mx.concatenate(logits)

    def _decode_tile(self, tokens: Sequence[int], states: Sequence[ModelState]) -> mx.array:
        n = len(states)
        ids = pad_to_tile(mx.array([int(t) for t in tokens], dtype=mx.int32))
        # Padding rows sit at position 0: their results are discarded and touch no cache.
        positions = np.array([state.pos for state in states] + [0] * (DECODE_TILE - n))
        layers: list[list[LayerCache]] = []
        with kernels.inference():
            x = self._embed(ids)
            for i, block in enumerate(self.blocks):
                x, caches = block.batched(x, ids, positions, [state.layers[i] for state in states])
                layers.append(caches)
            logits = self._head_tiles.get(n)(x)[1][:n]
        for r, state in enumerate(states):
            state.layers = [caches[r] for caches in layers]
            state.pos += 1
        mx.eval(logits, *(a for state in states for a in state.arrays()))
        return logits

    def head_input(self, x: mx.array, real_rows: int | None = None) -> mx.array:
        return self.hc_head(x, real_rows, self.output_norm)

    def _tile_head_graph(self, x: mx.array, n_real: int) -> tuple[mx.array, mx.array]:
        """``head`` of a decode tile's first ``n_real`` rows (compiled: ``_tile_head``)."""
        return self.head(x, n_real)
