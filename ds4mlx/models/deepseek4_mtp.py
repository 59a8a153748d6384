"""DeepSeek-V4's legacy one-stage MTP network, and what the DeepSeek-V4 drafters share: blocks
built like the target's layers (``stage_args``, ``block_shapes``) and the borrowed head
(``TargetHead``). The drafter around it (its cache, the drafting policy, the files) is
``speculation.mtp``.

One DeepSeek-V4 block with its own KV cache. The row for the token at position q combines that
token with the target's mHC streams at q - 1:

    x = e_proj(enorm(embed(token))) + h_proj(hnorm(streams))   (per stream; the target's embed)

runs the block (causal sliding-window attention over the drafter's earlier rows), then
``hc_head`` -> norm -> the target's output head predicts the token at q + 1 (DeepSeek-V3's MTP
at depth 1).

Two sets of weights:

* ds4's support file: ``mtp.0.{e_proj,h_proj,enorm,hnorm,norm,hc_head_fn,hc_head_base,
  hc_head_scale}.weight`` plus the block as ``mtp.0.*`` named like the target's ``blk.{i}.*``
  (``tensor_shapes``, ``ds4_net``); hyper-parameters are the target's.
* llama.cpp's block inside the main GGUF (``deepseek4.nextn_predict_layers = 1``): the block is
  ``blk.{n_layer}.*`` with ``blk.{n_layer}.nextn.eh_proj`` ([D, 2D] on [enorm(e); hnorm(h)]),
  ``enorm``, ``hnorm`` and the optional ``shared_head_norm``, ``shared_head_head`` and
  ``embed_tokens`` (``nextn_shapes``, ``nextn_net``); the collapse is the target's
  ``output_hc_*``, the norm and head the target's unless the optional tensors replace them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ds4mlx import kernels
from ds4mlx.kernels import Weight, linear, take_rows
from ds4mlx.models.base import DECODE_TILE, pad_to_tile
from ds4mlx.models.deepseek4 import Block, LayerCache, Model, ModelArgs
from ds4mlx.models.deepseek4 import tensor_shapes as target_shapes
from ds4mlx.models.mhc import HyperHead
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.tiles import CompiledTiles
from ds4mlx.models.weights import ArrayWeights, RenamedWeights, Weights

import mlx.core as mx
import mlx.nn as nn

Shape = tuple[int, ...]

E_PROJ = "mtp.0.e_proj.weight"
H_PROJ = "mtp.0.h_proj.weight"
ENORM = "mtp.0.enorm.weight"
HNORM = "mtp.0.hnorm.weight"
NORM = "mtp.0.norm.weight"
HC_HEAD_FN = "mtp.0.hc_head_fn.weight"
HC_HEAD_BASE = "mtp.0.hc_head_base.weight"
HC_HEAD_SCALE = "mtp.0.hc_head_scale.weight"


@dataclass(frozen=True)
class TargetHead:
    """A token embedding and output head (the target's, which drafters borrow, or a drafter's
    own): a plain object, so the weights are not drafter parameters."""

    embed: Weight
    output: Weight


def stage_args(target: ModelArgs, n_stages: int) -> ModelArgs:
    """Hyper-parameters of drafter blocks built like the target's layers (ds4 hard-codes the
    real model's): ``n_stages`` layers with uncompressed sliding-window attention and
    score-routed experts (no hash routing), SwiGLU limits of the target's last layer."""
    return replace(
        target,
        num_layers=n_stages,
        compress_ratios=(0,) * n_stages,
        n_hash_layers=0,
        swiglu_limits=(target.swiglu_limits[-1],) * n_stages,
        swiglu_limits_shared=(target.swiglu_limits_shared[-1],) * n_stages,
    )


def block_shapes(args: ModelArgs) -> dict[str, Shape]:
    """The ``blk.*`` tensors of ``args``'s layers, name -> numpy-order shape."""
    return {name: shape for name, shape in target_shapes(args).items() if name.startswith("blk.")}


def ds4_block_name(name: str) -> str:
    """ds4's name (``mtp.*``) for a block tensor the model modules call ``blk.*``."""
    return "mtp." + name.removeprefix("blk.")


def tensor_shapes(args: ModelArgs) -> dict[str, Shape]:
    """Every tensor of ds4's MTP file for a target with ``args``, name -> shape."""
    d, hc = args.hidden_size, args.hc_mult
    return {ds4_block_name(n): s for n, s in block_shapes(stage_args(args, 1)).items()} | {
        E_PROJ: (d, d),
        H_PROJ: (d, d),
        ENORM: (d,),
        HNORM: (d,),
        NORM: (d,),
        HC_HEAD_FN: (hc, hc * d),
        HC_HEAD_BASE: (hc,),
        HC_HEAD_SCALE: (1,),
    }


def nextn_prefix(args: ModelArgs) -> str:
    """Where llama.cpp keeps the MTP block in the target's own file: after its last layer."""
    return f"blk.{args.num_layers}"


def nextn_shapes(args: ModelArgs) -> dict[str, Shape]:
    """The tensors of llama.cpp's MTP block inside a target with ``args`` (``nextn_prefix``),
    the optional ones included."""
    p, d = nextn_prefix(args), args.hidden_size
    block = block_shapes(replace(args, num_layers=args.num_layers + 1))
    return {n: s for n, s in block.items() if n.startswith(f"{p}.")} | {
        f"{p}.nextn.eh_proj.weight": (d, 2 * d),
        f"{p}.nextn.enorm.weight": (d,),
        f"{p}.nextn.hnorm.weight": (d,),
        f"{p}.nextn.shared_head_norm.weight": (d,),
        f"{p}.nextn.shared_head_head.weight": (args.vocab_size, d),
        f"{p}.nextn.embed_tokens.weight": (args.vocab_size, d),
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
        self._input_tiles = CompiledTiles(self._tile_input)
        self._head_tiles = CompiledTiles(self._tile_head)

    def __call__(
        self,
        tokens: mx.array,
        streams: mx.array,
        pos0: int,
        cache: LayerCache,
        last_only: bool = False,
        tiled: bool = False,
    ) -> tuple[mx.array, mx.array, LayerCache]:
        """Rows for ``tokens`` [T] at positions pos0 .., each with the streams [T, hc, D] of the
        position before: (the block's output streams, logits [T, vocab], the updated cache).
        ``last_only``: the logits of the last row alone, [1, vocab] (the rows before it only
        fill the cache; the head over the vocabulary is most of a row's cost). ``tiled``:
        inference, so that fewer than ``DECODE_TILE`` rows (a draft step, a cycle's catch-up)
        run as a compiled decode tile (``tile``)."""
        if tiled and tokens.shape[0] < DECODE_TILE:
            return self.tile(tokens, streams, pos0, cache, last_only)
        embedded = take_rows(self.head.embed, tokens).astype(mx.float32)
        x = linear(self.enorm(embedded), self.e_proj)[:, None, :]
        x = x + linear(self.hnorm(streams), self.h_proj)
        x, cache = self.block(x, tokens, pos0, cache)
        head_rows = x[-1:] if last_only else x
        return x, linear(self.norm(self.hc_head(head_rows)), self.head.output), cache

    def tile(
        self, tokens: mx.array, streams: mx.array, pos0: int, cache: LayerCache, last_only: bool
    ) -> tuple[mx.array, mx.array, LayerCache]:
        """``__call__`` (inference) of fewer than ``DECODE_TILE`` rows as a fixed-shape decode
        tile: the input projections and the head compiled, the block on the target's compiled
        tile path (``Block.tile``): run as a chunk, the block's uncompiled graph and masked
        attention cost about a third of a target step per draft token. Its rows equal the
        chunk path's up to float rounding."""
        n_real = tokens.shape[0]
        padded = pad_to_tile(tokens)
        streams = mx.pad(streams, ((0, DECODE_TILE - n_real), (0, 0), (0, 0)))
        with kernels.inference():
            x = self._input_tiles.get(n_real)(padded, streams)
            x, cache = self.block.tile(x, padded, pos0, cache, n_real)
            # The block may leave its streams flat, [T, hc * D] (``Block._tile_ffn``).
            x = x[:n_real].reshape(n_real, *streams.shape[1:])
            head_rows = 1 if last_only else n_real
            logits = self._head_tiles.get(head_rows)(x[n_real - head_rows :])
        return x, logits, cache

    def _tile_input(self, tokens: mx.array, streams: mx.array, n_real: int) -> mx.array:
        embedded = take_rows(self.head.embed, tokens).astype(mx.float32)
        x = linear(self.enorm(embedded), self.e_proj, n_real)[:, None, :]
        return x + linear(self.hnorm(streams), self.h_proj)

    def _tile_head(self, x: mx.array, n_real: int) -> mx.array:
        return linear(self.norm(self.hc_head(x, n_real)), self.head.output, n_real)


def ds4_net(args: ModelArgs, w: Weights, head: TargetHead) -> MTPNet:
    """``MTPNet`` on weights ``w`` under ds4's names (``tensor_shapes``) for a target with
    ``args`` whose embedding and output are ``head``."""
    eps = args.rms_norm_eps
    block = Block(stage_args(args, 1), RenamedWeights(w, ds4_block_name), 0)
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


def nextn_net(args: ModelArgs, w: Weights, eh_proj: Weight, target: Model) -> MTPNet:
    """``MTPNet`` on llama.cpp's block inside ``target`` (with ``args``): ``w`` holds its
    tensors (``nextn_shapes``), ``eh_proj`` is ``nextn.eh_proj`` in float32 (split in two
    here: the halves act on different inputs)."""
    p, d, eps = nextn_prefix(args), args.hidden_size, args.rms_norm_eps

    def optional_matrix(name: str, default: Weight) -> Weight:
        return w.matrix(name) if w.has(name) else default

    norm_name = f"{p}.nextn.shared_head_norm.weight"
    norm = RMSNorm(w.param(norm_name), eps) if w.has(norm_name) else target.output_norm
    head = TargetHead(
        optional_matrix(f"{p}.nextn.embed_tokens.weight", target.embed),
        optional_matrix(f"{p}.nextn.shared_head_head.weight", target.output),
    )
    return MTPNet(
        block=Block(args, w, args.num_layers),
        e_proj=eh_proj[:, :d],
        h_proj=eh_proj[:, d:],
        enorm=RMSNorm(w.param(f"{p}.nextn.enorm.weight"), eps),
        hnorm=RMSNorm(w.param(f"{p}.nextn.hnorm.weight"), eps),
        hc_head=target.hc_head,
        norm=norm,
        head=head,
    )


def net_from_arrays(args: ModelArgs, arrays: Mapping[str, mx.array], head: TargetHead) -> MTPNet:
    """An ``MTPNet`` on float32 arrays under ds4's names, used as they are (training)."""
    return ds4_net(args, ArrayWeights(tensor_shapes(args), arrays), head)
