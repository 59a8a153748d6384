"""DSpark's network: DeepSeek's block drafter for DeepSeek-V4-Flash (its stages, context
keys, output and Markov heads), as ds4 and llama.cpp run it (llama.cpp 0c1e570
``src/models/dflash.cpp``, ``graph_dsv4`` and ``build_dspark_markov_head``). The drafter around
it (the rings of context keys, the compiled draft, the files) is ``speculation.dspark``.

* Context. For every committed target row, the stream means of the target's hidden states after
  the layers ``target_layers`` (llama.cpp: the inputs of layers t, the token embedding for t = 0)
  are concatenated, projected (``fc``, times ``fc.scale`` when present) and RMS-normed
  (``enc.output_norm``). Each stage turns that into keys (its own ``attn_kv`` and
  ``attn_kv_a_norm``, RoPE at the row's position) and keeps the last ``sliding_window`` of them:
  its context ring.
* Block. The input is the last committed token (the anchor, at position p) followed by
  ``block_size - 1`` noise tokens at p + 1, ...; embedded (the drafter's own ``token_embd``, else
  the target's) and copied to the mHC streams, it runs through ``stage_count`` DeepSeek-V4
  blocks whose attention sees context keys of the stage's ring and the whole block (non-causal,
  with the attention sinks). Which ring keys a row sees is the layout's window rule (see
  ``BlockContext``).
* Head. ``hc_head``, the drafter's norm and the output head (the drafter's ``output``, else its
  ``token_embd``, else the target's) give row i's logits for the token at p + i + 1. The Markov
  head adds ``markov_w2 . markov_w1[prev]`` (times ``markov_w2.scale``; scattered through ``d2t``
  for a reduced draft vocabulary), prev being the anchor for the first drafted row, then the
  previous row's pick, so the block is chained greedily row by row; the confidence head scores
  a row as ``sigmoid(conf_proj . [h_i; markov_w1[prev]] + bias)`` with h_i the collapsed hidden
  state before the norm. The speculative loop cuts a draft at the first row under
  ``--dspark-confidence``. With ``sample_from_anchor = false`` row 0 is a bonus slot whose
  logits pass through unbiased, and drafts come from rows 1 ...

Tensor names here are llama.cpp's (canonical); ``speculation.dspark_layout`` maps them to ds4's
layout and reads and writes both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ds4mlx.kernels import linear, markov_chain, take_rows
from ds4mlx.models.attention import sink_attention
from ds4mlx.models.deepseek4 import Attention, Block, ModelArgs
from ds4mlx.models.deepseek4_mtp import TargetHead, block_shapes, stage_args
from ds4mlx.models.mhc import HyperHead
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.rope import RoPE, RopeAngles
from ds4mlx.models.weights import ArrayWeights, RenamedWeights, Weights

import mlx.core as mx
import mlx.nn as nn
import numpy as np

#: ``DSparkConfig.target_layers`` entry for the target's token embedding (llama.cpp's
#: ``target_layers`` entry 0: the input of layer 0, the mean of identical mHC streams).
EMBEDDING_TAP = -1

# Canonical (llama.cpp) names of the tensors outside the stages.
MAIN_PROJ = "fc.weight"
MAIN_PROJ_SCALE = "fc.scale"
MAIN_NORM = "enc.output_norm.weight"
NORM = "output_norm.weight"
HC_HEAD_FN = "output_hc_fn.weight"
HC_HEAD_BASE = "output_hc_base.weight"
HC_HEAD_SCALE = "output_hc_scale.weight"
MARKOV_W1 = "markov_w1.weight"
MARKOV_W2 = "markov_w2.weight"
MARKOV_W2_SCALE = "markov_w2.scale"
CONF_PROJ = "conf_proj.weight"
CONF_BIAS = "conf_proj.bias"
TOKEN_EMBD = "token_embd.weight"
OUTPUT = "output.weight"
D2T = "d2t"


@dataclass(frozen=True)
class DSparkConfig:
    block_size: int
    noise_token_id: int
    #: Target layers whose outputs are tapped (``ForwardOutput.layers`` indices, or
    #: ``EMBEDDING_TAP`` for the token embedding), in order.
    target_layers: tuple[int, ...]
    stage_count: int
    #: Rank of the Markov head; 0 when the file has none (plain DFlash-style drafts).
    markov_rank: int
    #: Whether the file has a confidence head (it needs the Markov head's ``markov_w1``).
    confidence: bool
    #: False: block row 0 (the anchor) is a bonus slot, not a prediction (SpecForge exports);
    #: drafts come from rows 1 .., at most ``block_size - 1`` of them.
    sample_from_anchor: bool = True
    #: The sliding-window rule. True (llama.cpp): the block row at position q sees the context
    #: key at k when q - k < window. False (ds4): every row of a block anchored at p sees the
    #: keys in [p - window, p), one range for the whole block.
    per_row_window: bool = False
    #: Optional tensors present (``dspark_layout.LLAMA_OPTIONAL`` names; only the dflash layout
    #: has them).
    optional: frozenset[str] = field(default_factory=frozenset)
    #: Rows of ``markov_w2`` (and of ``d2t``) when the file has a reduced draft vocabulary.
    draft_vocab: int | None = None

    @property
    def max_draft(self) -> int:
        return self.block_size if self.sample_from_anchor else self.block_size - 1


def tensor_shapes(args: ModelArgs, config: DSparkConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a DSpark drafter whose stages have ``args`` (the target's, or the file's
    own for the dflash layout), canonical name -> shape; ``CONF_BIAS`` may be absent."""
    d, hc, vocab, rank = args.hidden_size, args.hc_mult, args.vocab_size, config.markov_rank
    draft_vocab = config.draft_vocab or vocab
    shapes = block_shapes(stage_args(args, config.stage_count)) | {
        MAIN_PROJ: (d, len(config.target_layers) * d),
        MAIN_NORM: (d,),
        NORM: (d,),
        HC_HEAD_FN: (hc, hc * d),
        HC_HEAD_BASE: (hc,),
        HC_HEAD_SCALE: (1,),
    }
    if rank:
        shapes |= {MARKOV_W1: (vocab, rank), MARKOV_W2: (draft_vocab, rank)}
    if config.confidence:
        shapes |= {CONF_PROJ: (1, d + rank), CONF_BIAS: (1,)}
    optional = {
        MAIN_PROJ_SCALE: (1,),
        MARKOV_W2_SCALE: (1,),
        TOKEN_EMBD: (vocab, d),
        OUTPUT: (draft_vocab, d),
        D2T: (draft_vocab,),
    }
    return shapes | {name: shape for name, shape in optional.items() if name in config.optional}


@dataclass(frozen=True)
class BlockContext:
    """What one stage's attention sees besides the block rows.

    ``keys`` [N, hd]: context keys of positions ``key_pos0 ..``; ``anchors`` [M]: the first
    position of each block (blocks of ``block_size`` rows, laid out one after the other). A
    block row sees context keys before its anchor and the rows of its own block, within the
    window:

    * ``per_row`` (llama.cpp's dflash layout): the row at position q sees the key at k when
      q - k < window. The draft's KV cache is a standard sliding-window cache
      (``LLAMA_SWA_TYPE_STANDARD``, ``llama_hparams::is_masked_swa`` masks p1 - p0 >= n_swa),
      so the window slides with the row.
    * otherwise (ds4's layout): every row sees the keys in ``[anchor - window, anchor)``. ds4's
      stage attention (``ds4_gpu_attention_noncausal_raw_batch_heads_tensor``, called from its
      Metal DSpark stage evaluation) gives all block rows one shared range of the per-stage
      ring of the last ``window`` target rows; ds4-reference.md records the same.
    """

    keys: mx.array
    key_pos0: int
    anchors: np.ndarray
    block_size: int
    window: int
    per_row: bool = False
    #: The first ``padding`` keys are placeholders no row sees (a ring padded to a fixed shape).
    padding: int = 0

    def positions(self) -> np.ndarray:
        return (self.anchors[:, None] + np.arange(self.block_size)).reshape(-1)

    def mask(self) -> mx.array:
        """bool [M * block_size, N + M * block_size]."""
        key_pos = self.key_pos0 + np.arange(self.keys.shape[0])
        anchors = np.repeat(self.anchors, self.block_size)[:, None]
        rows = self.positions()
        block_of_row = np.repeat(np.arange(len(self.anchors)), self.block_size)
        same_block = block_of_row[:, None] == block_of_row[None, :]
        if self.per_row:
            context = (key_pos < anchors) & (rows[:, None] - key_pos < self.window)
            same_block &= rows[:, None] - rows[None, :] < self.window
        else:
            context = (key_pos < anchors) & (key_pos >= anchors - self.window)
        context[:, : self.padding] = False
        return mx.array(np.concatenate([context, same_block], axis=1))

    def for_stage(self, rope: RoPE) -> StageContext:
        """The keys, mask and rows' angles of one stage's attention (``rope``: its RoPE)."""
        return StageContext(self.keys, self.mask(), rope.angles(self.positions()))


@dataclass(frozen=True)
class StageContext:
    """A ``BlockContext`` as one stage's attention reads it: the context keys [N, hd], the
    mask [rows, N + rows] and the block rows' RoPE angles. A compiled draft takes these as its
    inputs (``DSparkNet.draft_tile``), so they hold device arrays there."""

    keys: mx.array
    mask: mx.array
    angles: RopeAngles


class BlockAttention(nn.Module):
    """A stage's attention: the target-style projections of ``attention``, applied to whole
    blocks that attend non-causally to themselves and to their context keys. A stage's
    ``Block`` is given it in its constructor (``attention=``) in place of its own
    ``Attention``; called as that one is, it takes a ``BlockContext`` where that takes a
    cache."""

    def __init__(self, attention: Attention):
        super().__init__()
        self.inner = attention

    def context_keys(self, x: mx.array, angles: RopeAngles) -> mx.array:
        """Keys [N, hd] of context rows x [N, D] with their positions' angles."""
        return self.inner.keys(x, angles)

    def __call__(
        self, x: mx.array, _pos0: int, context: BlockContext | StageContext
    ) -> tuple[mx.array, BlockContext | StageContext]:
        """As ``Attention.__call__``; positions come from ``context``."""
        stage = context.for_stage(self.inner.rope) if isinstance(context, BlockContext) else context
        _, q = self.inner.queries(x, stage.angles)
        keys = mx.concatenate([stage.keys, self.inner.keys(x, stage.angles)])
        out = sink_attention(q, keys, stage.mask, self.inner.sinks, self.inner.scale)
        return self.inner.output(out, stage.angles), context

    def tile(
        self, x: mx.array, pos0: int, context: BlockContext | StageContext, _n_real: int
    ) -> tuple[mx.array, BlockContext | StageContext]:
        """As ``Attention.tile``: ``__call__``, since a drafted block's rows are all real."""
        return self(x, pos0, context)


@dataclass(frozen=True)
class BlockRows:
    """One block's rows as llama.cpp's graph outputs them: the logits with the Markov bias
    [n, vocab], each row's greedy pick [n] (the chain's path) and confidences [n] (None
    without a confidence head). With ``sample_from_anchor = false`` row 0 is the unbiased
    bonus slot (its confidence: llama.cpp's padding, the sigmoid of its first logit)."""

    logits: mx.array
    picks: mx.array
    confidences: mx.array | None


class DSparkNet(nn.Module):
    """The drafter's layers (the trainable parameters) and the math of one block."""

    def __init__(
        self, args: ModelArgs, config: DSparkConfig, w: Weights | RenamedWeights, head: TargetHead
    ):
        """``args``: the stages' hyper-parameters (``stage_args`` of the target's for ds4's
        layout); ``w``: weights under canonical names; ``head``: the target's embedding and
        output, used where the drafter has none of its own."""
        super().__init__()
        eps = args.rms_norm_eps
        optional = config.optional
        self.config = config
        self.window = args.sliding_window
        self.hc_mult = args.hc_mult
        self.main_proj = w.matrix(MAIN_PROJ)
        self.main_scale = w.param(MAIN_PROJ_SCALE) if MAIN_PROJ_SCALE in optional else None
        self.main_norm = RMSNorm(w.param(MAIN_NORM), eps)
        s_args = stage_args(args, config.stage_count)
        self.stages = [
            Block(s_args, w, s, attention=BlockAttention(Attention(s_args, w, s)))
            for s in range(config.stage_count)
        ]
        self.hc_head = HyperHead(
            w.matrix(HC_HEAD_FN),
            w.param(HC_HEAD_BASE),
            w.param(HC_HEAD_SCALE),
            hc_eps=args.hc_eps,
            norm_eps=eps,
        )
        self.norm = RMSNorm(w.param(NORM), eps)
        rank = config.markov_rank
        self.markov_w1 = w.matrix(MARKOV_W1) if rank else None
        self.markov_w2 = w.matrix(MARKOV_W2) if rank else None
        self.markov_scale = (
            w.param(MARKOV_W2_SCALE) if rank and MARKOV_W2_SCALE in optional else None
        )
        self.conf_proj = w.matrix(CONF_PROJ) if config.confidence else None
        self.conf_bias = w.param(CONF_BIAS) if config.confidence and w.has(CONF_BIAS) else None
        # llama.cpp (load_arch_tensors, graph_dsv4): the drafter's own token_embd / output come
        # first; token_embd doubles as the head without output; else the target's.
        embed = w.matrix(TOKEN_EMBD) if TOKEN_EMBD in optional else head.embed
        if OUTPUT in optional:
            output = w.matrix(OUTPUT)
        else:
            output = embed if TOKEN_EMBD in optional else head.output
        self.head = TargetHead(embed, output)
        self.target = head
        self.bias_index = (
            _bias_index(np.asarray(w.ints(D2T)), args.vocab_size)
            if rank and D2T in optional
            else None
        )

    def context_keys(self, taps: mx.array, pos0: int) -> list[mx.array]:
        """Each stage's keys [N, hd] of target rows at positions pos0 .. from their taps
        [N, len(target_layers) * D]."""
        return self._keys_at(taps, self.context_angles(pos0, taps.shape[0]))

    def stage_contexts(self, contexts: Sequence[BlockContext]) -> list[StageContext]:
        """Each stage's attention inputs for its ``BlockContext``."""
        return [
            context.for_stage(stage.attn.inner.rope)
            for context, stage in zip(contexts, self.stages, strict=True)
        ]

    def context_angles(self, pos0: int, n: int) -> list[RopeAngles]:
        """Each stage's RoPE angles of positions pos0 .. pos0 + n - 1."""
        positions = np.arange(pos0, pos0 + n)
        return [stage.attn.inner.rope.angles(positions) for stage in self.stages]

    def context_tile(self, taps: mx.array, *angles: mx.array, n_real: int) -> list[mx.array]:
        """``context_keys`` of ``n_real`` rows as a compiled function takes it: each stage's
        angles as (cos, sin) inputs."""
        pairs = zip(*[iter(angles)] * 2, strict=True)
        return self._keys_at(taps, [RopeAngles(cos, sin) for cos, sin in pairs])

    def _keys_at(self, taps: mx.array, angles: Sequence[RopeAngles]) -> list[mx.array]:
        main = linear(taps, self.main_proj)
        if self.main_scale is not None:
            main = main * self.main_scale
        main = self.main_norm(main)
        return [
            stage.attn.context_keys(main, stage_angles)
            for stage, stage_angles in zip(self.stages, angles, strict=True)
        ]

    def taps(self, tokens: Sequence[int], layers: Mapping[int, mx.array]) -> mx.array:
        """The tapped target features [n, len(target_layers) * D] of committed rows
        ``tokens`` whose hidden states after the target's layers are ``layers``
        (``ForwardOutput.layers``)."""
        parts = []
        for layer in self.config.target_layers:
            if layer == EMBEDDING_TAP:
                ids = mx.array(np.asarray(tokens, dtype=np.int32))
                parts.append(take_rows(self.target.embed, ids).astype(mx.float32))
            else:
                parts.append(layers[layer])
        return mx.concatenate(parts, axis=-1)

    def draft_tile(
        self, tokens: mx.array, anchor: mx.array, *contexts: mx.array, n_real: int
    ) -> tuple[mx.array, mx.array]:
        """A draft as one compiled function (``DSparkDrafter.block``): the block ``tokens``
        [1, B], the anchor [1] and each stage's context as (keys, mask, cos, sin), all with
        fixed shapes -> the first ``n_real`` rows' biased logits and picks, without
        confidences (``block_rows``)."""
        stages = [
            StageContext(keys, mask, RopeAngles(cos, sin))
            for keys, mask, cos, sin in zip(*[iter(contexts)] * 4, strict=True)
        ]
        hidden = self.hidden(tokens, stages, tile=True)
        rows = self.block_rows(hidden, self.logits(hidden), anchor, n_real, confidences=False)
        return rows.logits, rows.picks

    def hidden(
        self,
        tokens: mx.array,
        contexts: Sequence[BlockContext | StageContext],
        *,
        tile: bool = False,
    ) -> mx.array:
        """The collapsed hidden states [M * B, D] (before the norm) of blocks ``tokens`` [M, B]
        (anchor then noise tokens), with one context per stage; ``tile``: for drafting, not
        for training."""
        flat = tokens.reshape(-1)
        h = take_rows(self.head.embed, flat).astype(mx.float32)
        x = mx.broadcast_to(h[:, None, :], (h.shape[0], self.hc_mult, h.shape[1]))
        # Drafting runs the stages' MoE as a decode tile whose rows are all real: its compiled
        # fixed-shape function (weights captured as constants, so not while training).
        for stage, context in zip(self.stages, contexts, strict=True):
            if tile:
                x, _ = stage.tile(x, flat, 0, context, flat.shape[0])
            else:
                x, _ = stage(x, flat, 0, context)
        return self.hc_head(x)

    def logits(self, hidden: mx.array) -> mx.array:
        """The output head's logits [..., vocab] (without the Markov bias)."""
        return linear(self.norm(hidden), self.head.output)

    def markov_bias(self, prev: mx.array) -> mx.array:
        """The Markov head's logit bias [..., vocab] given the previous tokens [...]."""
        bias = linear(take_rows(self.markov_w1, prev), self.markov_w2)
        if self.markov_scale is not None:
            bias = bias * self.markov_scale
        if self.bias_index is not None:
            # d2t: draft row i biases target token d2t[i]; the other tokens get 0.
            padded = mx.concatenate([bias, mx.zeros((*bias.shape[:-1], 1), bias.dtype)], -1)
            bias = mx.take(padded, self.bias_index, axis=-1)
        return bias

    def confidence(self, hidden: mx.array, prev: mx.array) -> mx.array:
        """Probability [...] that each row's pick is accepted (``hidden`` [..., D])."""
        features = mx.concatenate([hidden, take_rows(self.markov_w1, prev)], axis=-1)
        score = linear(features, self.conf_proj)[..., 0]
        if self.conf_bias is not None:
            score = score + self.conf_bias[0]
        return mx.sigmoid(score)

    def block_rows(
        self,
        hidden: mx.array,
        logits: mx.array,
        anchor: int | mx.array,
        n: int,
        *,
        confidences: bool = True,
    ) -> BlockRows:
        """The first ``n`` rows of one block, chained greedily through the Markov head as
        llama.cpp's ``build_dspark_markov_head`` does (``anchor``: a token id, or int32 [1] on
        the device). Unevaluated: the picks stay on the device from one row to the next, and
        the caller decides when the host reads them."""
        prev = anchor if isinstance(anchor, mx.array) else mx.array([anchor], dtype=mx.int32)
        want_scores = confidences and self.conf_proj is not None
        first = 0 if self.config.sample_from_anchor else 1
        if not want_scores and self.markov_w1 is not None:
            # One native primitive for the chain in inference on the CPU.
            chained = markov_chain(
                logits,
                self.markov_w1,
                self.markov_w2,
                prev,
                self.markov_scale,
                self.bias_index,
                first,
                n,
            )
            if chained is not None:
                return BlockRows(*chained, None)
        rows: list[mx.array] = []
        picks: list[mx.array] = []
        scores: list[mx.array] = []
        if first and n:
            bonus = logits[0:1]
            rows.append(bonus)
            picks.append(mx.argmax(bonus, axis=-1).astype(mx.int32))
            if want_scores:
                scores.append(mx.sigmoid(bonus[:, 0]))
        for i in range(first, n):
            row = logits[i : i + 1]
            if self.markov_w1 is not None:
                row = row + self.markov_bias(prev)
            if want_scores:
                scores.append(self.confidence(hidden[i : i + 1], prev))
            prev = mx.argmax(row, axis=-1).astype(mx.int32)
            rows.append(row)
            picks.append(prev)
        return BlockRows(
            mx.concatenate(rows), mx.concatenate(picks), mx.concatenate(scores) if scores else None
        )


def _bias_index(d2t: np.ndarray, vocab: int) -> mx.array:
    """For each target token, its row in the draft vocabulary, or ``len(d2t)`` (a zero
    column) when it has none (``speculation.dspark_layout`` checked that ``d2t`` maps rows to
    distinct target tokens)."""
    d2t = d2t.reshape(-1).astype(np.int64)
    index = np.full(vocab, len(d2t), dtype=np.int32)
    index[d2t] = np.arange(len(d2t), dtype=np.int32)
    return mx.array(index)


def net_from_arrays(
    args: ModelArgs, config: DSparkConfig, arrays: Mapping[str, mx.array], head: TargetHead
) -> DSparkNet:
    """A ``DSparkNet`` on float32 arrays under canonical names, used as they are (training
    differentiates through them). ``args``: the target's."""
    stages = stage_args(args, config.stage_count)
    return DSparkNet(stages, config, ArrayWeights(tensor_shapes(stages, config), arrays), head)
