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
not emulated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, overload

from ds4mlx.gguf import GGUFError, GGUFFile
from ds4mlx.kernels import QuantizedWeight, Weight, linear, take_rows
from ds4mlx.models.attention import sink_attention, sliding_window_mask
from ds4mlx.models.cache import ModelState, append_rows
from ds4mlx.models.mhc import HyperConnection, HyperHead, hc_collapse, hc_expand, hc_mean
from ds4mlx.models.moe import GatingFunc, RoutedExperts, gate_probs, route, swiglu
from ds4mlx.models.norms import RMSNorm, rms_norm
from ds4mlx.models.rope import RoPE, RopeAngles, RopeConfig

import mlx.core as mx
import mlx.nn as nn
import numpy as np

ARCH = "deepseek4"
CSA_RATIO = 4
HCA_RATIO = 128
# Attention score elements materialised per query block; longer inputs are processed in blocks.
_SCORE_BUDGET = 1 << 24


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
        def key(name: str) -> str:
            return f"{ARCH}.{name}"

        def req(name: str) -> Any:
            return gguf.require(key(name))

        def opt(name: str, default: Any) -> Any:
            return gguf.get(key(name), default)

        block_count = int(req("block_count"))
        n_nextn = int(opt("nextn_predict_layers", 0))
        # As llama.cpp: the MTP block only counts when its tensors are in the file.
        if n_nextn and not gguf.has_tensor(f"blk.{block_count - n_nextn}.nextn.eh_proj.weight"):
            n_nextn = 0

        def per_layer(name: str, value: Any) -> tuple[float, ...]:
            values = list(value) if isinstance(value, (list, tuple)) else [value] * block_count
            if len(values) < block_count:
                raise GGUFError(
                    f"{gguf.path}: metadata '{key(name)}' has {len(values)} entries, "
                    f"expected {block_count}"
                )
            return tuple(float(v) for v in values)

        def first(value: Any) -> Any:
            return value[0] if isinstance(value, (list, tuple)) else value

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
        value_dim = int(opt("attention.value_length", head_dim))
        if value_dim != head_dim:
            raise GGUFError(
                f"{gguf.path}: deepseek4 needs value_length == key_length, got {value_dim} "
                f"and {head_dim}"
            )

        factor = float(opt("rope.scaling.factor", 0.0))
        tokens = gguf.get("tokenizer.ggml.tokens")
        vocab = opt("vocab_size", None)
        if vocab is None:
            vocab = len(tokens) if tokens is not None else gguf.tensor_shape("token_embd.weight")[0]
        return cls(
            vocab_size=int(vocab),
            hidden_size=int(req("embedding_length")),
            num_layers=block_count - n_nextn,
            num_heads=int(first(req("attention.head_count"))),
            head_dim=head_dim,
            rope_dims=int(req("rope.dimension_count")),
            q_lora_rank=int(req("attention.q_lora_rank")),
            o_groups=int(req("attention.output_group_count")),
            o_lora_rank=int(req("attention.output_lora_rank")),
            sliding_window=int(req("attention.sliding_window")),
            compress_ratios=ratios[:block_count],
            rms_norm_eps=float(req("attention.layer_norm_rms_epsilon")),
            rope_theta=float(opt("rope.freq_base", 10000.0)),
            compress_rope_theta=float(req("attention.compress_rope_freq_base")),
            rope_scaling_type=str(opt("rope.scaling.type", "linear")),
            rope_freq_scale=1.0 if factor == 0.0 else 1.0 / factor,
            rope_orig_ctx=int(opt("rope.scaling.original_context_length",
                                  opt("context_length", 0))),
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


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


class _Weights:
    """Reads GGUF tensors, checking each shape (numpy order) against ModelArgs.

    Matmul weights come from ``GGUFFile.load_weight`` (whatever ``kernels`` takes); the small
    tensors used elementwise (norms, biases, sinks, mixes) are float32 arrays.
    """

    def __init__(self, gguf: GGUFFile, mode: str | None):
        self.gguf = gguf
        self.mode = mode  # GGUFFile.load_weight's mode: "f32", "native" or None (its default)

    def _check(self, name: str, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
        actual = self.gguf.tensor_shape(name)
        if actual not in shapes:
            want = " or ".join(str(list(s)) for s in shapes)
            raise GGUFError(
                f"{self.gguf.path}: tensor '{name}' has shape {list(actual)}, expected {want}"
            )
        return actual

    def matrix(self, name: str, shape: tuple[int, ...]) -> Weight:
        self._check(name, (shape,))
        return self.gguf.load_weight(name, self.mode)

    def param(self, name: str, shape: tuple[int, ...]) -> mx.array:
        self._check(name, (shape,))
        return mx.array(self.gguf.dequantize(name))

    def ints(self, name: str, shape: tuple[int, ...]) -> mx.array:
        self._check(name, (shape,))
        return mx.array(np.asarray(self.gguf.raw(name)).astype(np.int32).reshape(shape))

    def grouped(self, name: str, groups: int, rows: int, cols: int) -> Weight:
        """A block-diagonal weight as a stack [groups, rows, cols]; files store it either so or
        flattened to [groups * rows, cols]."""
        if self._check(name, ((groups, rows, cols), (groups * rows, cols))) == (groups, rows, cols):
            return self.gguf.load_weight(name, self.mode)
        return _split_rows(self.gguf.load_weight(name, self.mode), groups)


def _split_rows(w: Weight, groups: int) -> Weight:
    """View a [groups * rows, ...] weight as [groups, rows, ...] (any weight kind)."""

    def split(a: mx.array) -> mx.array:
        return a.reshape(groups, -1, *a.shape[1:])

    if isinstance(w, mx.array):
        return split(w)
    if isinstance(w, QuantizedWeight):
        biases = None if w.biases is None else split(w.biases)
        return replace(w, packed=split(w.packed), scales=split(w.scales), biases=biases)
    return replace(w, data=split(w.data))


# --------------------------------------------------------------------------------------------
# Per-layer caches
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PendingRows:
    """Compressor rows (kv and gate scores, [n, width]) not yet consumed by a completed block."""

    kv: mx.array
    score: mx.array


@dataclass(frozen=True)
class LayerCache:
    """One layer's cache. ``window``: the last raw keys; ``comp``/``index``: compressed attention
    keys and lightning-indexer keys of every completed block, with their compressors' rows."""

    window: mx.array | None = None
    comp: mx.array | None = None
    comp_pending: PendingRows | None = None
    index: mx.array | None = None
    index_pending: PendingRows | None = None


# --------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------


class Compressor(nn.Module):
    """Pools each block of ``ratio`` positions into one row (llama.cpp ``build_*_compressed_kv``).

    Every position contributes a kv row and a gate-score row (``wgate x + ape[pos % ratio]``);
    a block's row is the per-channel softmax(score)-weighted sum of its rows, RMS-normed and
    RoPE'd at the block's first position. With ``overlap`` (CSA) rows are twice as wide: the first
    half feeds the next block, the second half the block itself.
    """

    def __init__(self, w: _Weights, prefix: str, *, dim: int, hidden: int, ratio: int,
                 rope: RoPE, eps: float):
        super().__init__()
        self.overlap = ratio == CSA_RATIO
        width = (2 if self.overlap else 1) * dim
        self.wkv = w.matrix(f"{prefix}_kv.weight", (width, hidden))
        self.wgate = w.matrix(f"{prefix}_gate.weight", (width, hidden))
        self.ape = w.param(f"{prefix}_ape.weight", (ratio, width))
        self.norm = w.param(f"{prefix}_norm.weight", (dim,))
        self.dim = dim
        self.ratio = ratio
        self.rope = rope
        self.eps = eps

    def pending_start(self, pos: int) -> int:
        """First position whose rows must be kept once ``pos`` positions have been seen."""
        block = pos // self.ratio - (1 if self.overlap else 0)
        return max(0, block * self.ratio)

    def __call__(
        self, x: mx.array, pos0: int, pending: PendingRows | None
    ) -> tuple[mx.array | None, PendingRows]:
        """Rows of the blocks completed by x (positions pos0...), and the rows to keep."""
        r, dim, end = self.ratio, self.dim, pos0 + x.shape[0]
        positions = np.arange(pos0, end)
        kv = linear(x, self.wkv)
        score = linear(x, self.wgate) + self.ape[mx.array(positions % r)]
        if pending is not None:
            kv = append_rows(pending.kv, kv)
            score = append_rows(pending.score, score)
        start = self.pending_start(pos0)  # position of row 0 of kv / score
        keep = self.pending_start(end) - start
        kept = PendingRows(kv[keep:], score[keep:])

        b0, b1 = pos0 // r, end // r  # blocks completed in this chunk: [b0, b1)
        if b1 == b0:
            return None, kept
        n = b1 - b0
        lo, hi = b0 * r - start, b1 * r - start
        if self.overlap:
            prev_kv, prev_score = kv[lo - r : hi - r, :dim], score[lo - r : hi - r, :dim]
            if b0 == 0:
                # Block 0 has no previous block: pool against a zero row with a -inf gate.
                prev_kv = mx.concatenate([mx.zeros((r, dim)), kv[: hi - r, :dim]])
                prev_score = mx.concatenate(
                    [mx.full((r, dim), -mx.inf), score[: hi - r, :dim]]
                )
            values = mx.concatenate(
                [prev_kv.reshape(n, r, dim), kv[lo:hi, dim:].reshape(n, r, dim)], axis=1
            )
            scores = mx.concatenate(
                [prev_score.reshape(n, r, dim), score[lo:hi, dim:].reshape(n, r, dim)], axis=1
            )
        else:
            values = kv[lo:hi].reshape(n, r, dim)
            scores = score[lo:hi].reshape(n, r, dim)
        pooled = mx.sum(values * mx.softmax(scores, axis=1, precise=True), axis=1)
        pooled = rms_norm(pooled, self.norm, self.eps)
        angles = self.rope.angles(np.arange(b0, b1) * r)
        return self.rope.apply(pooled, angles, offset=dim - self.rope.n_dims), kept


class LightningIndexer(nn.Module):
    """Scores compressed blocks per query and keeps the top-k (CSA layers)."""

    def __init__(self, args: ModelArgs, w: _Weights, layer: int, rope: RoPE):
        super().__init__()
        p = f"blk.{layer}"
        heads, dim = args.index_heads, args.index_head_dim
        self.q_b = w.matrix(f"{p}.indexer.attn_q_b.weight", (heads * dim, args.q_lora_rank))
        self.proj = w.matrix(f"{p}.indexer.proj.weight", (heads, args.hidden_size))
        self.compressor = Compressor(
            w, f"{p}.indexer_compressor", dim=dim, hidden=args.hidden_size, ratio=CSA_RATIO,
            rope=rope, eps=args.rms_norm_eps,
        )
        self.heads, self.dim, self.top_k = heads, dim, args.index_topk
        self.rope = rope

    def queries(self, qr: mx.array, x: mx.array, angles: RopeAngles) -> tuple[mx.array, mx.array]:
        """Indexer queries [T, heads, dim] and head weights [T, heads]."""
        q = linear(qr, self.q_b).reshape(qr.shape[0], self.heads, self.dim)
        q = self.rope.apply(q, angles, offset=self.dim - self.rope.n_dims)
        weights = linear(x, self.proj) * (1.0 / math.sqrt(self.dim * self.heads))
        return q, weights

    def select(self, q: mx.array, weights: mx.array, keys: mx.array,
               visible: mx.array) -> mx.array:
        """Which visible blocks each query attends: bool [T, N] (at most top_k per row)."""
        if keys.shape[0] <= self.top_k:
            return visible
        scores = mx.maximum(mx.matmul(q, keys.T), 0.0)  # [T, heads, N]
        scores = mx.sum(scores * weights[..., None], axis=1)
        scores = mx.where(visible, scores, -mx.inf)
        top = mx.argpartition(-scores, self.top_k - 1, axis=-1)[:, : self.top_k]
        chosen = mx.put_along_axis(mx.zeros(visible.shape, mx.bool_), top, mx.array(True), axis=-1)
        return chosen & visible


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, w: _Weights, layer: int):
        super().__init__()
        p = f"blk.{layer}"
        d, h, hd = args.hidden_size, args.num_heads, args.head_dim
        if h % args.o_groups:
            raise GGUFError(f"{w.gguf.path}: {h} heads do not split into {args.o_groups} groups")
        group_dim = h * hd // args.o_groups
        self.wq_a = w.matrix(f"{p}.attn_q_a.weight", (args.q_lora_rank, d))
        self.q_a_norm = RMSNorm(w.param(f"{p}.attn_q_a_norm.weight", (args.q_lora_rank,)),
                                args.rms_norm_eps)
        self.wq_b = w.matrix(f"{p}.attn_q_b.weight", (h * hd, args.q_lora_rank))
        self.wkv = w.matrix(f"{p}.attn_kv.weight", (hd, d))
        self.kv_norm = RMSNorm(w.param(f"{p}.attn_kv_a_norm.weight", (hd,)), args.rms_norm_eps)
        self.sinks = w.param(f"{p}.attn_sinks.weight", (h,))
        # wo_a is block diagonal: one [o_lora_rank, group_dim] projection per group of heads.
        self.wo_a = w.grouped(f"{p}.attn_output_a.weight", args.o_groups, args.o_lora_rank,
                              group_dim)
        self.wo_b = w.matrix(f"{p}.attn_output_b.weight", (d, args.o_groups * args.o_lora_rank))

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
                w, f"{p}.attn_compressor", dim=hd, hidden=d, ratio=self.ratio, rope=comp_rope,
                eps=args.rms_norm_eps,
            )
            if self.ratio == CSA_RATIO:
                self.indexer = LightningIndexer(args, w, layer, comp_rope)

    def __call__(self, x: mx.array, pos0: int, cache: LayerCache) -> tuple[mx.array, LayerCache]:
        """x [T, D] at positions pos0.. -> attention output [T, D] and the updated cache."""
        tokens, nope = x.shape[0], self.head_dim - self.rope.n_dims
        positions = np.arange(pos0, pos0 + tokens)
        angles = self.rope.angles(positions)

        qr = self.q_a_norm(linear(x, self.wq_a))
        q = linear(qr, self.wq_b).reshape(tokens, self.heads, self.head_dim)
        q = self.rope.apply(rms_norm(q, None, self.eps), angles, offset=nope)
        kv = self.rope.apply(self.kv_norm(linear(x, self.wkv)), angles, offset=nope)

        window = append_rows(cache.window, kv)
        # The next chunk needs the keys of the last sliding_window - 1 positions.
        new_cache = LayerCache(window=window[max(0, window.shape[0] - (self.window - 1)) :])
        index_q = index_w = None
        if self.compressor is not None:
            rows, pending = self.compressor(x, pos0, cache.comp_pending)
            comp = cache.comp if rows is None else append_rows(cache.comp, rows)
            new_cache = replace(new_cache, comp=comp, comp_pending=pending)
        if self.indexer is not None:
            rows, pending = self.indexer.compressor(x, pos0, cache.index_pending)
            index = cache.index if rows is None else append_rows(cache.index, rows)
            new_cache = replace(new_cache, index=index, index_pending=pending)
            index_q, index_w = self.indexer.queries(qr, x, angles)

        out = self._attend(q, positions, window, new_cache, index_q, index_w)
        out = self.rope.apply(out, angles, offset=nope, inverse=True)
        grouped = mx.swapaxes(out.reshape(tokens, self.groups, -1), 0, 1)  # [G, T, group_dim]
        lora = mx.swapaxes(linear(grouped, self.wo_a), 0, 1)  # [T, G, o_lora_rank]
        return linear(lora.reshape(tokens, -1), self.wo_b), new_cache

    def _attend(self, q: mx.array, positions: np.ndarray, window: mx.array, cache: LayerCache,
                index_q: mx.array | None, index_w: mx.array | None) -> mx.array:
        """Sink attention of q [T, H, hd] over the raw window plus the visible compressed rows.

        ``window`` holds the raw keys of the positions just before and including the queries';
        ``cache`` the compressed rows of every block completed so far.
        """
        tokens = q.shape[0]
        window_start = int(positions[-1]) + 1 - window.shape[0]
        n_comp = 0 if cache.comp is None else cache.comp.shape[0]
        # Query blocks bound the [heads, rows, keys] score memory of long prefills.
        n_keys = min(window.shape[0], tokens + self.window) + n_comp
        per_row = n_keys * (self.heads + (self.indexer.heads if self.indexer else 0))
        step = max(1, _SCORE_BUDGET // per_row)
        outs = []
        for t0 in range(0, tokens, step):
            q_pos = positions[t0 : t0 + step]
            k0 = max(0, int(q_pos[0]) - self.window + 1 - window_start)
            k1 = int(q_pos[-1]) + 1 - window_start
            keys = window[k0:k1]
            mask = mx.array(sliding_window_mask(q_pos, np.arange(k0, k1) + window_start,
                                                self.window))
            # A block is visible to the query that completes it and to all later ones.
            n_vis = (int(q_pos[-1]) + 1) // self.ratio if n_comp else 0
            if n_vis:
                visible = mx.array(np.arange(n_vis) < ((q_pos + 1) // self.ratio)[:, None])
                if self.indexer is not None:
                    t1 = t0 + len(q_pos)
                    visible = self.indexer.select(index_q[t0:t1], index_w[t0:t1],
                                                  cache.index[:n_vis], visible)
                keys = mx.concatenate([keys, cache.comp[:n_vis]])
                mask = mx.concatenate([mask, visible], axis=1)
            outs.append(sink_attention(q[t0 : t0 + step], keys, mask, self.sinks, self.scale))
        return outs[0] if len(outs) == 1 else mx.concatenate(outs)


class MoE(nn.Module):
    """Routed experts plus the shared expert (llama.cpp ``build_moe_ffn`` + ``build_ffn``)."""

    def __init__(self, args: ModelArgs, w: _Weights, layer: int):
        super().__init__()
        p = f"blk.{layer}"
        d, e, f = args.hidden_size, args.n_experts, args.expert_ff
        fs = f * args.n_shared_experts
        self.router = w.matrix(f"{p}.ffn_gate_inp.weight", (e, d))
        self.hash_routes: mx.array | None = None
        self.bias: mx.array | None = None
        if layer < args.n_hash_layers:
            # Hash layers route by token id through a fixed table; no selection bias.
            self.hash_routes = w.ints(f"{p}.ffn_gate_tid2eid.weight",
                                      (args.vocab_size, args.n_experts_used))
        else:
            self.bias = w.param(f"{p}.exp_probs_b.bias", (e,))
        self.experts = RoutedExperts(
            w.matrix(f"{p}.ffn_gate_exps.weight", (e, f, d)),
            w.matrix(f"{p}.ffn_up_exps.weight", (e, f, d)),
            w.matrix(f"{p}.ffn_down_exps.weight", (e, d, f)),
            swiglu_limit=args.swiglu_limits[layer],
        )
        self.shared_gate = w.matrix(f"{p}.ffn_gate_shexp.weight", (fs, d))
        self.shared_up = w.matrix(f"{p}.ffn_up_shexp.weight", (fs, d))
        self.shared_down = w.matrix(f"{p}.ffn_down_shexp.weight", (d, fs))
        self.shared_limit = args.swiglu_limits_shared[layer]
        self.n_used = args.n_experts_used
        self.gating = args.gating_func
        self.normalize = args.expert_weights_norm
        self.weights_scale = args.expert_weights_scale

    def __call__(self, x: mx.array, tokens: mx.array) -> mx.array:
        probs = gate_probs(linear(x, self.router), self.gating)
        selected = None if self.hash_routes is None else self.hash_routes[tokens]
        indices, weights = route(
            probs, self.n_used, func=self.gating, bias=self.bias, selected=selected,
            normalize=self.normalize, scale=self.weights_scale,
        )
        routed = self.experts(x, indices, weights)
        hidden = swiglu(linear(x, self.shared_gate), linear(x, self.shared_up), self.shared_limit)
        return routed + linear(hidden, self.shared_down)


class Block(nn.Module):
    def __init__(self, args: ModelArgs, w: _Weights, layer: int):
        super().__init__()
        p = f"blk.{layer}"
        d, hc = args.hidden_size, args.hc_mult
        mix = (2 + hc) * hc

        def hyper(site: str) -> HyperConnection:
            return HyperConnection(
                w.matrix(f"{p}.hc_{site}_fn.weight", (mix, hc * d)),
                w.param(f"{p}.hc_{site}_base.weight", (mix,)),
                w.param(f"{p}.hc_{site}_scale.weight", (3,)),
                hc=hc, sinkhorn_iters=args.hc_sinkhorn_iters, hc_eps=args.hc_eps,
                norm_eps=args.rms_norm_eps,
            )

        self.hc_attn = hyper("attn")
        self.hc_ffn = hyper("ffn")
        self.attn_norm = RMSNorm(w.param(f"{p}.attn_norm.weight", (d,)), args.rms_norm_eps)
        self.ffn_norm = RMSNorm(w.param(f"{p}.ffn_norm.weight", (d,)), args.rms_norm_eps)
        self.attn = Attention(args, w, layer)
        self.moe = MoE(args, w, layer)

    def __call__(self, x: mx.array, tokens: mx.array, pos0: int,
                 cache: LayerCache) -> tuple[mx.array, LayerCache]:
        pre, post, comb = self.hc_attn(x)
        h, cache = self.attn(self.attn_norm(hc_collapse(x, pre)), pos0, cache)
        x = hc_expand(h, x, post, comb)
        pre, post, comb = self.hc_ffn(x)
        h = self.moe(self.ffn_norm(hc_collapse(x, pre)), tokens)
        return hc_expand(h, x, post, comb), cache


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardOutput:
    """What ``forward(..., return_hidden=True)`` returns.

    ``layers[i]``: mean over the mHC streams of the hidden state after layer i, [T, D], for each
    requested layer (llama.cpp's ``layer_inp[i + 1]``). ``head_input``: the streams after the last
    layer, [T, hc, D] (before ``hc_head``; llama.cpp's ``h_nextn``, what an MTP block consumes).
    ``final_hidden``: after ``hc_head`` and the output norm, [T, D] (the head's input).
    """

    logits: mx.array
    layers: dict[int, mx.array]
    head_input: mx.array
    final_hidden: mx.array


class Model(nn.Module):
    def __init__(self, args: ModelArgs, w: _Weights):
        super().__init__()
        d, hc = args.hidden_size, args.hc_mult
        self.args = args
        self.embed = w.matrix("token_embd.weight", (args.vocab_size, d))
        self.blocks = [Block(args, w, i) for i in range(args.num_layers)]
        self.hc_head = HyperHead(
            w.matrix("output_hc_fn.weight", (hc, hc * d)),
            w.param("output_hc_base.weight", (hc,)),
            w.param("output_hc_scale.weight", (1,)),
            hc_eps=args.hc_eps, norm_eps=args.rms_norm_eps,
        )
        self.output_norm = RMSNorm(w.param("output_norm.weight", (d,)), args.rms_norm_eps)
        self.output = w.matrix("output.weight", (args.vocab_size, d))

    @classmethod
    def from_gguf(cls, gguf_file: GGUFFile, weights_dtype: str | None = None) -> Model:
        """Build the model from an opened GGUF file.

        ``weights_dtype`` ("f32" or "native") is how matmul weights are held (see
        ``ds4mlx.gguf.quants``); None leaves the choice to ``GGUFFile.load_weight``.
        """
        return cls(ModelArgs.from_gguf(gguf_file), _Weights(gguf_file, weights_dtype))

    def new_state(self) -> ModelState:
        return ModelState([LayerCache() for _ in self.blocks])

    @overload
    def forward(self, tokens: mx.array, state: ModelState, *,
                capture_layers: Sequence[int] = (),
                return_hidden: Literal[False] = False) -> mx.array: ...

    @overload
    def forward(self, tokens: mx.array, state: ModelState, *,
                capture_layers: Sequence[int] = (),
                return_hidden: Literal[True]) -> ForwardOutput: ...

    def forward(self, tokens: mx.array, state: ModelState, *,
                capture_layers: Sequence[int] = (),
                return_hidden: bool = False) -> mx.array | ForwardOutput:
        """Logits [T, vocab] of int32 ``tokens`` [T] continuing ``state``, which it advances.

        With ``return_hidden`` a ``ForwardOutput`` also carries the hidden states of
        ``capture_layers`` and of the head.
        """
        if capture_layers and not return_hidden:
            raise ValueError("capture_layers needs return_hidden=True")
        capture = set(capture_layers)
        bad = sorted(i for i in capture if not 0 <= i < len(self.blocks))
        if bad:
            raise ValueError(f"capture_layers {bad} out of range [0, {len(self.blocks)})")
        tokens = tokens.astype(mx.int32).reshape(-1)
        pos0 = state.pos
        h = take_rows(self.embed, tokens).astype(mx.float32)
        x = mx.broadcast_to(h[:, None, :], (h.shape[0], self.args.hc_mult, h.shape[1]))
        caches = list(state.layers)
        captured: dict[int, mx.array] = {}
        for i, block in enumerate(self.blocks):
            x, caches[i] = block(x, tokens, pos0, caches[i])
            if i in capture:
                captured[i] = hc_mean(x)
        final = self.output_norm(self.hc_head(x))
        logits = linear(final, self.output)

        state.layers, state.pos = caches, pos0 + tokens.shape[0]
        # One evaluation for the outputs and the new caches keeps the caches' graphs short.
        mx.eval(logits, *captured.values(), x, final, *state.arrays())
        if not return_hidden:
            return logits
        return ForwardOutput(logits, captured, x, final)
