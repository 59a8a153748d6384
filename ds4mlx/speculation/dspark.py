"""DSpark: DeepSeek's block drafter for DeepSeek-V4-Flash, loaded from its support GGUF.

The drafter proposes a block of up to ``block_size`` tokens in one pass, as ds4 and llama.cpp
run it (llama.cpp 0c1e570 ``src/models/dflash.cpp``, ``graph_dsv4`` and
``build_dspark_markov_head``):

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

The file layouts and their keys are described in ``dspark_layout``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ds4mlx.gguf import GGUFError, open_gguf
from ds4mlx.kernels import Weight, grow_rows, inference, linear, markov_chain, take_rows
from ds4mlx.models.attention import sink_attention
from ds4mlx.models.deepseek4 import Attention, Block, ModelArgs
from ds4mlx.models.mhc import HyperHead
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.rope import RoPE, RopeAngles
from ds4mlx.models.tiles import CompiledTiles
from ds4mlx.models.weights import ArrayWeights, GGUFWeights
from ds4mlx.speculation.drafter import Draft, TargetRows
from ds4mlx.speculation.dspark_layout import (
    ARCH_DS4,
    ARCH_LLAMA,
    CONF_BIAS,
    CONF_PROJ,
    D2T,
    EMBEDDING_TAP,
    HC_HEAD_BASE,
    HC_HEAD_FN,
    HC_HEAD_SCALE,
    LAYOUTS,
    MAIN_NORM,
    MAIN_PROJ,
    MAIN_PROJ_SCALE,
    MARKOV_W1,
    MARKOV_W2,
    MARKOV_W2_SCALE,
    MAX_BLOCK_SIZE,
    NORM,
    OUTPUT,
    TOKEN_EMBD,
    DSparkConfig,
    ds4_name,
    read_config,
    save_dspark_arrays,
    tensor_shapes,
)
from ds4mlx.speculation.support_gguf import RenamedWeights, check_target, stage_args

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import GGMLQuantizationType

if TYPE_CHECKING:
    from ds4mlx.loader import LoadedModel

__all__ = [
    "ARCH_DS4",
    "ARCH_LLAMA",
    "CONF_BIAS",
    "CONF_PROJ",
    "D2T",
    "EMBEDDING_TAP",
    "LAYOUTS",
    "MAIN_PROJ",
    "MAIN_PROJ_SCALE",
    "MARKOV_W1",
    "MARKOV_W2",
    "MARKOV_W2_SCALE",
    "MAX_BLOCK_SIZE",
    "OUTPUT",
    "TOKEN_EMBD",
    "BlockContext",
    "BlockRows",
    "DSparkConfig",
    "DSparkDrafter",
    "DSparkNet",
    "TargetHead",
    "ds4_name",
    "load_dspark",
    "net_from_arrays",
    "save_dspark",
    "target_head",
    "tensor_shapes",
]


# --------------------------------------------------------------------------------------------
# The network
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetHead:
    """A token embedding and output head (the target's, which drafters borrow, or a drafter's
    own): a plain object, so the weights are not drafter parameters."""

    embed: Weight
    output: Weight


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
    blocks that attend non-causally to themselves and to their context keys. It stands in for
    the ``Attention`` of a ``Block``, taking a ``BlockContext`` where that takes a cache."""

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

    def __init__(self, args: ModelArgs, config: DSparkConfig, w, head: TargetHead):
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
        self.stages = [Block(s_args, w, s) for s in range(config.stage_count)]
        for stage in self.stages:
            stage.attn = BlockAttention(stage.attn)
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

    def taps(self, tokens: Sequence[int], rows: TargetRows) -> mx.array:
        """The tapped target features [n, len(target_layers) * D] of committed rows."""
        parts = []
        for layer in self.config.target_layers:
            if layer == EMBEDDING_TAP:
                ids = mx.array(np.asarray(tokens, dtype=np.int32))
                parts.append(take_rows(self.target.embed, ids).astype(mx.float32))
            else:
                parts.append(rows.layers[layer])
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


def _padded(ring: mx.array, rows: int) -> mx.array:
    """``ring`` [N, hd] after ``rows`` zero rows."""
    return (
        ring if rows <= 0 else mx.concatenate([mx.zeros((rows, ring.shape[1]), ring.dtype), ring])
    )


def _bias_index(d2t: np.ndarray, vocab: int) -> mx.array:
    """For each target token, its row in the draft vocabulary, or ``len(d2t)`` (a zero
    column) when it has none (``read_config`` checked that ``d2t`` maps rows to distinct
    target tokens)."""
    d2t = d2t.reshape(-1).astype(np.int64)
    index = np.full(vocab, len(d2t), dtype=np.int32)
    index[d2t] = np.arange(len(d2t), dtype=np.int32)
    return mx.array(index)


# --------------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------------


class DSparkDrafter:
    """The ``Drafter`` over a ``DSparkNet``: keeps each stage's ring of context keys."""

    name = "dspark"
    #: ``reset`` empties the rings: rows fed after the last draft are never read (drafter.py).
    reads_rows_after_last_draft = False

    def __init__(self, net: DSparkNet):
        self.net = net
        self.config = net.config
        self.max_draft = net.config.max_draft
        self.capture_layers = tuple(
            dict.fromkeys(i for i in net.config.target_layers if i != EMBEDDING_TAP)
        )
        self._draft_tiles = CompiledTiles(net.draft_tile)
        self._context_tiles = CompiledTiles(net.context_tile)
        self.reset()

    def reset(self) -> None:
        self._rings: list[mx.array] = []
        self._ring_pos0 = 0
        self._next_pos: int | None = None
        self._next_token: int | None = None

    def observe(self, tokens: Sequence[int], next_token: int, rows: TargetRows) -> None:
        if len(tokens) != rows.n_rows:
            raise ValueError(f"{len(tokens)} tokens but {rows.n_rows} target rows")
        self.observe_taps(self.net.taps(tokens, rows), rows.pos0, next_token)

    def observe_taps(self, taps: mx.array, pos0: int, next_token: int) -> None:
        """``observe`` given the committed rows' tapped features [n, len(target_layers) * D]
        (what llama.cpp injects into its draft cache) instead of the target's hidden states."""
        if self._next_pos is not None and pos0 != self._next_pos:
            raise ValueError(
                f"rows start at position {pos0}, expected {self._next_pos} "
                "(call reset() to start over)"
            )
        n, window = taps.shape[0], self.net.window
        with inference():
            if n <= self.max_draft + 1:  # a cycle's committed rows: one compiled call
                angles = self.net.context_angles(pos0, n)
                flat = [part for stage in angles for part in stage.on_device]
                keys = self._context_tiles.get(n)(taps, *flat)
            else:
                keys = self.net.context_keys(taps, pos0)
            held = self._rings[0].shape[0] if self._rings else 0
            if not self._rings:
                self._ring_pos0 = pos0
                self._rings = [k[:0] for k in keys]
            # Each ring grows by the rows and keeps the last ``window`` (one primitive).
            kept = min(window, held + n)
            self._rings = grow_rows(self._rings, keys, n, kept)
        end = pos0 + n
        self._ring_pos0 = end - kept
        mx.async_eval(self._rings)  # computed while the host goes on; the next draft reads them
        self._next_pos, self._next_token = end, int(next_token)

    def block(self, n_rows: int | None = None, *, confidences: bool = True) -> BlockRows:
        """The next block's first ``n_rows`` rows (default: all), unevaluated; needs an
        ``observe`` first. Without confidences (the speculative loop's drafts) the block runs
        as one compiled function over fixed shapes (``DSparkNet.draft_tile``): each ring is
        padded to the window with keys no row sees."""
        if self._next_token is None:
            raise ValueError("nothing observed yet")
        anchor, size = self._next_token, self.config.block_size
        n = size if n_rows is None else n_rows
        block = mx.array([[anchor] + [self.config.noise_token_id] * (size - 1)], dtype=mx.int32)
        padding = 0 if confidences else self.net.window - self._rings[0].shape[0]
        contexts = [
            BlockContext(
                _padded(ring, padding),
                self._ring_pos0 - padding,
                np.array([self._next_pos]),
                size,
                self.net.window,
                self.config.per_row_window,
                padding,
            )
            for ring in self._rings
        ]
        with inference():  # drafting: no gradient is taken
            if not confidences:
                flat = []
                for context, stage in zip(contexts, self.net.stages, strict=True):
                    prepared = context.for_stage(stage.attn.inner.rope)
                    flat += [prepared.keys, prepared.mask, *prepared.angles.on_device]
                anchor_ids = mx.array([anchor], dtype=mx.int32)
                logits, picks = self._draft_tiles.get(n)(block, anchor_ids, *flat)
                return BlockRows(logits, picks, None)
            hidden = self.net.hidden(block, contexts, tile=True)
            return self.net.block_rows(
                hidden, self.net.logits(hidden), anchor, n, confidences=confidences
            )

    def _draft(self, n: int, confidences: bool) -> tuple[mx.array, mx.array | None]:
        first = 0 if self.config.sample_from_anchor else 1
        rows = self.block(first + n, confidences=confidences)
        scores = None if rows.confidences is None else rows.confidences[first:]
        return rows.picks[first:], scores

    def propose(self, max_tokens: int) -> Draft:
        n = min(max_tokens, self.max_draft)
        if n <= 0 or self._next_token is None:
            return Draft()
        picks, confidences = self._draft(n, confidences=True)
        mx.eval(picks, confidences)
        return Draft(picks.tolist(), None if confidences is None else confidences.tolist())

    def propose_on_device(self, max_tokens: int) -> mx.array | None:
        """``propose`` without the confidences, queued and left on the device: int32 [n], or
        None when there is nothing to draft. The speculative loop feeds it to the verify pass
        before the host reads it (one host sync per cycle instead of two)."""
        n = min(max_tokens, self.max_draft)
        if n <= 0 or self._next_token is None:
            return None
        picks, _ = self._draft(n, confidences=False)
        mx.async_eval(picks)
        return picks


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def target_head(target: LoadedModel) -> TargetHead:
    return TargetHead(target.network.embed, target.network.output)


def load_dspark(
    path: str | Path,
    target: LoadedModel,
    *,
    check_target_id: bool = True,
    weights_dtype: str | None = None,
) -> DSparkDrafter:
    """The DSpark drafter in support file ``path`` (either layout) for ``target``.

    Raises GGUFError for a file of another kind, a bad configuration or tensor, anything of a
    dflash file this reader does not implement, or (unless ``check_target_id`` is off) a file
    trained for another target. ``weights_dtype`` defaults to the target's.
    """
    gguf = open_gguf(path)
    if not isinstance(target.args, ModelArgs):
        raise GGUFError(
            f"{gguf.path}: DSpark drafts for DeepSeek-V4 (deepseek4) targets; "
            f"{target.gguf.path} is a {target.gguf.arch} model (GLM drafts with "
            "its own MTP block: --mtp)"
        )
    # Whose drafter it is comes first: a file for another model fails its shape checks too,
    # with a less helpful message.
    if check_target_id:
        check_target(gguf, target.gguf)
    config, args = read_config(gguf, target.args)
    stages = config.stage_count
    rename = (lambda n: n) if gguf.arch == ARCH_LLAMA else (lambda n: ds4_name(n, stages))
    shapes = {rename(name): shape for name, shape in tensor_shapes(args, config).items()}
    stored = GGUFWeights(shapes, gguf, weights_dtype or target.weights_dtype)
    net = DSparkNet(args, config, RenamedWeights(stored, rename), target_head(target))
    return DSparkDrafter(net)


def net_from_arrays(
    args: ModelArgs, config: DSparkConfig, arrays: Mapping[str, mx.array], head: TargetHead
) -> DSparkNet:
    """A ``DSparkNet`` on float32 arrays under canonical names, used as they are (training
    differentiates through them). ``args``: the target's."""
    stages = stage_args(args, config.stage_count)
    return DSparkNet(stages, config, ArrayWeights(tensor_shapes(stages, config), arrays), head)


def save_dspark(
    path: str | Path,
    arch: str,
    config: DSparkConfig,
    target: LoadedModel,
    arrays: Mapping[str, np.ndarray],
    *,
    context_length: int,
    matrix_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
) -> None:
    """Write a support file in the layout of ``arch`` (``ARCH_DS4`` or ``ARCH_LLAMA``) from
    float32 arrays under canonical names, for stages built like ``target``'s layers, recording
    ``target``'s identity; matrices stored as ``matrix_type``."""
    save_dspark_arrays(
        path,
        arch,
        config,
        stage_args(target.args, config.stage_count),
        target.gguf,
        arrays,
        context_length=context_length,
        matrix_type=matrix_type,
    )
