"""DSpark: DeepSeek's block drafter for DeepSeek-V4-Flash, loaded from its support GGUF.

The drafter proposes a block of up to ``block_size`` tokens in one pass, as ds4 and llama.cpp
run it (llama.cpp ``src/models/dflash.cpp``, ``graph_dsv4``):

* Context. For every committed target row, the stream means of the target's hidden states after
  the layers ``target_layers`` are concatenated, projected (``main_proj``) and RMS-normed
  (``main_norm``). Each stage turns that into keys (its own ``attn_kv`` and ``attn_kv_a_norm``,
  RoPE at the row's position) and keeps the last ``sliding_window`` of them: its context ring.
* Block. The input is the last committed token (the anchor, at position p) followed by
  ``block_size - 1`` noise tokens at p + 1, ...; embedded with the target's token embedding and
  copied to the mHC streams, it runs through ``stage_count`` DeepSeek-V4 blocks whose attention
  sees the stage's whole ring plus the whole block (non-causal, with the attention sinks).
* Head. ``hc_head``, the drafter's norm and the target's output head give row i's logits for the
  token at p + i + 1. The Markov head adds ``markov_w2 . markov_w1[prev]`` (prev: the anchor for
  row 0, then the previous row's pick), so the block is chained greedily row by row; the
  confidence head scores row i as ``sigmoid(conf_proj . [h_i; markov_w1[prev]] + bias)`` with
  h_i the collapsed hidden state before the norm. The speculative loop cuts a draft at the first
  row under ``--dspark-confidence``.

One difference from llama.cpp: its draft cache masks ring rows per query with the sliding window,
while here (as in ds4) every block row sees the whole ring.

Two file layouts hold the same model (canonical names here are llama.cpp's):

* ds4 (``general.architecture = deepseek4-dspark``): keys ``dspark.block_size``,
  ``dspark.markov_rank``, ``dspark.noise_token_id``, ``dspark.target_layer_ids`` (0-based: the
  output of layer i, ``ForwardOutput.layers[i]``), ``dspark.stage_count``; stage tensors
  ``mtp.{s}.*`` named like the target's ``blk.{i}.*``; ``mtp.0.main_proj`` / ``main_norm``; the
  last stage holds ``norm``, ``hc_head_{fn,base,scale}``, ``markov_head.markov_w{1,2}`` and
  ``confidence_head.proj`` (all with the ``.weight`` suffix; an optional ``.bias``).
* llama.cpp (``general.architecture = dflash``): ``dflash.*`` hyper-parameters with
  ``dflash.block_count`` stages, ``dflash.block_size``, ``dflash.target_layers`` (1-based: the
  *input* of layer t, so t - 1 here), the noise token as ``tokenizer.ggml.mask_token_id``; tensors
  ``blk.{s}.*``, ``fc``, ``enc.output_norm``, ``output_norm``, ``output_hc_*``, ``markov_w1``,
  ``markov_w2``, ``conf_proj`` (81 for the real model).

Stage hyper-parameters are the target's (ds4 hard-codes the real model's; every tensor shape is
checked against them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ds4mlx.gguf import GGUFError, GGUFFile, MetaValue, open_gguf
from ds4mlx.kernels import Weight, linear, take_rows
from ds4mlx.models.attention import sink_attention
from ds4mlx.models.deepseek4 import Attention, Block, ModelArgs
from ds4mlx.models.mhc import HyperHead
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.weights import ArrayWeights, GGUFWeights
from ds4mlx.speculation.drafter import Draft, TargetRows
from ds4mlx.speculation.support_gguf import (
    RenamedWeights,
    block_shapes,
    check_target,
    identity_metadata,
    require_arch,
    stage_args,
    tokenizer_metadata,
    write_support_gguf,
)

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import GGUFValueType

if TYPE_CHECKING:
    from ds4mlx.api import LoadedModel

ARCH_DS4 = "deepseek4-dspark"
ARCH_LLAMA = "dflash"
LAYOUTS = {ARCH_DS4: "ds4's DSpark support file", ARCH_LLAMA: "llama.cpp's DSpark drafter"}
# The widest block accepted: one verify pass checks at most this many drafted rows.
MAX_BLOCK_SIZE = 16

# Canonical (llama.cpp) names of the tensors outside the stages.
MAIN_PROJ = "fc.weight"
MAIN_NORM = "enc.output_norm.weight"
NORM = "output_norm.weight"
HC_HEAD_FN = "output_hc_fn.weight"
HC_HEAD_BASE = "output_hc_base.weight"
HC_HEAD_SCALE = "output_hc_scale.weight"
MARKOV_W1 = "markov_w1.weight"
MARKOV_W2 = "markov_w2.weight"
CONF_PROJ = "conf_proj.weight"
CONF_BIAS = "conf_proj.bias"


@dataclass(frozen=True)
class DSparkConfig:
    block_size: int
    noise_token_id: int
    #: Target layers whose outputs are tapped (``ForwardOutput.layers`` indices), in order.
    target_layers: tuple[int, ...]
    stage_count: int
    #: Rank of the Markov head; 0 when the file has none (plain DFlash-style drafts).
    markov_rank: int
    #: Whether the file has a confidence head (it needs the Markov head's ``markov_w1``).
    confidence: bool


def ds4_name(name: str, stage_count: int) -> str:
    """ds4's name for the tensor llama.cpp calls ``name``."""
    if name.startswith("blk."):
        return "mtp." + name.removeprefix("blk.")
    last = f"mtp.{stage_count - 1}"
    return {
        MAIN_PROJ: "mtp.0.main_proj.weight",
        MAIN_NORM: "mtp.0.main_norm.weight",
        NORM: f"{last}.norm.weight",
        HC_HEAD_FN: f"{last}.hc_head_fn.weight",
        HC_HEAD_BASE: f"{last}.hc_head_base.weight",
        HC_HEAD_SCALE: f"{last}.hc_head_scale.weight",
        MARKOV_W1: f"{last}.markov_head.markov_w1.weight",
        MARKOV_W2: f"{last}.markov_head.markov_w2.weight",
        CONF_PROJ: f"{last}.confidence_head.proj.weight",
        CONF_BIAS: f"{last}.confidence_head.proj.bias",
    }[name]


def tensor_shapes(args: ModelArgs, config: DSparkConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a DSpark drafter for a target with ``args``, canonical name -> shape
    (``CONF_BIAS`` is optional)."""
    d, hc, vocab, rank = args.hidden_size, args.hc_mult, args.vocab_size, config.markov_rank
    shapes = block_shapes(stage_args(args, config.stage_count)) | {
        MAIN_PROJ: (d, len(config.target_layers) * d),
        MAIN_NORM: (d,),
        NORM: (d,),
        HC_HEAD_FN: (hc, hc * d),
        HC_HEAD_BASE: (hc,),
        HC_HEAD_SCALE: (1,),
    }
    if rank:
        shapes |= {MARKOV_W1: (vocab, rank), MARKOV_W2: (vocab, rank)}
    if config.confidence:
        shapes |= {CONF_PROJ: (1, d + rank), CONF_BIAS: (1,)}
    return shapes


# --------------------------------------------------------------------------------------------
# The network
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetHead:
    """The target's token embedding and output head, which drafters borrow (a plain object, so
    the weights are not drafter parameters)."""

    embed: Weight
    output: Weight


@dataclass(frozen=True)
class BlockContext:
    """What one stage's attention sees besides the block rows.

    ``keys`` [N, hd]: context keys of positions ``key_pos0 ..``; ``anchors`` [M]: the first
    position of each block (blocks of ``block_size`` rows, laid out one after the other).
    A block row sees the context keys in ``[anchor - window, anchor)`` and its own block.
    """

    keys: mx.array
    key_pos0: int
    anchors: np.ndarray
    block_size: int
    window: int

    def positions(self) -> np.ndarray:
        return (self.anchors[:, None] + np.arange(self.block_size)).reshape(-1)

    def mask(self) -> mx.array:
        """bool [M * block_size, N + M * block_size]."""
        key_pos = self.key_pos0 + np.arange(self.keys.shape[0])
        anchors = np.repeat(self.anchors, self.block_size)[:, None]
        context = (key_pos < anchors) & (key_pos >= anchors - self.window)
        block_of_row = np.repeat(np.arange(len(self.anchors)), self.block_size)
        same_block = block_of_row[:, None] == block_of_row[None, :]
        return mx.array(np.concatenate([context, same_block], axis=1))


class BlockAttention(nn.Module):
    """A stage's attention: the target-style projections of ``attention``, applied to whole
    blocks that attend non-causally to themselves and to their context keys. It stands in for
    the ``Attention`` of a ``Block``, taking a ``BlockContext`` where that takes a cache."""

    def __init__(self, attention: Attention):
        super().__init__()
        self.inner = attention

    def context_keys(self, x: mx.array, pos0: int) -> mx.array:
        """Keys [N, hd] of context rows x [N, D] at positions pos0 ..."""
        angles = self.inner.rope.angles(np.arange(pos0, pos0 + x.shape[0]))
        return self.inner.keys(x, angles)

    def __call__(self, x: mx.array, _pos0: int, context: BlockContext,
                 _n_real: int | None = None) -> tuple[mx.array, BlockContext]:
        """As ``Attention.__call__``; positions come from ``context`` and a block is never a
        decode tile (``n_real``)."""
        angles = self.inner.rope.angles(context.positions())
        _, q = self.inner.queries(x, angles)
        keys = mx.concatenate([context.keys, self.inner.keys(x, angles)])
        out = sink_attention(q, keys, context.mask(), self.inner.sinks, self.inner.scale)
        return self.inner.output(out, angles), context


class DSparkNet(nn.Module):
    """The drafter's layers (the trainable parameters) and the math of one block."""

    def __init__(self, args: ModelArgs, config: DSparkConfig, w, head: TargetHead):
        """``args``: the target's hyper-parameters; ``w``: weights under canonical names."""
        super().__init__()
        eps = args.rms_norm_eps
        self.config = config
        self.window = args.sliding_window
        self.hc_mult = args.hc_mult
        self.main_proj = w.matrix(MAIN_PROJ)
        self.main_norm = RMSNorm(w.param(MAIN_NORM), eps)
        s_args = stage_args(args, config.stage_count)
        self.stages = [Block(s_args, w, s) for s in range(config.stage_count)]
        for stage in self.stages:
            stage.attn = BlockAttention(stage.attn)
        self.hc_head = HyperHead(w.matrix(HC_HEAD_FN), w.param(HC_HEAD_BASE),
                                 w.param(HC_HEAD_SCALE), hc_eps=args.hc_eps, norm_eps=eps)
        self.norm = RMSNorm(w.param(NORM), eps)
        self.markov_w1 = w.matrix(MARKOV_W1) if config.markov_rank else None
        self.markov_w2 = w.matrix(MARKOV_W2) if config.markov_rank else None
        self.conf_proj = w.matrix(CONF_PROJ) if config.confidence else None
        self.conf_bias = w.param(CONF_BIAS) if config.confidence and w.has(CONF_BIAS) else None
        self.head = head

    def context_keys(self, taps: mx.array, pos0: int) -> list[mx.array]:
        """Each stage's keys [N, hd] of target rows at positions pos0 .. from their taps
        [N, len(target_layers) * D]."""
        main = self.main_norm(linear(taps, self.main_proj))
        return [stage.attn.context_keys(main, pos0) for stage in self.stages]

    def hidden(self, tokens: mx.array, contexts: Sequence[BlockContext], *,
               tile: bool = False) -> mx.array:
        """The collapsed hidden states [M * B, D] (before the norm) of blocks ``tokens`` [M, B]
        (anchor then noise tokens), with one context per stage; ``tile``: for drafting, not
        for training."""
        flat = tokens.reshape(-1)
        h = take_rows(self.head.embed, flat).astype(mx.float32)
        x = mx.broadcast_to(h[:, None, :], (h.shape[0], self.hc_mult, h.shape[1]))
        # Drafting runs the stages' MoE as a decode tile whose rows are all real: its compiled
        # fixed-shape function (weights captured as constants, so not while training).
        n_real = flat.shape[0] if tile else None
        for stage, context in zip(self.stages, contexts, strict=True):
            x, _ = stage(x, flat, 0, context, n_real)
        return self.hc_head(x)

    def logits(self, hidden: mx.array) -> mx.array:
        """The target head's logits [..., vocab] (without the Markov bias)."""
        return linear(self.norm(hidden), self.head.output)

    def markov_bias(self, prev: mx.array) -> mx.array:
        """The Markov head's logit bias [..., vocab] given the previous tokens [...]."""
        return linear(take_rows(self.markov_w1, prev), self.markov_w2)

    def confidence(self, hidden: mx.array, prev: mx.array) -> mx.array:
        """Probability [...] that each row's pick is accepted (``hidden`` [..., D])."""
        features = mx.concatenate([hidden, take_rows(self.markov_w1, prev)], axis=-1)
        score = linear(features, self.conf_proj)[..., 0]
        if self.conf_bias is not None:
            score = score + self.conf_bias[0]
        return mx.sigmoid(score)

    def chain(self, hidden: mx.array, logits: mx.array, anchor: int, n: int, *,
              confidences: bool = True) -> tuple[mx.array, mx.array | None]:
        """Greedy picks int32 [n] of the first ``n`` rows of one block, each conditioned
        through the Markov head on the pick before it, with the rows' confidences [n] (None
        without a confidence head or when not asked for). Unevaluated: the picks stay on the
        device from one row to the next, and the caller decides when the host reads them."""
        picks: list[mx.array] = []
        scores: list[mx.array] = []
        prev = mx.array([anchor], dtype=mx.int32)
        for i in range(n):
            row = logits[i : i + 1]
            if self.markov_w1 is not None:
                row = row + self.markov_bias(prev)
            if confidences and self.conf_proj is not None:
                scores.append(self.confidence(hidden[i : i + 1], prev))
            prev = mx.argmax(row, axis=-1).astype(mx.int32)
            picks.append(prev)
        return mx.concatenate(picks), mx.concatenate(scores) if scores else None


# --------------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------------


class DSparkDrafter:
    """The ``Drafter`` over a ``DSparkNet``: keeps each stage's ring of context keys."""

    name = "dspark"

    def __init__(self, net: DSparkNet):
        self.net = net
        self.config = net.config
        self.max_draft = net.config.block_size
        self.capture_layers = net.config.target_layers
        self.reset()

    def reset(self) -> None:
        self._rings: list[mx.array] = []
        self._ring_pos0 = 0
        self._next_pos: int | None = None
        self._next_token: int | None = None

    def observe(self, tokens: Sequence[int], next_token: int, rows: TargetRows) -> None:
        if len(tokens) != rows.n_rows:
            raise ValueError(f"{len(tokens)} tokens but {rows.n_rows} target rows")
        if self._next_pos is not None and rows.pos0 != self._next_pos:
            raise ValueError(f"rows start at position {rows.pos0}, expected {self._next_pos} "
                             "(call reset() to start over)")
        taps = mx.concatenate([rows.layers[i] for i in self.capture_layers], axis=-1)
        keys = self.net.context_keys(taps, rows.pos0)
        if not self._rings:
            self._ring_pos0 = rows.pos0
            self._rings = keys
        else:
            self._rings = [mx.concatenate([ring, k]) for ring, k in zip(self._rings, keys,
                                                                        strict=True)]
        end = rows.pos0 + rows.n_rows
        drop = max(0, end - self._ring_pos0 - self.net.window)
        self._rings = [ring[drop:] for ring in self._rings]
        self._ring_pos0 += drop
        mx.async_eval(self._rings)  # computed while the host goes on; the next draft reads them
        self._next_pos, self._next_token = end, int(next_token)

    def _chain(self, max_tokens: int, confidences: bool) -> tuple[mx.array, mx.array | None]:
        anchor, size = self._next_token, self.config.block_size
        block = mx.array([[anchor] + [self.config.noise_token_id] * (size - 1)], dtype=mx.int32)
        contexts = [BlockContext(ring, self._ring_pos0, np.array([self._next_pos]), size,
                                 self.net.window) for ring in self._rings]
        hidden = self.net.hidden(block, contexts, tile=True)
        return self.net.chain(hidden, self.net.logits(hidden), anchor, max_tokens,
                              confidences=confidences)

    def propose(self, max_tokens: int) -> Draft:
        n = min(max_tokens, self.max_draft)
        if n <= 0 or self._next_token is None:
            return Draft()
        picks, confidences = self._chain(n, confidences=True)
        mx.eval(picks, confidences)
        return Draft(picks.tolist(), None if confidences is None else confidences.tolist())

    def propose_on_device(self, max_tokens: int) -> mx.array | None:
        """``propose`` without the confidences, queued and left on the device: int32 [n], or
        None when there is nothing to draft. The speculative loop feeds it to the verify pass
        before the host reads it (one host sync per cycle instead of two)."""
        n = min(max_tokens, self.max_draft)
        if n <= 0 or self._next_token is None:
            return None
        picks, _ = self._chain(n, confidences=False)
        mx.async_eval(picks)
        return picks


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def read_config(gguf: GGUFFile, target: ModelArgs) -> DSparkConfig:
    """The drafter's configuration from a support file of either layout, validated."""
    arch = require_arch(gguf, LAYOUTS)
    if arch == ARCH_DS4:
        block_size = int(gguf.require("dspark.block_size"))
        noise = int(gguf.require("dspark.noise_token_id"))
        layers = tuple(int(i) for i in gguf.require("dspark.target_layer_ids"))
        stages = int(gguf.require("dspark.stage_count"))
        rank = int(gguf.require("dspark.markov_rank"))
        w1, conf = ds4_name(MARKOV_W1, stages), ds4_name(CONF_PROJ, stages)
    else:
        if gguf.get("dflash.hyper_connection.count") is None:
            raise GGUFError(f"{gguf.path}: a DFlash drafter without DeepSeek-V4 stages "
                            "(no dflash.hyper_connection.count) is not supported")
        if not gguf.get("dflash.sample_from_anchor", True):
            raise GGUFError(f"{gguf.path}: dflash.sample_from_anchor = false is not supported")
        if gguf.has_tensor("d2t"):
            raise GGUFError(f"{gguf.path}: reduced draft vocabularies (d2t) are not supported")
        block_size = int(gguf.require("dflash.block_size"))
        noise = int(gguf.require("tokenizer.ggml.mask_token_id"))
        layers = tuple(int(t) - 1 for t in gguf.require("dflash.target_layers"))
        stages = int(gguf.require("dflash.block_count"))
        w1, conf = MARKOV_W1, CONF_PROJ
        rank = gguf.tensor_shape(w1)[-1] if gguf.has_tensor(w1) else 0
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise GGUFError(f"{gguf.path}: block size {block_size} is outside [1, {MAX_BLOCK_SIZE}]")
    if not 0 <= noise < target.vocab_size:
        raise GGUFError(f"{gguf.path}: noise token {noise} is outside the target's vocabulary "
                        f"of {target.vocab_size}")
    bad = [i for i in layers if not 0 <= i < target.num_layers]
    if not layers or bad:
        raise GGUFError(f"{gguf.path}: target layers {list(layers)} do not fit the target's "
                        f"{target.num_layers} layers")
    if stages < 1:
        raise GGUFError(f"{gguf.path}: stage count {stages} must be at least 1")
    if rank and not gguf.has_tensor(w1):
        raise GGUFError(f"{gguf.path}: Markov rank {rank} but no tensor '{w1}'")
    return DSparkConfig(block_size, noise, layers, stages, rank,
                        confidence=bool(rank) and gguf.has_tensor(conf))


def target_head(target: LoadedModel) -> TargetHead:
    return TargetHead(target.network.embed, target.network.output)


def load_dspark(path: str | Path, target: LoadedModel, *, check_target_id: bool = True,
                weights_dtype: str | None = None) -> DSparkDrafter:
    """The DSpark drafter in support file ``path`` (either layout) for ``target``.

    Raises GGUFError for a file of another kind, a bad configuration or tensor, or (unless
    ``check_target_id`` is off) a file trained for another target. ``weights_dtype`` defaults
    to the target's.
    """
    gguf = open_gguf(path)
    if not isinstance(target.args, ModelArgs):
        raise GGUFError(f"{gguf.path}: DSpark drafts for DeepSeek-V4 (deepseek4) targets; "
                        f"{target.gguf.path} is a {target.gguf.arch} model (GLM drafts with "
                        "its own MTP block: --mtp)")
    # Whose drafter it is comes first: a file for another model fails its shape checks too,
    # with a less helpful message.
    if check_target_id:
        check_target(gguf, target.gguf)
    config = read_config(gguf, target.args)
    stages = config.stage_count
    rename = (lambda n: n) if gguf.arch == ARCH_LLAMA else (lambda n: ds4_name(n, stages))
    shapes = {rename(name): shape for name, shape in tensor_shapes(target.args, config).items()}
    stored = GGUFWeights(shapes, gguf, weights_dtype or target.weights_dtype)
    net = DSparkNet(target.args, config, RenamedWeights(stored, rename), target_head(target))
    return DSparkDrafter(net)


def net_from_arrays(args: ModelArgs, config: DSparkConfig, arrays: Mapping[str, mx.array],
                    head: TargetHead) -> DSparkNet:
    """A ``DSparkNet`` on float32 arrays under canonical names, used as they are (training
    differentiates through them)."""
    return DSparkNet(args, config, ArrayWeights(tensor_shapes(args, config), arrays), head)


def save_dspark(path: str | Path, arch: str, config: DSparkConfig, target: LoadedModel,
                arrays: Mapping[str, np.ndarray], *, context_length: int) -> None:
    """Write a support file in the layout of ``arch`` (``ARCH_DS4`` or ``ARCH_LLAMA``) from
    float32 arrays under canonical names, recording ``target``'s identity."""
    u32 = GGUFValueType.UINT32
    meta = identity_metadata(target.gguf)
    if arch == ARCH_DS4:
        tensors = {ds4_name(name, config.stage_count): a for name, a in arrays.items()}
        meta |= {
            "dspark.block_size": MetaValue(config.block_size, u32),
            "dspark.markov_rank": MetaValue(config.markov_rank, u32),
            "dspark.noise_token_id": MetaValue(config.noise_token_id, u32),
            "dspark.target_layer_ids": MetaValue(list(config.target_layers), u32),
            "dspark.stage_count": MetaValue(config.stage_count, u32),
        }
    else:
        tensors = dict(arrays)
        s_args = stage_args(target.args, config.stage_count)
        for key, value in s_args.to_gguf_metadata(context_length).items():
            meta[f"{ARCH_LLAMA}.{key.split('.', 1)[1]}"] = value
        meta |= tokenizer_metadata(target.gguf) | {
            "dflash.block_size": MetaValue(config.block_size, u32),
            "dflash.target_layers": MetaValue([i + 1 for i in config.target_layers], u32),
            "tokenizer.ggml.mask_token_id": MetaValue(config.noise_token_id, u32),
        }
    write_support_gguf(Path(path), arch, meta, tensors)
