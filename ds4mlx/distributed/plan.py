"""Which slice of which tensor each rank holds (tensor parallel attention, expert parallel MoE).

A DeepSeek-V4 layer is split so that every rank's work ends in a partial sum of the residual
update, which one ``all_sum`` completes:

* Attention: the output groups of the grouped low-rank output projection (``wo_a``) are split
  into contiguous ranges, and with them the heads that feed them (``wq_b`` rows, the per-head
  sinks). ``wo_b`` is row-parallel: each rank holds the columns its groups produce and returns a
  partial [T, D] that the ranks sum. The one shared key/value head, the compressors and the
  lightning indexer are small and are replicated (every rank computes them identically).
* MoE: the routed experts are split into contiguous expert ranges. The router, the selection
  bias and the hash table are replicated, so every rank chooses the same experts; each computes
  the contributions of the chosen experts it holds and the ranks sum them. The shared expert is
  replicated and added after the sum.
* Embeddings, mHC mixes, norms and the output head are replicated (the head's logits are then
  identical on every rank, which keeps all ranks' sampling decisions in step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ds4mlx.models.deepseek4 import ModelArgs

Shape = tuple[int, ...]

# (tensor name pattern, the axis of the stored numpy-order shape that is split). Axis 0 splits
# whole rows (or whole experts / groups of a stack), which are contiguous bytes in the file;
# axis -1 splits each row (wo_b's input columns), whole quantization blocks at a time.
_SHARDED: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"blk\.\d+\.attn_q_b\.weight"), 0),
    (re.compile(r"blk\.\d+\.attn_sinks\.weight"), 0),
    (re.compile(r"blk\.\d+\.attn_output_a\.weight"), 0),
    (re.compile(r"blk\.\d+\.attn_output_b\.weight"), -1),
    (re.compile(r"blk\.\d+\.ffn_(gate|up|down)_exps\.weight"), 0),
)


class ShardError(ValueError):
    """The model cannot be split over this many ranks (or a tensor cannot be sliced)."""


@dataclass(frozen=True)
class TensorSlice:
    """Rank ``rank`` of ``size`` holds share ``rank`` of ``size`` equal parts along ``axis``."""

    axis: int
    rank: int
    size: int

    def bounds(self, length: int) -> tuple[int, int]:
        part = length // self.size
        return self.rank * part, (self.rank + 1) * part

    def shape(self, shape: Shape) -> Shape:
        axis = self.axis % len(shape)
        lo, hi = self.bounds(shape[axis])
        return (*shape[:axis], hi - lo, *shape[axis + 1 :])


@dataclass(frozen=True)
class ShardPlan:
    """How a deepseek4 model is split over ``size`` ranks, seen from rank ``rank``."""

    rank: int
    size: int
    args: ModelArgs  # the whole model's hyper-parameters

    @classmethod
    def for_model(cls, args: ModelArgs, rank: int, size: int) -> ShardPlan:
        """Raises ShardError naming the counts when the model does not split evenly."""
        if size < 1 or not 0 <= rank < size:
            raise ShardError(f"rank {rank} is not in a group of {size}")
        problems = []
        if args.o_groups % size:
            problems.append(f"{args.o_groups} attention output groups ({args.num_heads} heads)")
        if args.n_experts % size:
            problems.append(f"{args.n_experts} routed experts")
        if problems:
            raise ShardError(
                f"cannot split {' and '.join(problems)} evenly over {size} ranks; "
                f"use a world size that divides them"
            )
        return cls(rank, size, args)

    @property
    def local_args(self) -> ModelArgs:
        """The hyper-parameters of this rank's attention: its heads and output groups."""
        return replace(
            self.args,
            num_heads=self.args.num_heads // self.size,
            o_groups=self.args.o_groups // self.size,
        )

    @property
    def experts(self) -> tuple[int, int]:
        """The global ids [lo, hi) of the routed experts this rank holds."""
        return TensorSlice(0, self.rank, self.size).bounds(self.args.n_experts)

    def tensor_slice(self, name: str) -> TensorSlice | None:
        """The slice of tensor ``name`` this rank holds; None for a replicated tensor."""
        layer = re.match(r"blk\.(\d+)\.", name)
        if layer is None or int(layer.group(1)) >= self.args.num_layers:
            return None  # not a main layer (an MTP block stays whole: drafters read it)
        for pattern, axis in _SHARDED:
            if pattern.fullmatch(name):
                return TensorSlice(axis, self.rank, self.size)
        return None

    def local_shapes(self, shapes: dict[str, Shape]) -> dict[str, Shape]:
        """The shape table of this rank's tensors (``deepseek4.tensor_shapes`` sliced)."""
        out = {}
        for name, shape in shapes.items():
            cut = self.tensor_slice(name)
            out[name] = shape if cut is None else cut.shape(shape)
        return out
