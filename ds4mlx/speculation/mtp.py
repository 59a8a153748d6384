"""The legacy one-stage MTP drafter of DeepSeek-V4 (ds4's ``--mtp-model FILE`` / ``--mtp-draft N``).

One DeepSeek-V4 block with its own KV cache. The row for the token at position q combines that
token with the target's mHC streams at q - 1:

    x = e_proj(enorm(embed(token))) + h_proj(hnorm(streams))   (per stream; the target's embed)

runs the block (causal sliding-window attention over the drafter's earlier rows), then
``hc_head`` -> norm -> the target's output head predicts the token at q + 1 (DeepSeek-V3's MTP
at depth 1). Committed rows use the target's streams; drafting continues autoregressively on the
block's own output streams, on a throwaway copy of the cache, and stops at ``max_draft`` tokens
or before the first token whose top-1 logit margin is below ``margin`` (``--mtp-margin``,
default 3.0: a close second choice means a likely rejection).

Two layouts:

* ds4's separate support file (``general.architecture = deepseek4-mtp``, or ``deepseek4`` with
  only these tensors): ``mtp.0.{e_proj,h_proj,enorm,hnorm,norm,hc_head_fn,hc_head_base,
  hc_head_scale}.weight`` plus the block as ``mtp.0.*`` named like the target's ``blk.{i}.*``;
  hyper-parameters are the target's.
* llama.cpp's block inside the main GGUF (``deepseek4.nextn_predict_layers = 1``): the block is
  ``blk.{n_layer}.*`` with ``blk.{n_layer}.nextn.eh_proj`` ([D, 2D] on [enorm(e); hnorm(h)]),
  ``enorm``, ``hnorm`` and the optional ``shared_head_norm``, ``shared_head_head`` and
  ``embed_tokens``; the collapse is the target's ``output_hc_*``, the norm and head the target's
  unless the optional tensors replace them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ds4mlx.gguf import GGUFError, open_gguf
from ds4mlx.kernels import Weight, linear, take_rows
from ds4mlx.models.cache import ModelState
from ds4mlx.models.deepseek4 import Block, LayerCache, ModelArgs
from ds4mlx.models.mhc import HyperHead
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.weights import ArrayWeights, GGUFWeights
from ds4mlx.speculation.config import DEFAULT_MTP_MARGIN
from ds4mlx.speculation.drafter import Draft, TargetRows
from ds4mlx.speculation.dspark import TargetHead, target_head
from ds4mlx.speculation.support_gguf import (
    RenamedWeights,
    block_shapes,
    check_target,
    identity_metadata,
    require_arch,
    stage_args,
    write_support_gguf,
)

import mlx.core as mx
import mlx.nn as nn
import numpy as np

if TYPE_CHECKING:
    from ds4mlx.loader import LoadedModel

ARCH_MTP = "deepseek4-mtp"
LAYOUTS = {ARCH_MTP: "ds4's MTP support file", "deepseek4": "ds4's MTP support file"}
# The most tokens one draft may hold (ds4's cap on --mtp-draft).
MAX_DRAFT = 16

E_PROJ = "mtp.0.e_proj.weight"
H_PROJ = "mtp.0.h_proj.weight"
ENORM = "mtp.0.enorm.weight"
HNORM = "mtp.0.hnorm.weight"
NORM = "mtp.0.norm.weight"
HC_HEAD_FN = "mtp.0.hc_head_fn.weight"
HC_HEAD_BASE = "mtp.0.hc_head_base.weight"
HC_HEAD_SCALE = "mtp.0.hc_head_scale.weight"


def _ds4_block_name(name: str) -> str:
    return "mtp." + name.removeprefix("blk.")


def tensor_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor of ds4's MTP file for a target with ``args``, name -> shape."""
    d, hc = args.hidden_size, args.hc_mult
    return {_ds4_block_name(n): s for n, s in block_shapes(stage_args(args, 1)).items()} | {
        E_PROJ: (d, d),
        H_PROJ: (d, d),
        ENORM: (d,),
        HNORM: (d,),
        NORM: (d,),
        HC_HEAD_FN: (hc, hc * d),
        HC_HEAD_BASE: (hc,),
        HC_HEAD_SCALE: (1,),
    }


class MTPNet(nn.Module):
    """The MTP block and its input and output pieces."""

    def __init__(
        self,
        *,
        block: Block,
        e_proj: Weight,
        h_proj: Weight,
        enorm: RMSNorm,
        hnorm: RMSNorm,
        hc_head: HyperHead,
        norm: RMSNorm,
        head: TargetHead,
    ):
        super().__init__()
        self.block = block
        self.e_proj = e_proj
        self.h_proj = h_proj
        self.enorm = enorm
        self.hnorm = hnorm
        self.hc_head = hc_head
        self.norm = norm
        self.head = head

    def __call__(
        self, tokens: mx.array, streams: mx.array, pos0: int, cache: LayerCache
    ) -> tuple[mx.array, mx.array, LayerCache]:
        """Rows for ``tokens`` [T] at positions pos0 .., each with the streams [T, hc, D] of the
        position before: (the block's output streams, logits [T, vocab], the updated cache)."""
        embedded = take_rows(self.head.embed, tokens).astype(mx.float32)
        x = linear(self.enorm(embedded), self.e_proj)[:, None, :]
        x = x + linear(self.hnorm(streams), self.h_proj)
        x, cache = self.block(x, tokens, pos0, cache)
        return x, linear(self.norm(self.hc_head(x)), self.head.output), cache


def _ds4_net(args: ModelArgs, w, head: TargetHead) -> MTPNet:
    """``MTPNet`` on ds4-named weights ``w``."""
    eps = args.rms_norm_eps
    block = Block(stage_args(args, 1), RenamedWeights(w, _ds4_block_name), 0)
    hc_head = HyperHead(
        w.matrix(HC_HEAD_FN),
        w.param(HC_HEAD_BASE),
        w.param(HC_HEAD_SCALE),
        hc_eps=args.hc_eps,
        norm_eps=eps,
    )
    return MTPNet(
        block=block,
        e_proj=w.matrix(E_PROJ),
        h_proj=w.matrix(H_PROJ),
        enorm=RMSNorm(w.param(ENORM), eps),
        hnorm=RMSNorm(w.param(HNORM), eps),
        hc_head=hc_head,
        norm=RMSNorm(w.param(NORM), eps),
        head=head,
    )


def _nextn_net(target: LoadedModel, weights_dtype: str) -> MTPNet:
    """``MTPNet`` on llama.cpp's ``blk.{n_layer}.nextn.*`` block inside the target's file."""
    args, gguf, net = target.args, target.gguf, target.network
    layer, d = args.num_layers, args.hidden_size
    p = f"blk.{layer}"
    if not gguf.has_tensor(f"{p}.nextn.eh_proj.weight"):
        raise GGUFError(f"{gguf.path}: no MTP block ({p}.nextn.*); give an MTP support file")
    shapes = {
        n: s
        for n, s in block_shapes(replace(args, num_layers=layer + 1)).items()
        if n.startswith(f"{p}.")
    } | {
        f"{p}.nextn.eh_proj.weight": (d, 2 * d),
        f"{p}.nextn.enorm.weight": (d,),
        f"{p}.nextn.hnorm.weight": (d,),
        f"{p}.nextn.shared_head_norm.weight": (d,),
        f"{p}.nextn.shared_head_head.weight": (args.vocab_size, d),
        f"{p}.nextn.embed_tokens.weight": (args.vocab_size, d),
    }
    w = GGUFWeights(shapes, gguf, weights_dtype)

    def optional_matrix(name: str, default: Weight) -> Weight:
        return w.matrix(name) if w.has(name) else default

    # Split in float32: the two halves act on different inputs.
    eh_proj = GGUFWeights(shapes, gguf, "f32").matrix(f"{p}.nextn.eh_proj.weight")
    norm_name = f"{p}.nextn.shared_head_norm.weight"
    norm = RMSNorm(w.param(norm_name), args.rms_norm_eps) if w.has(norm_name) else net.output_norm
    head = TargetHead(
        optional_matrix(f"{p}.nextn.embed_tokens.weight", net.embed),
        optional_matrix(f"{p}.nextn.shared_head_head.weight", net.output),
    )
    return MTPNet(
        block=Block(args, w, layer),
        e_proj=eh_proj[:, :d],
        h_proj=eh_proj[:, d:],
        enorm=RMSNorm(w.param(f"{p}.nextn.enorm.weight"), args.rms_norm_eps),
        hnorm=RMSNorm(w.param(f"{p}.nextn.hnorm.weight"), args.rms_norm_eps),
        hc_head=net.hc_head,
        norm=norm,
        head=head,
    )


class MTPDrafter:
    """The ``Drafter`` over an ``MTPNet``: keeps the block's cache of committed rows."""

    name = "mtp"
    capture_layers: tuple[int, ...] = ()
    #: ``reset`` empties the cache: rows fed after the last draft are never read (drafter.py).
    reads_rows_after_last_draft = False

    def __init__(self, net: MTPNet, max_draft: int, margin: float = DEFAULT_MTP_MARGIN):
        if not 1 <= max_draft <= MAX_DRAFT:
            raise ValueError(f"max_draft must be in [1, {MAX_DRAFT}], got {max_draft}")
        self.net = net
        self.max_draft = max_draft
        self.margin = margin
        self.reset()

    def reset(self) -> None:
        self._cache = LayerCache()
        self._next_pos: int | None = None
        self._streams: mx.array | None = None  # the block's output streams of the last row
        self._logits: mx.array | None = None  # and its logits: the first draft token's
        # Observed rows the block has not run on yet (tokens, target streams, first position).
        self._pending: list[tuple[list[int], mx.array, int]] = []

    def observe(self, tokens: Sequence[int], next_token: int, rows: TargetRows) -> None:
        if len(tokens) != rows.n_rows:
            raise ValueError(f"{len(tokens)} tokens but {rows.n_rows} target rows")
        if self._next_pos is not None and rows.pos0 != self._next_pos:
            raise ValueError(
                f"rows start at position {rows.pos0}, expected {self._next_pos} "
                "(call reset() to start over)"
            )
        # Row j pairs the token at pos0 + j + 1 with the target's streams at pos0 + j. The
        # block runs on them at the next proposal: while the scheduler pauses drafting (or the
        # margin stops it), the committed rows of several cycles then cost one chunked pass
        # instead of one block pass per token.
        self._pending.append(([*tokens[1:], next_token], rows.head_input, rows.pos0 + 1))
        self._next_pos = rows.pos0 + rows.n_rows

    def _catch_up(self) -> None:
        if not self._pending:
            return
        following = mx.array([t for tokens, _, _ in self._pending for t in tokens], dtype=mx.int32)
        head_input = mx.concatenate([rows for _, rows, _ in self._pending])
        streams, logits, self._cache = self.net(
            following, head_input, self._pending[0][2], self._cache
        )
        self._streams, self._logits = streams[-1:], logits[-1]
        mx.eval(self._streams, self._logits, *ModelState([self._cache]).arrays())
        self._pending = []

    def propose(self, max_tokens: int) -> Draft:
        n = min(max_tokens, self.max_draft)
        if n <= 0:
            return Draft()
        self._catch_up()
        if self._logits is None:
            return Draft()
        tokens: list[int] = []
        streams, logits, cache = self._streams, self._logits, self._cache
        pos = self._next_pos + 1  # the first draft token's position
        while True:
            top2 = mx.topk(logits, 2)
            if float(mx.max(top2) - mx.min(top2)) < self.margin:
                break
            tokens.append(int(mx.argmax(logits)))
            if len(tokens) == n:
                break
            streams, rows, cache = self.net(
                mx.array(tokens[-1:], dtype=mx.int32), streams, pos, cache
            )
            logits, pos = rows[0], pos + 1
        return Draft(tokens)


def load_mtp(
    target: LoadedModel,
    path: str | Path | None = None,
    *,
    max_draft: int,
    margin: float = DEFAULT_MTP_MARGIN,
    check_target_id: bool = True,
    weights_dtype: str | None = None,
) -> MTPDrafter:
    """The MTP drafter for ``target``: from ds4's support file ``path``, or (no path) from the
    ``blk.{n_layer}.nextn.*`` block of the target's own file. Raises GGUFError for a file of
    another kind, a bad tensor, or (unless ``check_target_id`` is off) a support file trained
    for another target."""
    dtype = weights_dtype or target.weights_dtype
    if path is None:
        return MTPDrafter(_nextn_net(target, dtype), max_draft, margin)
    gguf = open_gguf(path)
    require_arch(gguf, LAYOUTS)
    if check_target_id:
        check_target(gguf, target.gguf)
    w = GGUFWeights(tensor_shapes(target.args), gguf, dtype)
    return MTPDrafter(_ds4_net(target.args, w, target_head(target)), max_draft, margin)


def net_from_arrays(args: ModelArgs, arrays: Mapping[str, mx.array], head: TargetHead) -> MTPNet:
    """An ``MTPNet`` on float32 arrays under ds4's names, used as they are (training)."""
    return _ds4_net(args, ArrayWeights(tensor_shapes(args), arrays), head)


def save_mtp(path: str | Path, target: LoadedModel, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ds4's MTP support file from float32 arrays under its names, recording ``target``'s
    identity."""
    write_support_gguf(Path(path), ARCH_MTP, identity_metadata(target.gguf), arrays)
