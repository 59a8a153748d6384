"""What every architecture's ``Model`` shares: the decode tile, the constructors from a GGUF file
or from arrays, and ``forward``'s loop (embed, run the blocks, capture, head, evaluate).

An architecture subclasses ``TiledModel`` with its ``ModelArgs`` and ``tensor_shapes``, builds
its blocks in ``__init__`` and says how they run over a chunk (``_layers``) and over a decode
tile (``_tile_layers``), and how the head runs (``head``, ``_tile_head``); everything in between
is here, once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar, Literal, TypeVar, overload

from ds4mlx.experts import ExpertStore
from ds4mlx.gguf import GGUFFile
from ds4mlx.kernels import Weight, linear, take_rows
from ds4mlx.models.cache import ModelState
from ds4mlx.models.mhc import hc_mean
from ds4mlx.models.outputs import ForwardOutput, capture_set
from ds4mlx.models.weights import ArrayWeights, GGUFWeights, Shape

import mlx.core as mx
import mlx.nn as nn

# Chunks of fewer than this many tokens (one-token decode and speculative verify) run as a tile
# of exactly this many rows, padded with dummy tokens, so that every matmul sees the same shape
# and each row's result is bit-identical however many real rows the chunk had. The parts whose
# shapes would depend on the chunk (attention and its caches, a recurrence, routed experts) run
# row by row on the real rows only, and the padding rows never enter a cache. This is what makes
# greedy speculative output equal plain greedy output byte for byte.
DECODE_TILE = 8
# The most rows a chunk may have for its logits to be bit-identical to one-token decode: the
# largest decode tile with a real row in every place, so the largest verify pass.
VERIFY_ROWS = DECODE_TILE - 1
# Attention score elements materialised per query block; longer inputs are processed in blocks.
SCORE_BUDGET = 1 << 24

_M = TypeVar("_M", bound="TiledModel")


def pad_to_tile(tokens: mx.array) -> mx.array:
    """int32 ``tokens`` (fewer than DECODE_TILE) padded with dummy tokens (0) to DECODE_TILE:
    one primitive (zeros and a concatenation were three)."""
    return mx.pad(tokens, (0, DECODE_TILE - tokens.shape[0]))


class TiledModel(nn.Module):
    """The architecture-neutral part of a model (the interface ``ds4mlx.models`` describes).

    A subclass sets ``args_class`` and ``tensor_shapes``, holds ``args``, ``embed`` (the token
    embeddings) and ``blocks`` (each with ``new_cache()``), and implements ``_layers``,
    ``_tile_layers`` and ``head_input``, and holds the LM head's matrix as ``output``.
    """

    #: The most rows a chunk may have for its logits to be bit-identical to one-token decode.
    max_invariant_rows = VERIFY_ROWS
    #: The architecture's hyper-parameters (a dataclass with ``from_gguf``).
    args_class: ClassVar[Any]
    args: Any
    embed: Any
    blocks: list[Any]
    output: Weight

    @staticmethod
    def tensor_shapes(args: Any) -> dict[str, Shape]:
        """Every tensor of the architecture, name -> shape (its module's ``tensor_shapes``)."""
        raise NotImplementedError

    @classmethod
    def from_gguf(
        cls: type[_M],
        gguf_file: GGUFFile,
        weights_dtype: str | None = None,
        expert_store: ExpertStore | None = None,
    ) -> _M:
        """Build the model from an opened GGUF file.

        ``weights_dtype`` ("f32" or "native") is how matmul weights are held (see
        ``ds4mlx.gguf.quants``); None leaves the choice to ``GGUFFile.load_weight``.
        ``expert_store`` holds the routed experts (default: resident).
        """
        args = cls.args_class.from_gguf(gguf_file)
        weights = GGUFWeights(cls.tensor_shapes(args), gguf_file, weights_dtype, expert_store)
        return cls(args, weights)

    @classmethod
    def from_arrays(cls: type[_M], args: Any, arrays: Mapping[str, mx.array]) -> _M:
        """Build the model on float32 arrays named as in ``tensor_shapes(args)`` (integer arrays
        where a table holds indices; tensors the architecture marks optional may be left out),
        used as they are: training differentiates through them."""
        return cls(args, ArrayWeights(cls.tensor_shapes(args), arrays))

    def new_state(self) -> ModelState:
        """An empty per-sequence state: every block's empty cache."""
        return ModelState([block.new_cache() for block in self.blocks])

    # The architecture's part of ``forward``.

    def _layers(
        self, x: mx.array, tokens: mx.array, pos0: int, caches: list[Any]
    ) -> Iterator[mx.array]:
        """Runs the blocks over the streams ``x`` of a chunk (prefill) entering the first one,
        replacing each ``caches[i]`` by block i's new cache, and yields the streams after each
        block."""
        raise NotImplementedError

    def _tile_layers(
        self, x: mx.array, tokens: mx.array, pos0: int, caches: list[Any], n_real: int
    ) -> Iterator[mx.array]:
        """``_layers`` of a decode tile whose first ``n_real`` rows are real (DECODE_TILE)."""
        raise NotImplementedError

    def head_input(self, x: mx.array, real_rows: int | None = None) -> mx.array:
        """The streams after the last block [T, hc, D] -> the LM head's input [T, D].
        ``real_rows``: only the first rows are needed (a decode tile's real rows)."""
        raise NotImplementedError

    def head(
        self, x: mx.array, real_rows: int | None = None, last_only: bool = False
    ) -> tuple[mx.array, mx.array]:
        """The streams after the last block [T, hc, D] -> (the LM head's input [T, D], logits
        [T, vocab]). ``last_only``: the logits of the last row alone, [1, vocab]: a prefill
        that only samples the next token skips the vocabulary-wide product of every other row
        (129,280 rows of the head for each prompt token at DeepSeek-V4-Flash's width)."""
        final = self.head_input(x, real_rows)
        if last_only:
            return final, linear(final[-1:], self.output)
        return final, linear(final, self.output, real_rows)

    def _tile_head(self, x: mx.array, n_real: int) -> tuple[mx.array, mx.array]:
        """``head`` of a decode tile whose first ``n_real`` rows are real."""
        return self.head(x, n_real)

    def _tile_context(self) -> AbstractContextManager[Any]:
        """What a decode tile runs in (none here; an architecture may run its tiles as
        inference only, ``kernels.inference``)."""
        return nullcontext()

    def _embed(self, tokens: mx.array) -> mx.array:
        """The hc residual streams [T, hc, D] entering the first block: the token embeddings."""
        h = take_rows(self.embed, tokens).astype(mx.float32)
        return mx.broadcast_to(h[:, None, :], (h.shape[0], self.args.hc_mult, h.shape[1]))

    @overload
    def forward(
        self,
        tokens: mx.array,
        state: ModelState,
        *,
        capture_layers: Sequence[int] = (),
        return_hidden: Literal[False] = False,
        evaluate: bool = True,
        asynchronous: bool = False,
        all_logits: bool = True,
    ) -> mx.array: ...

    @overload
    def forward(
        self,
        tokens: mx.array,
        state: ModelState,
        *,
        capture_layers: Sequence[int] = (),
        return_hidden: Literal[True],
        evaluate: bool = True,
        asynchronous: bool = False,
        all_logits: bool = True,
    ) -> ForwardOutput: ...

    def forward(
        self,
        tokens: mx.array,
        state: ModelState,
        *,
        capture_layers: Sequence[int] = (),
        return_hidden: bool = False,
        evaluate: bool = True,
        asynchronous: bool = False,
        all_logits: bool = True,
    ) -> mx.array | ForwardOutput:
        """Logits [T, vocab] of int32 ``tokens`` [T] continuing ``state``, which it advances.
        With ``all_logits=False`` only the last token's, [1, vocab] (a prefill that samples the
        next token); the hidden states are every token's either way.

        With ``return_hidden`` a ``ForwardOutput`` also carries the hidden states of
        ``capture_layers`` and of the head. ``evaluate=False`` returns the results (and leaves
        the caches) unevaluated, for callers that transform the computation (training takes
        gradients through it).
        """
        capture = capture_set(capture_layers, return_hidden, len(self.blocks))
        tokens = tokens.astype(mx.int32).reshape(-1)
        pos0, n = state.pos, tokens.shape[0]
        caches = list(state.layers)
        captured: dict[int, mx.array] = {}
        # Short chunks (decode, verify) run as a fixed-shape tile; see DECODE_TILE.
        tile = evaluate and n < DECODE_TILE
        if tile:
            tokens = pad_to_tile(tokens)
        with self._tile_context() if tile else nullcontext():
            x = self._embed(tokens)
            if tile:
                layers = self._tile_layers(x, tokens, pos0, caches, n)
            else:
                layers = self._layers(x, tokens, pos0, caches)
            for i, after in enumerate(layers):
                x = after
                if i in capture:
                    captured[i] = hc_mean(x)[:n]
            if tile:  # the compiled tile's head: every real row, sliced below
                final, logits = self._tile_head(x, n)
            else:
                final, logits = self.head(x, last_only=not all_logits)
        x, final = x[:n], final[:n]
        if all_logits:
            logits = logits[:n]
        elif tile:
            logits = logits[n - 1 : n]

        # A tile's padding rows never entered the caches.
        state.layers, state.pos = caches, pos0 + n
        if evaluate:
            # One evaluation for the outputs and the new caches keeps the caches' graphs short.
            # ``asynchronous`` only queues it: the host may build the next step meanwhile
            # (pipelined decoding, ``engine.generate``), even on a token it has not read.
            (mx.async_eval if asynchronous else mx.eval)(
                logits, *captured.values(), x, final, *state.arrays()
            )
        if not return_hidden:
            return logits
        return ForwardOutput(logits, captured, x, final)
