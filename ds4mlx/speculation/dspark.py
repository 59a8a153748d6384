"""DSpark: DeepSeek's block drafter for DeepSeek-V4-Flash, loaded from its support GGUF.

The network (stages, context keys, the output, Markov and confidence heads) is
``models.deepseek4_dspark.DSparkNet``. The drafter here keeps each stage's ring of context keys
(the last ``sliding_window`` committed target rows, fed by ``observe``), drafts a block as one
compiled function over rings padded to the window (``DSparkNet.draft_tile``), and loads and
writes support files in either layout (``dspark_layout``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ds4mlx.gguf import GGUFError, open_gguf
from ds4mlx.kernels import grow_rows, inference
from ds4mlx.models.deepseek4 import ModelArgs
from ds4mlx.models.deepseek4_dspark import (
    EMBEDDING_TAP,
    BlockContext,
    BlockRows,
    DSparkConfig,
    DSparkNet,
    tensor_shapes,
)
from ds4mlx.models.deepseek4_mtp import TargetHead, stage_args
from ds4mlx.models.tiles import CompiledTiles
from ds4mlx.models.weights import GGUFWeights, RenamedWeights
from ds4mlx.speculation.drafter import Draft, TargetRows
from ds4mlx.speculation.dspark_layout import (
    ARCH_LLAMA,
    ds4_name,
    read_config,
    save_dspark_arrays,
)
from ds4mlx.speculation.support_gguf import check_target

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType

if TYPE_CHECKING:
    from ds4mlx.loader import LoadedModel


# --------------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------------


def _padded(ring: mx.array, rows: int) -> mx.array:
    """``ring`` [N, hd] after ``rows`` zero rows."""
    return (
        ring if rows <= 0 else mx.concatenate([mx.zeros((rows, ring.shape[1]), ring.dtype), ring])
    )


def rows_to_settle(observed_rows: Sequence[int], max_draft: int) -> int:
    """How many of the rows observed since a drafter's last draft (``observed_rows``: per
    ``observe``, in order) its ``settle_followed`` runs on now: all but the last observation's,
    of which at most a drafted cycle's most (``max_draft + 1``) are left, to be caught up with
    the next draft as a drafted cycle's committed rows are."""
    if not observed_rows:
        return 0
    return max(0, sum(observed_rows) - min(observed_rows[-1], max_draft + 1))


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
        #: Observed rows whose context keys are not computed yet: (taps, first position) per
        #: ``observe``. Keys are computed when the next block needs them, so that while the
        #: scheduler pauses drafting (a request may end paused) following the target costs
        #: nothing, and rows that slide out of the window before the next draft never cost.
        self._pending: list[tuple[mx.array, int]] = []

    def context(self) -> tuple[list[mx.array], int]:
        """Each stage's ring of context keys and the position of its first row, with every
        observed row in them."""
        self._catch_up()
        return self._rings, self._ring_pos0

    def observe(self, tokens: Sequence[int], next_token: int, rows: TargetRows) -> None:
        if len(tokens) != rows.n_rows:
            raise ValueError(f"{len(tokens)} tokens but {rows.n_rows} target rows")
        self.observe_taps(self.net.taps(tokens, rows.layers), rows.pos0, next_token)

    def observe_taps(self, taps: mx.array, pos0: int, next_token: int) -> None:
        """``observe`` given the committed rows' tapped features [n, len(target_layers) * D]
        (what llama.cpp injects into its draft cache) instead of the target's hidden states."""
        if self._next_pos is not None and pos0 != self._next_pos:
            raise ValueError(
                f"rows start at position {pos0}, expected {self._next_pos} "
                "(call reset() to start over)"
            )
        self._pending.append((taps, pos0))
        # Rows are dropped once the later ones fill the window: no draft will see them (the
        # rows before them in the rings are pushed out too).
        later = sum(t.shape[0] for t, _ in self._pending[1:])
        while len(self._pending) > 1 and later >= self.net.window:
            self._pending.pop(0)
            later -= self._pending[0][0].shape[0]
        self._next_pos, self._next_token = pos0 + taps.shape[0], int(next_token)

    @property
    def window(self) -> int:
        """A draft reads the rows of the last ``window`` committed tokens, none before."""
        return self.net.window

    def observe_tokens(self, tokens: Sequence[int], next_token: int) -> None:
        """``observe`` without the rows: the loop leaves out rows that at least ``window``
        observed rows will follow before the next draft (a long cost pause), since their taps
        and context keys would be computed for nothing. The rings start over after them."""
        if self._next_pos is None:
            raise ValueError("nothing observed yet")
        self._rings, self._pending = [], []
        self._next_pos, self._next_token = self._next_pos + len(tokens), int(next_token)

    def settle_followed(self) -> None:
        """Compute and evaluate the context keys of the observed rows now, but the last
        cycle's worth (``rows_to_settle``): the speculative loop calls it before timing the
        first drafted cycle after the prompt or a pause, so that the cycle costs what a steady
        one does."""
        settled = rows_to_settle([t.shape[0] for t, _ in self._pending], self.max_draft)
        if settled:
            self._catch_up(settled)
            mx.eval(self._rings)

    def _catch_up(self, rows: int | None = None) -> None:
        """The context keys of the pending rows (the first ``rows`` of them, the rest left
        pending; all by default, as a draft needs)."""
        if not self._pending:
            return
        # The pending rows follow one another: their keys in one pass (after a cost pause, a
        # window of four-row advances: 16 compiled calls took ~3 ms, one pass ~1.5).
        parts, pos0 = [t for t, _ in self._pending], self._pending[0][1]
        taps = mx.concatenate(parts) if len(parts) > 1 else parts[0]
        self._pending = []
        if rows is not None:
            taps, self._pending = taps[:rows], [(taps[rows:], pos0 + rows)]
        self._add_keys(taps, pos0)

    def _add_keys(self, taps: mx.array, pos0: int) -> None:
        """The context keys of rows ``pos0 ..`` into the rings, each kept to the window."""
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
        self._ring_pos0 = pos0 + n - kept

    def block(self, n_rows: int | None = None, *, confidences: bool = True) -> BlockRows:
        """The next block's first ``n_rows`` rows (default: all), unevaluated; needs an
        ``observe`` first. Without confidences (the speculative loop's drafts) the block runs
        as one compiled function over fixed shapes (``DSparkNet.draft_tile``): each ring is
        padded to the window with keys no row sees."""
        if self._next_token is None:
            raise ValueError("nothing observed yet")
        self._catch_up()
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
                flat = [
                    part
                    for stage in self.net.stage_contexts(contexts)
                    for part in (stage.keys, stage.mask, *stage.angles.on_device)
                ]
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
    """The target's embedding and output head, which its drafters borrow."""
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
