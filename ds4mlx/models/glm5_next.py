"""GLM-5.3-Flash: llama.cpp architecture ``glm5-next``.

Follows llama.cpp (commit 0c1e570) ``src/models/glm5-next.cpp``, its hybrid memory
(``llama-memory-hybrid-idx.cpp``: recurrent state, K-only MLA cache, k-pool indexer cache) and
the CPU ops it runs by default (``ggml_gated_delta_net``, ``ggml_lightning_indexer``, the
fused mHC ops). Per layer:

* mHC: ``hc`` residual streams collapsed before, and re-expanded after, the token mixer and the
  FFN (the same mixes as DeepSeek-V4, ``models.mhc``). The head is the plain mean of the
  streams, then the output norm: no ``hc_head`` tensors.
* Token mixer, by layer: ``head_count_kv == 0`` marks a KDA layer, otherwise nope-only MLA with
  a DSA indexer.
* KDA (Kimi Delta Attention, recurrent; ``models.kda``): a gated delta-rule recurrence over
  conv'd, L2-normalised q/k/v with a per-channel decay, its output normed, gated, projected.
* MLA without RoPE (``models.sparse_mla``): ``q = wq_b norm(wq_a x)``, the key/value is the
  normed latent ``norm(wkv_a x)`` (the only thing cached); queries are absorbed through ``wk_b``,
  the attended latent is expanded through ``wv_b``; scale ``1/sqrt(key_length_mla)``.
* DSA k-pool indexer (``models.pool_indexer``): a query attends the positions of the pools of
  ``kpool`` positions it scores highest, plus (``kpool_select_tail``) its own incomplete pool.
  Layers with ``indexer.types == 0`` reuse the selection of the last full indexer layer before
  them.
* FFN: dense SwiGLU in the leading ``leading_dense_block_count`` layers, else routed experts
  (sigmoid gating by default, selection bias) plus the shared expert.
* NextN (MTP): ``blk.{n_layer}`` holds one more MLA + FFN block without mHC, and
  ``nextn.{eh_proj,enorm,hnorm}`` (+ optional ``embed_tokens``, ``shared_head_{norm,head}``). See
  ``NextNPredictor``.

Notes where llama.cpp's semantics are the contract:

* ``attn_q/k/v.bias`` and every ``.scale`` / ``.input_scale`` companion are loaded by llama.cpp
  but never used by this graph; they are ignored here.
* A query that sees no position (only without ``kpool_select_tail``) gets a zero output, as
  ggml's flash attention gives it.

All math is float32; llama.cpp's default F16 K cache (latents and indexer rows) and F16
flash-attention queries are not emulated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ds4mlx import kernels
from ds4mlx.gguf import GGUFFile, MetaValue
from ds4mlx.kernels import hc_expand, linear, take_rows
from ds4mlx.models.base import DECODE_TILE, VERIFY_ROWS, TiledModel, pad_to_tile
from ds4mlx.models.cache import ModelState
from ds4mlx.models.kda import KDA, KDACache
from ds4mlx.models.metadata import ArchMetadata, first
from ds4mlx.models.mhc import block_site_shapes, hc_mean, load_block_sites
from ds4mlx.models.moe import GatingFunc, SharedExpertMoE, SwiGLU, shared_expert_moe_shapes
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.pool_indexer import PoolIndexer, Selection, TileSelection
from ds4mlx.models.sparse_mla import MLACache, SparseMLA
from ds4mlx.models.tiles import CompiledTiles
from ds4mlx.models.weights import Shape, Weights

import mlx.core as mx
import mlx.nn as nn
from gguf import GGUFValueType

ARCH = "glm5-next"
# Positions a state can be rolled back by (``Model.truncate``), counting only positions fed in
# decode tiles (see ``models.base.DECODE_TILE``; the KDA recurrence, the indexer's pooling and
# selection and MLA attention run row by row on a tile's real rows): a speculative verify pass
# has at most VERIFY_ROWS rows, and its rejected ones are cut off. KDA layers keep a recurrent
# state per position for this (only of positions fed in decode tiles: a longer chunk keeps its
# final state alone, which bounds the memory a long prefill costs).
TILE_ROLLBACK = VERIFY_ROWS


# --------------------------------------------------------------------------------------------
# Hyper-parameters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelArgs:
    """Hyper-parameters from the GGUF metadata (keys ``glm5-next.*``), as llama.cpp reads them.

    Per-layer tuples cover every block in the file, the NextN block(s) included.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int  # main layers, without the NextN block(s)
    nextn_layers: int
    num_heads: int
    recurrent: tuple[bool, ...]
    q_lora_rank: int
    kv_lora_rank: int
    qk_head_dim: int
    v_head_dim: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    kpool: int
    kpool_select_tail: bool
    index_full: tuple[bool, ...]
    kda_head_dim: int
    conv_kernel: int
    kda_gate_lower_bound: float
    ff: int
    n_dense_layers: int
    n_experts: int
    n_experts_used: int
    n_shared_experts: int
    expert_ff: tuple[int, ...]
    expert_weights_scale: float
    expert_weights_norm: bool
    gating_func: GatingFunc
    swiglu_limits: tuple[float, ...]
    swiglu_limits_shared: tuple[float, ...]
    rms_norm_eps: float
    norm_eps: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ModelArgs:
        meta = ArchMetadata(gguf, ARCH)
        key, req, opt, fail = meta.key, meta.req, meta.opt, meta.error
        block_count = int(req("block_count"))
        nextn = int(opt("nextn_predict_layers", 0))
        if not 0 <= nextn < block_count:
            raise fail(f"'{key('nextn_predict_layers')}' is {nextn} for {block_count} blocks")
        n_layer = block_count - nextn

        def per_layer(name: str, default: Any = None, count: int = block_count) -> tuple[Any, ...]:
            """A per-layer key (required unless it has a default)."""
            return meta.per_layer(name, req(name) if default is None else opt(name, default), count)

        kv_heads = per_layer("attention.head_count_kv")
        recurrent = tuple(int(h) == 0 for h in kv_heads)
        if any(recurrent[n_layer:]):
            raise fail("the NextN block must be an MLA layer (head_count_kv > 0)")

        rope_dims = int(req("rope.dimension_count"))
        if rope_dims != 0:
            raise fail(f"glm5-next MLA is nope-only, but rope.dimension_count is {rope_dims}")

        kpool = int(req("attention.indexer.kpool"))
        topk = int(req("attention.indexer.top_k"))
        if kpool < 2 or topk % kpool:
            raise fail(f"indexer kpool {kpool} must be > 1 and divide top_k {topk}")
        index_full = tuple(bool(int(t)) for t in per_layer("attention.indexer.types", 1, n_layer))
        attn_layers = [i for i in range(n_layer) if not recurrent[i]]
        if attn_layers and not index_full[attn_layers[0]]:
            raise fail(
                f"MLA layer {attn_layers[0]} shares an indexer, but no full indexer "
                "layer comes before it"
            )

        gating = int(opt("expert_gating_func", 0)) or int(GatingFunc.SIGMOID)
        if gating not in set(GatingFunc):
            raise fail(f"'{key('expert_gating_func')}' is {gating}, not a known gating function")

        clamp_exp = per_layer("swiglu_clamp_exp", 0.0)
        clamp_shexp = per_layer("swiglu_clamp_shexp", clamp_exp)

        hc = int(req("hyper_connection.count"))
        if hc != 4:
            raise fail(f"mHC with {hc} streams is not supported (llama.cpp requires 4)")

        return cls(
            vocab_size=meta.vocab_size(),
            hidden_size=int(req("embedding_length")),
            num_layers=n_layer,
            nextn_layers=nextn,
            num_heads=int(first(req("attention.head_count"))),
            recurrent=recurrent,
            q_lora_rank=int(req("attention.q_lora_rank")),
            kv_lora_rank=int(req("attention.kv_lora_rank")),
            qk_head_dim=int(req("attention.key_length_mla")),
            v_head_dim=int(req("attention.value_length_mla")),
            index_heads=int(req("attention.indexer.head_count")),
            index_head_dim=int(req("attention.indexer.key_length")),
            index_topk=topk,
            kpool=kpool,
            kpool_select_tail=bool(opt("attention.indexer.kpool_select_tail", True)),
            index_full=index_full,
            kda_head_dim=int(req("kda.head_dim")),
            conv_kernel=int(req("ssm.conv_kernel")),
            kda_gate_lower_bound=float(opt("kda.gate_lower_bound", -math.inf)),
            ff=int(first(req("feed_forward_length"))),
            n_dense_layers=int(opt("leading_dense_block_count", 0)),
            n_experts=int(opt("expert_count", 0)),
            n_experts_used=int(first(opt("expert_used_count", 0))),
            n_shared_experts=int(req("expert_shared_count")),
            expert_ff=tuple(int(f) for f in per_layer("expert_feed_forward_length")),
            expert_weights_scale=float(opt("expert_weights_scale", 0.0)),
            expert_weights_norm=bool(opt("expert_weights_norm", False)),
            gating_func=GatingFunc(gating),
            swiglu_limits=tuple(float(v) for v in clamp_exp),
            swiglu_limits_shared=tuple(float(v) for v in clamp_shexp),
            rms_norm_eps=float(req("attention.layer_norm_rms_epsilon")),
            norm_eps=float(opt("attention.layer_norm_epsilon", 0.0)),
            hc_mult=hc,
            hc_sinkhorn_iters=int(req("hyper_connection.sinkhorn_iterations")),
            hc_eps=float(req("hyper_connection.epsilon")),
        )

    def has_full_indexer(self, layer: int) -> bool:
        """The NextN block always has its own indexer."""
        return layer >= self.num_layers or self.index_full[layer]

    def to_gguf_metadata(self, context_length: int) -> dict[str, MetaValue]:
        """The ``glm5-next.*`` keys that describe these hyper-parameters, typed as llama.cpp's
        loader reads them (it rejects a key of another type), so ``from_gguf`` reads them back.

        ``context_length`` (the trained context) is not a ModelArgs field: inference never
        needs it. MLA's generic key/value lengths are the latent width, as llama.cpp's converter
        writes them.
        """
        u32, f32, boolean = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL
        blocks = self.num_layers + self.nextn_layers
        values: dict[str, MetaValue] = {
            "vocab_size": MetaValue(self.vocab_size, u32),
            "context_length": MetaValue(context_length, u32),
            "embedding_length": MetaValue(self.hidden_size, u32),
            "block_count": MetaValue(blocks, u32),
            "nextn_predict_layers": MetaValue(self.nextn_layers, u32),
            "leading_dense_block_count": MetaValue(self.n_dense_layers, u32),
            "feed_forward_length": MetaValue(self.ff, u32),
            "expert_feed_forward_length": MetaValue(list(self.expert_ff), u32),
            "expert_count": MetaValue(self.n_experts, u32),
            "expert_used_count": MetaValue(self.n_experts_used, u32),
            "expert_shared_count": MetaValue(self.n_shared_experts, u32),
            "expert_weights_scale": MetaValue(self.expert_weights_scale, f32),
            "expert_weights_norm": MetaValue(self.expert_weights_norm, boolean),
            "expert_gating_func": MetaValue(int(self.gating_func), u32),
            "swiglu_clamp_exp": MetaValue(list(self.swiglu_limits), f32),
            "swiglu_clamp_shexp": MetaValue(list(self.swiglu_limits_shared), f32),
            "attention.head_count": MetaValue(self.num_heads, u32),
            "attention.head_count_kv": MetaValue([0 if r else 1 for r in self.recurrent], u32),
            "attention.key_length": MetaValue(self.kv_lora_rank, u32),
            "attention.value_length": MetaValue(self.kv_lora_rank, u32),
            "attention.key_length_mla": MetaValue(self.qk_head_dim, u32),
            "attention.value_length_mla": MetaValue(self.v_head_dim, u32),
            "attention.q_lora_rank": MetaValue(self.q_lora_rank, u32),
            "attention.kv_lora_rank": MetaValue(self.kv_lora_rank, u32),
            "attention.layer_norm_rms_epsilon": MetaValue(self.rms_norm_eps, f32),
            "attention.layer_norm_epsilon": MetaValue(self.norm_eps, f32),
            "attention.indexer.head_count": MetaValue(self.index_heads, u32),
            "attention.indexer.key_length": MetaValue(self.index_head_dim, u32),
            "attention.indexer.top_k": MetaValue(self.index_topk, u32),
            "attention.indexer.kpool": MetaValue(self.kpool, u32),
            "attention.indexer.kpool_select_tail": MetaValue(self.kpool_select_tail, boolean),
            "attention.indexer.types": MetaValue([int(t) for t in self.index_full], u32),
            "rope.dimension_count": MetaValue(0, u32),
            "ssm.conv_kernel": MetaValue(self.conv_kernel, u32),
            "kda.head_dim": MetaValue(self.kda_head_dim, u32),
            "hyper_connection.count": MetaValue(self.hc_mult, u32),
            "hyper_connection.sinkhorn_iterations": MetaValue(self.hc_sinkhorn_iters, u32),
            "hyper_connection.epsilon": MetaValue(self.hc_eps, f32),
        }
        if self.kda_gate_lower_bound > -math.inf:
            values["kda.gate_lower_bound"] = MetaValue(self.kda_gate_lower_bound, f32)
        return {f"{ARCH}.{name}": value for name, value in values.items()}


def tensor_shapes(args: ModelArgs) -> dict[str, Shape]:
    """Every tensor a glm5-next model may have, name -> shape in numpy order ([out, in] for
    matmul weights, [expert, out, in] for stacked experts: ggml's ne reversed).

    The NextN block's tensors are listed too; they are read only when the file has them.
    """
    d, hc, vocab = args.hidden_size, args.hc_mult, args.vocab_size
    h = args.num_heads
    hd, inner = args.kda_head_dim, args.kda_head_dim * args.num_heads
    q_rank, kv_rank = args.q_lora_rank, args.kv_lora_rank
    ih, idim = args.index_heads, args.index_head_dim

    shapes: dict[str, Shape] = {
        "token_embd.weight": (vocab, d),
        "output_norm.weight": (d,),
        "output.weight": (vocab, d),
    }
    for layer in range(args.num_layers + args.nextn_layers):
        p = f"blk.{layer}"
        shapes |= {f"{p}.attn_norm.weight": (d,), f"{p}.ffn_norm.weight": (d,)}
        if layer < args.num_layers:
            shapes |= block_site_shapes(p, hc, d)
        else:
            shapes |= {
                f"{p}.nextn.eh_proj.weight": (d, 2 * d),
                f"{p}.nextn.enorm.weight": (d,),
                f"{p}.nextn.hnorm.weight": (d,),
                f"{p}.nextn.embed_tokens.weight": (vocab, d),
                f"{p}.nextn.shared_head_head.weight": (vocab, d),
                f"{p}.nextn.shared_head_norm.weight": (d,),
            }
        if args.recurrent[layer]:
            shapes |= {f"{p}.ssm_conv1d_{x}.weight": (inner, 1, args.conv_kernel) for x in "qkv"}
            shapes |= {f"{p}.attn_{x}.weight": (inner, d) for x in "qkv"}
            shapes |= {
                f"{p}.ssm_f_a.weight": (hd, d),
                f"{p}.ssm_f_b.weight": (inner, hd),
                f"{p}.ssm_beta.weight": (h, d),
                f"{p}.ssm_a": (h,),
                f"{p}.ssm_dt.bias": (inner,),
                f"{p}.ssm_g_a.weight": (hd, d),
                f"{p}.ssm_g_b.weight": (inner, hd),
                f"{p}.ssm_norm.weight": (hd,),
                f"{p}.attn_output.weight": (d, inner),
            }
        else:
            shapes |= {
                f"{p}.attn_q_a_norm.weight": (q_rank,),
                f"{p}.attn_kv_a_norm.weight": (kv_rank,),
                f"{p}.attn_q_a.weight": (q_rank, d),
                f"{p}.attn_q_b.weight": (h * args.qk_head_dim, q_rank),
                f"{p}.attn_kv_a_mqa.weight": (kv_rank, d),
                f"{p}.attn_k_b.weight": (h, kv_rank, args.qk_head_dim),
                f"{p}.attn_v_b.weight": (h, args.v_head_dim, kv_rank),
                f"{p}.attn_output.weight": (d, h * args.v_head_dim),
            }
            if args.has_full_indexer(layer):
                shapes |= {
                    f"{p}.indexer.k_norm.weight": (idim,),
                    f"{p}.indexer.k_norm.bias": (idim,),
                    f"{p}.indexer.proj.weight": (ih, d),
                    f"{p}.indexer.attn_k.weight": (idim, d),
                    f"{p}.indexer.attn_q_b.weight": (ih * idim, q_rank),
                    f"{p}.indexer_compressor_gate.weight": (idim, d),
                    f"{p}.indexer_compressor_ape.weight": (args.kpool, idim),
                }
        if layer < args.n_dense_layers:
            shapes |= {
                f"{p}.ffn_gate.weight": (args.ff, d),
                f"{p}.ffn_up.weight": (args.ff, d),
                f"{p}.ffn_down.weight": (d, args.ff),
            }
        else:
            f = args.expert_ff[layer]
            shapes |= shared_expert_moe_shapes(
                p,
                hidden=d,
                n_experts=args.n_experts,
                expert_ff=f,
                shared_ff=f * args.n_shared_experts,
            )
    return shapes


# --------------------------------------------------------------------------------------------
# MLA over the k-pool indexer's selection, and its cache (frozen: a forward pass returns new
# ones, so ModelState.copy() is shallow)
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------------


def _mla(args: ModelArgs, w: Weights, layer: int) -> SparseMLA:
    """The layer's MLA, with its own indexer where the layer has a full one."""
    indexer = None
    if args.has_full_indexer(layer):
        indexer = PoolIndexer(
            w,
            f"blk.{layer}",
            heads=args.index_heads,
            dim=args.index_head_dim,
            kpool=args.kpool,
            top_k=args.index_topk,
            select_tail=args.kpool_select_tail,
            eps=args.norm_eps,
            rollback=TILE_ROLLBACK,
        )
    return SparseMLA(
        w,
        f"blk.{layer}",
        heads=args.num_heads,
        head_dim=args.qk_head_dim,
        eps=args.rms_norm_eps,
        indexer=indexer,
        tail=args.kpool_select_tail,
    )


def _ffn(args: ModelArgs, w: Weights, layer: int) -> SwiGLU | SharedExpertMoE:
    """The layer's FFN: dense in the leading layers, routed + shared experts after."""
    p = f"blk.{layer}"
    if layer < args.n_dense_layers:
        return SwiGLU(
            w.matrix(f"{p}.ffn_gate.weight"),
            w.matrix(f"{p}.ffn_up.weight"),
            w.matrix(f"{p}.ffn_down.weight"),
            args.swiglu_limits_shared[layer],
        )
    return SharedExpertMoE(
        w,
        p,
        n_used=args.n_experts_used,
        gating=args.gating_func,
        normalize=args.expert_weights_norm,
        weights_scale=args.expert_weights_scale,
        swiglu_limit=args.swiglu_limits[layer],
        swiglu_limit_shared=args.swiglu_limits_shared[layer],
    )


def _ffn_tile(ffn: SharedExpertMoE | SwiGLU, h: mx.array, n_real: int) -> mx.array:
    """A block's FFN over a decode tile's normed rows h, the first ``n_real`` real."""
    if isinstance(ffn, SharedExpertMoE):
        return ffn.tile(h, None, n_real)
    return ffn(h, n_real)


def _tiles_compile(ffn: SharedExpertMoE | SwiGLU) -> bool:
    """Whether a block's decode tiles may be compiled: not around streamed experts, whose
    store reads the routing on the host."""
    return not isinstance(ffn, SharedExpertMoE) or ffn.compiles_tiles


class Block(nn.Module):
    """A main layer: mHC around a KDA or MLA mixer and around the FFN."""

    def __init__(self, args: ModelArgs, w: Weights, layer: int):
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
        self.mixer: KDA | SparseMLA
        if args.recurrent[layer]:
            self.mixer = KDA(
                w,
                p,
                heads=args.num_heads,
                head_dim=args.kda_head_dim,
                conv_kernel=args.conv_kernel,
                gate_lower_bound=args.kda_gate_lower_bound,
                eps=args.rms_norm_eps,
                rollback=TILE_ROLLBACK,
            )
        else:
            self.mixer = _mla(args, w, layer)
        self.ffn = _ffn(args, w, layer)
        self._recurrent_tiles = CompiledTiles(self._tile_recurrent)
        self._before_attention = CompiledTiles(self._tile_before_attention)
        self._after_attention = CompiledTiles(self._tile_after_attention)

    def new_cache(self) -> KDACache | MLACache:
        return KDACache() if isinstance(self.mixer, KDA) else MLACache()

    def __call__(
        self, x: mx.array, pos0: int, cache: Any, selection: Selection | None
    ) -> tuple[mx.array, Any, Selection | None]:
        """A chunk (prefill): the streams x [T, hc, D] at positions pos0 .. -> the streams
        after the block, its new cache and the selection an MLA layer without an indexer uses."""
        h, post, comb = self.hc_attn(x, self.attn_norm)
        if isinstance(self.mixer, KDA):
            h, cache = self.mixer(h, cache)
        else:
            h, cache, selection = self.mixer(h, pos0, cache, selection)
        x = hc_expand(h, x, post, comb)
        h, post, comb = self.hc_ffn(x, self.ffn_norm)
        return hc_expand(self.ffn(h), x, post, comb), cache, selection

    def tile(
        self, x: mx.array, pos0: int, cache: Any, selection: TileSelection | None, n_real: int
    ) -> tuple[mx.array, Any, TileSelection | None]:
        """``__call__`` of a decode tile whose first ``n_real`` rows are real (DECODE_TILE).

        Compiled (models.tiles) where the experts are resident (a streamed store reads the
        routing on the host): a KDA layer's whole tile once its cache has its steady shapes,
        an MLA layer's around the attention proper, whose shapes grow with the context. The
        same operations either way, so the same bits."""
        resident = _tiles_compile(self.ffn)
        if isinstance(self.mixer, KDA):
            compiled = resident and self.mixer.steady(cache)
            run = self._recurrent_tiles.get(n_real, compiled)
            x, conv, ssm, current = run(x, *self.mixer.tile_inputs(cache, n_real))
            return x, cache.advanced(conv, ssm, current, n_real), selection
        post, comb, *projected = self._before_attention.get(n_real, resident)(x)
        out, cache, selection = self.mixer.attend_tile(projected, pos0, cache, selection, n_real)
        return self._after_attention.get(n_real, resident)(out, x, post, comb), cache, selection

    def _tile_recurrent(
        self,
        x: mx.array,
        conv: mx.array,
        ring: mx.array,
        current: mx.array,
        slots: mx.array,
        n_real: int,
    ) -> list[mx.array]:
        """A KDA layer's tile (``KDA.tile``'s arguments after x): the streams after the block,
        the new conv rows, the ring with the tile's states in their slots and the last state."""
        h, post, comb = self.hc_attn(x, self.attn_norm, n_real)
        h, conv, ring, current = self.mixer.tile(h, conv, ring, current, slots, n_real)
        x = hc_expand(h, x, post, comb, flat=True, rows=n_real)
        return [self._tile_ffn(x, n_real), conv, ring, current]

    def _tile_before_attention(self, x: mx.array, n_real: int) -> list[mx.array]:
        """An MLA layer's tile up to its attention: the mHC site's post and comb and the
        projections of its normed input (``SparseMLA.project_tile``)."""
        h, post, comb = self.hc_attn(x, self.attn_norm, n_real)
        return [post, comb, *self.mixer.project_tile(h, n_real)]

    def _tile_after_attention(
        self, out: mx.array, x: mx.array, post: mx.array, comb: mx.array, n_real: int
    ) -> mx.array:
        """An MLA layer's tile after its attention: output projection, mHC and FFN."""
        x = hc_expand(self.mixer.output_tile(out, n_real), x, post, comb, flat=True, rows=n_real)
        return self._tile_ffn(x, n_real)

    def _tile_ffn(self, x: mx.array, n_real: int) -> mx.array:
        h, post, comb = self.hc_ffn(x, self.ffn_norm, n_real)
        return hc_expand(_ffn_tile(self.ffn, h, n_real), x, post, comb, rows=n_real)


class NextNPredictor(nn.Module):
    """GLM's built-in MTP head: the NextN block ``blk.{n_layer}``.

    llama.cpp 0c1e570 loads these tensors but has no glm5-next MTP graph yet; this follows its
    MTP graph for the sibling architecture ``glm-dsa`` (GLM-5.2), with glm5-next's own DSA layer
    (it always has a full indexer) and no mHC (the block has no ``hc_*`` tensors):

        x = eh_proj([enorm(embed(token_{t+1})); hnorm(h_t)])
        x = x + attn(attn_norm(x));  x = x + ffn(ffn_norm(x))
        h' = shared_head_norm(x);  logits = shared_head_head(h')

    where ``h_t`` is the main model's final hidden state at t (``ForwardOutput.final_hidden``:
    after the stream mean and the output norm), and ``embed`` / ``shared_head_norm`` /
    ``shared_head_head`` fall back to ``token_embd`` / ``output_norm`` / ``output``. The logits
    at row t predict token t + 2; ``h'`` can seed a further draft step. The block keeps its own
    MLA and indexer cache, row t at position t.
    """

    def __init__(self, args: ModelArgs, w: Weights, main: Model):
        super().__init__()
        layer = args.num_layers
        p = f"blk.{layer}.nextn"

        def optional(name: str, fallback: Any, read: Any) -> Any:
            return read(f"{p}.{name}.weight") if w.has(f"{p}.{name}.weight") else fallback

        self.eh_proj = w.matrix(f"{p}.eh_proj.weight")
        self.enorm = RMSNorm(w.param(f"{p}.enorm.weight"), args.rms_norm_eps)
        self.hnorm = RMSNorm(w.param(f"{p}.hnorm.weight"), args.rms_norm_eps)
        self.embed = optional("embed_tokens", main.embed, w.matrix)
        head_norm = optional("shared_head_norm", None, w.param)
        self.head_norm = (
            main.output_norm if head_norm is None else RMSNorm(head_norm, args.rms_norm_eps)
        )
        self.head = optional("shared_head_head", main.output, w.matrix)
        self.attn_norm = RMSNorm(w.param(f"blk.{layer}.attn_norm.weight"), args.rms_norm_eps)
        self.ffn_norm = RMSNorm(w.param(f"blk.{layer}.ffn_norm.weight"), args.rms_norm_eps)
        self.attn = _mla(args, w, layer)
        self.ffn = _ffn(args, w, layer)
        self._before_attention = CompiledTiles(self._tile_before_attention)
        self._after_attention = CompiledTiles(self._tile_after_attention)

    def __call__(
        self, hidden: mx.array, next_tokens: mx.array, state: ModelState, *, evaluate: bool = True
    ) -> mx.array:
        """hidden [T, D] at positions state.pos .., next_tokens [T] -> the block's normed output
        [T, D] (``logits`` of it predict the tokens t + 2); advances ``state``. ``evaluate=False``
        leaves the result and the cache unevaluated (training)."""
        e = self.enorm(take_rows(self.embed, next_tokens).astype(mx.float32))
        x = linear(mx.concatenate([e, self.hnorm(hidden)], axis=-1), self.eh_proj)
        h, cache, _ = self.attn(self.attn_norm(x), state.pos, state.layers[0], None)
        x = x + h
        x = x + self.ffn(self.ffn_norm(x))
        out = self.head_norm(x)
        state.layers, state.pos = [cache], state.pos + hidden.shape[0]
        if evaluate:
            mx.eval(out, *state.arrays())
        return out

    def tile(self, hidden: mx.array, next_tokens: mx.array, state: ModelState) -> mx.array:
        """``__call__`` (inference) of fewer than ``DECODE_TILE`` rows, a drafting cycle's,
        as a fixed-shape decode tile: compiled around the attention as the trunk's MLA layers
        (the chunk path's masked attention and uncompiled graph cost most of a cycle's verify
        pass). Its rows equal the chunk path's up to float rounding."""
        n_real = hidden.shape[0]
        hidden = mx.pad(hidden, ((0, DECODE_TILE - n_real), (0, 0)))
        resident = _tiles_compile(self.ffn)
        x, *projected = self._before_attention.get(n_real, resident)(
            hidden, pad_to_tile(next_tokens)
        )
        out, cache, _ = self.attn.attend_tile(projected, state.pos, state.layers[0], None, n_real)
        out = self._after_attention.get(n_real, resident)(out, x)
        state.layers, state.pos = [cache], state.pos + n_real
        return out[:n_real]

    def _tile_before_attention(
        self, hidden: mx.array, next_tokens: mx.array, n_real: int
    ) -> list[mx.array]:
        e = self.enorm(take_rows(self.embed, next_tokens).astype(mx.float32))
        x = linear(mx.concatenate([e, self.hnorm(hidden)], axis=-1), self.eh_proj, n_real)
        return [x, *self.attn.project_tile(self.attn_norm(x), n_real)]

    def _tile_after_attention(self, out: mx.array, x: mx.array, n_real: int) -> mx.array:
        x = x + self.attn.output_tile(out, n_real)
        return self.head_norm(x + _ffn_tile(self.ffn, self.ffn_norm(x), n_real))

    def logits(self, out: mx.array) -> mx.array:
        """The shared head over the block's output rows: [T, vocab]."""
        return linear(out, self.head)


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class Model(TiledModel):
    args_class = ModelArgs
    tensor_shapes = staticmethod(tensor_shapes)

    def __init__(self, args: ModelArgs, w: Weights):
        super().__init__()
        self.args = args
        self.embed = w.matrix("token_embd.weight")
        self.blocks = [Block(args, w, i) for i in range(args.num_layers)]
        self.output_norm = RMSNorm(w.param("output_norm.weight"), args.rms_norm_eps)
        self.output = w.matrix("output.weight")
        has_nextn = args.nextn_layers and w.has(f"blk.{args.num_layers}.nextn.eh_proj.weight")
        self.mtp = NextNPredictor(args, w, self) if has_nextn else None

    def head_input(self, x: mx.array, real_rows: int | None = None) -> mx.array:
        return self.output_norm(hc_mean(x))  # every row: the mean of its streams is cheap

    def truncate(self, state: ModelState, pos: int) -> None:
        """Roll ``state`` back to just after position ``pos - 1``, without recomputing anything:
        how a speculative verify drops its rejected rows. At most TILE_ROLLBACK positions, and
        only over positions fed in decode tiles (chunks of fewer than DECODE_TILE tokens): a KDA
        layer keeps no per-position states of a longer chunk."""
        cut = state.pos - pos
        limit = min([TILE_ROLLBACK] + [c.rollback for c in state.layers if isinstance(c, KDACache)])
        if not 0 <= cut <= limit:
            raise ValueError(
                f"cannot roll back from {state.pos} to {pos} tokens (at most "
                f"{limit} positions here: the recurrent state is kept for up to "
                f"{TILE_ROLLBACK} positions fed in chunks of under {DECODE_TILE} "
                "tokens)"
            )
        state.layers = [
            c.truncate(cut) if isinstance(c, KDACache) else c.truncate(pos, self.args.kpool)
            for c in state.layers
        ]
        state.pos = pos

    def new_mtp_state(self) -> ModelState:
        """An empty cache for ``mtp_logits`` (the NextN block's MLA + indexer)."""
        if self.mtp is None:
            raise ValueError("this model file has no NextN (MTP) block")
        return ModelState([MLACache()])

    def mtp_logits(
        self,
        hidden: mx.array,
        next_tokens: mx.array,
        mtp_state: ModelState,
        *,
        last_only: bool = False,
        evaluate: bool = True,
        tiled: bool = False,
    ) -> mx.array:
        """Draft logits [T, vocab] of tokens t + 2 from the main model's ``final_hidden`` rows
        ``hidden`` [T, D] at t and the tokens at t + 1; advances ``mtp_state``.

        ``last_only``: the last row's logits alone, [1, vocab] (a drafter's next proposal; the
        head over every row of a long prompt would cost T x vocab for nothing).
        ``evaluate=False`` leaves everything unevaluated (training, or a drafter that queues
        the evaluation). ``tiled``: inference, so that fewer than ``DECODE_TILE`` rows run as a
        compiled decode tile (``NextNPredictor.tile``).
        """
        if self.mtp is None:
            raise ValueError("this model file has no NextN (MTP) block")
        tokens = next_tokens.astype(mx.int32).reshape(-1)
        if tiled and tokens.shape[0] < DECODE_TILE:
            out = self.mtp.tile(hidden, tokens, mtp_state)
        else:
            out = self.mtp(hidden, tokens, mtp_state, evaluate=False)
        logits = self.mtp.logits(out[-1:] if last_only else out)
        if evaluate:
            mx.eval(logits, *mtp_state.arrays())
        return logits

    def _layers(
        self, x: mx.array, tokens: mx.array, pos0: int, caches: list[Any]
    ) -> Iterator[mx.array]:
        selection: Selection | None = None
        for i, block in enumerate(self.blocks):
            x, caches[i], selection = block(x, pos0, caches[i], selection)
            yield x

    def _tile_context(self) -> AbstractContextManager[Any]:
        # Decode tiles are inference only: the kernels need not be differentiable there.
        return kernels.inference()

    def _tile_layers(
        self, x: mx.array, tokens: mx.array, pos0: int, caches: list[Any], n_real: int
    ) -> Iterator[mx.array]:
        selection: TileSelection | None = None
        for i, block in enumerate(self.blocks):
            x, caches[i], selection = block.tile(x, pos0, caches[i], selection, n_real)
            yield x
