"""A rank's tensors: the replicated ones whole, the sharded ones sliced from the memory map.

A slice is cut from ``GGUFReader``'s memory-mapped view before any conversion, so a rank only
touches (and converts) the file pages of its own part: whole rows of a matrix or whole experts
of a stack are one contiguous byte range; a column range (``wo_b``) is a strided view covering
just those columns of every row.
"""

from __future__ import annotations

from collections.abc import Mapping

from ds4mlx.distributed.group import RankGroup
from ds4mlx.distributed.plan import Shape, ShardError, ShardPlan, TensorSlice
from ds4mlx.experts import ExpertStore
from ds4mlx.gguf import GGUFError, GGUFFile, quants
from ds4mlx.kernels import Weight
from ds4mlx.models.weights import GGUFWeights

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


def slice_raw(
    raw: np.ndarray,
    qtype: GGMLQuantizationType,
    shape: Shape,
    cut: TensorSlice,
    name: str = "tensor",
) -> np.ndarray:
    """The part ``cut`` of a tensor's stored bytes ``raw`` (as ``GGUFFile.raw`` maps them: the
    outer dims are element dims, the last one is bytes for block-quantized types).

    Raises ShardError when a column cut would split a quantization block.
    """
    axis = cut.axis % len(shape)
    lo, hi = cut.bounds(shape[axis])
    if axis < len(shape) - 1:
        return raw[(slice(None),) * axis + (slice(lo, hi),)]
    block, _ = GGML_QUANT_SIZES[qtype]
    if lo % block or hi % block:
        raise ShardError(
            f"{name}: {qtype.name} blocks of {block} values straddle the shard "
            f"boundary at column {lo if lo % block else hi}"
        )
    # Stored units (bytes or elements) per block of values along the last axis.
    per_block = raw.shape[-1] * block // shape[-1]
    return raw[..., lo // block * per_block : hi // block * per_block]


class ShardedGGUFWeights(GGUFWeights):
    """``GGUFWeights`` of one rank: tensors that ``plan`` splits are read as this rank's slice
    and checked against the sliced shape table. ``ranks`` is the group the sharded modules
    built from these weights sum their partial results over."""

    def __init__(
        self,
        shapes: Mapping[str, Shape],
        gguf: GGUFFile,
        mode: str | None,
        plan: ShardPlan,
        ranks: RankGroup,
        expert_store: ExpertStore | None = None,
    ):
        super().__init__(plan.local_shapes(dict(shapes)), gguf, mode, expert_store)
        self.plan = plan
        self.ranks = ranks

    def _shape(self, name: str) -> Shape | None:
        stored = super()._shape(name)
        cut = self.plan.tensor_slice(name)
        return stored if stored is None or cut is None else cut.shape(stored)

    def _part(self, name: str) -> tuple[np.ndarray, GGMLQuantizationType, Shape] | None:
        """(this rank's stored bytes, type, shape) of a sharded tensor; None when replicated."""
        cut = self.plan.tensor_slice(name)
        if cut is None:
            return None
        stored = self.gguf.tensor_shape(name)
        qtype = self.gguf.tensor_type(name)
        if qtype not in quants.SUPPORTED_TYPES:
            raise GGUFError(
                f"{self.gguf.path}: unsupported tensor type {qtype.name} in tensor '{name}'"
            )
        raw = slice_raw(self.gguf.raw(name), qtype, stored, cut, name)
        return raw, qtype, cut.shape(stored)

    def _matrix(self, name: str) -> Weight:
        part = self._part(name)
        if part is None:
            return super()._matrix(name)
        weight = quants.load_weight(*part, self.mode)
        self.gguf.mark_loaded(name, part[0].nbytes)  # the slice is copied: unmap, report
        return weight

    def _floats(self, name: str) -> mx.array:
        part = self._part(name)
        if part is None:
            return super()._floats(name)
        floats = mx.array(quants.dequantize(*part))
        self.gguf.mark_loaded(name, part[0].nbytes)
        return floats
