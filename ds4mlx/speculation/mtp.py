"""The legacy one-stage MTP drafter of DeepSeek-V4 (ds4's ``--mtp-model FILE`` / ``--mtp-draft N``).

The network is ``models.deepseek4_mtp.MTPNet`` (one DeepSeek-V4 block fed the target's mHC
streams). Committed rows use the target's streams; drafting continues autoregressively on the
block's own output streams, on a throwaway copy of the cache, and stops at ``max_draft`` tokens
or before the first token whose top-1 logit margin is below ``margin`` (``--mtp-margin``: a
close second choice means a likely rejection). Without one given, a sampled request takes ds4's
3.0 and a greedy one none (``MTPDrafter.for_request``).

Two layouts (their tensors: ``models.deepseek4_mtp``):

* ds4's separate support file (``general.architecture = deepseek4-mtp``, or ``deepseek4`` with
  only these tensors);
* llama.cpp's block inside the main GGUF (``deepseek4.nextn_predict_layers = 1``,
  ``blk.{n_layer}.nextn.*``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ds4mlx.gguf import GGUFError, open_gguf
from ds4mlx.models.cache import ModelState
from ds4mlx.models.deepseek4 import LayerCache
from ds4mlx.models.deepseek4_mtp import (
    MTPNet,
    ds4_net,
    nextn_net,
    nextn_prefix,
    nextn_shapes,
    tensor_shapes,
)
from ds4mlx.models.weights import GGUFWeights
from ds4mlx.speculation.config import DEFAULT_MTP_MARGIN
from ds4mlx.speculation.drafter import Draft, TargetRows
from ds4mlx.speculation.dspark import target_head
from ds4mlx.speculation.support_gguf import (
    check_target,
    identity_metadata,
    require_arch,
    write_support_gguf,
)

import mlx.core as mx
import numpy as np

if TYPE_CHECKING:
    from ds4mlx.loader import LoadedModel

ARCH_MTP = "deepseek4-mtp"
LAYOUTS = {ARCH_MTP: "ds4's MTP support file", "deepseek4": "ds4's MTP support file"}
# The most tokens one draft may hold (ds4's cap on --mtp-draft).
MAX_DRAFT = 16


class MTPDrafter:
    """The ``Drafter`` over an ``MTPNet``: keeps the block's cache of committed rows."""

    name = "mtp"
    capture_layers: tuple[int, ...] = ()
    #: ``reset`` empties the cache: rows fed after the last draft are never read (drafter.py).
    reads_rows_after_last_draft = False

    def __init__(self, net: MTPNet, max_draft: int, margin: float | None = None):
        if not 1 <= max_draft <= MAX_DRAFT:
            raise ValueError(f"max_draft must be in [1, {MAX_DRAFT}], got {max_draft}")
        self.net = net
        self.max_draft = max_draft
        #: The margin asked for (None: by request, ``for_request``), and the current request's
        #: when none is.
        self.margin = margin
        self._request_margin = DEFAULT_MTP_MARGIN
        attention = net.block.attn
        #: Rows the block attends over; None for a block that also keeps compressed rows of
        #: everything before (then every row feeds the cache).
        self._window: int | None = None if attention.ratio else attention.window
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

    @property
    def window(self) -> int | None:
        """A draft reads the block's cache of the last ``window`` committed rows (None: a
        block that also keeps compressed rows of everything before reads every row)."""
        return self._window

    def observe_tokens(self, tokens: Sequence[int], next_token: int) -> None:
        """``observe`` without the rows, which the loop leaves out only where at least
        ``window`` observed rows follow before the next draft (``DSparkDrafter``): the cache
        starts over after them, as the catch-up's own cut does."""
        if self._window is None or self._next_pos is None:
            raise ValueError("rows can be left out only after a first observe, within a window")
        self._cache, self._pending = LayerCache(), []
        self._streams = self._logits = None
        self._next_pos += len(tokens)

    def _catch_up(self) -> None:
        if not self._pending:
            return
        following = [t for tokens, _, _ in self._pending for t in tokens]
        head_input = mx.concatenate([rows for _, rows, _ in self._pending])
        pos0 = self._pending[0][2]
        self._pending = []
        cache = self._cache
        if self._window is not None and len(following) > self._window:
            # Only the last ``window`` rows matter: the block attends over a sliding window
            # alone, and a row's key depends on that row only. After a long scheduler pause
            # the catch-up (the probe's cost) stays that of one window, however long the
            # pause; the cache starts over from them, as if it had run on every row.
            cut = len(following) - self._window
            following, head_input, pos0 = following[cut:], head_input[cut:], pos0 + cut
            cache = LayerCache()
        # One pass; only the last row's logits are read (the next draft's first token), so
        # the head over the vocabulary runs for that row alone.
        streams, logits, self._cache = self.net(
            mx.array(following, dtype=mx.int32), head_input, pos0, cache, last_only=True, tiled=True
        )
        self._streams, self._logits = streams[-1:], logits[0]
        mx.eval(self._streams, self._logits, *ModelState([self._cache]).arrays())

    def for_request(self, greedy: bool) -> None:
        """The margin of the request about to be drafted for, where none was given: ds4's for a
        sampled request (whose drafts only ds4's acceptance rules judge), none for a greedy one,
        whose drafts the scheduler cuts by what it measures instead (each position's acceptance,
        the cycles' cost). A logit margin is on the scale of the model's logits: ds4's 3.0 suits
        DeepSeek-V4-Flash's, and on the tiny model it held back drafts the target accepts. The
        quick bench's chat prompts ran 0.99-1.03x with it and 1.09-1.19x without, and prose,
        where it stopped every draft, 1.02x against 1.24x (greedy, 16 rounds, in turns)."""
        self._request_margin = 0.0 if greedy else DEFAULT_MTP_MARGIN

    def _next_token(self, logits: mx.array) -> int | None:
        """The draft token of ``logits``, or None when its top-1 margin is below the request's
        margin; one read from the device for both."""
        margin = self._request_margin if self.margin is None else self.margin
        best = mx.argmax(logits)
        if margin <= 0:
            return int(best)
        top2 = mx.topk(logits, 2)
        gap = mx.max(top2) - mx.min(top2)
        mx.eval(best, gap)
        return None if float(gap) < margin else int(best)

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
        while (token := self._next_token(logits)) is not None:
            tokens.append(token)
            if len(tokens) == n:
                break
            streams, rows, cache = self.net(
                mx.array(tokens[-1:], dtype=mx.int32), streams, pos, cache, tiled=True
            )
            logits, pos = rows[0], pos + 1
        return Draft(tokens)


def load_mtp(
    target: LoadedModel,
    path: str | Path | None = None,
    *,
    max_draft: int,
    margin: float | None = None,
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
    return MTPDrafter(ds4_net(target.args, w, target_head(target)), max_draft, margin)


def _nextn_net(target: LoadedModel, weights_dtype: str) -> MTPNet:
    """``MTPNet`` on llama.cpp's ``blk.{n_layer}.nextn.*`` block inside the target's file."""
    args, gguf = target.args, target.gguf
    eh_proj = f"{nextn_prefix(args)}.nextn.eh_proj.weight"
    if not gguf.has_tensor(eh_proj):
        raise GGUFError(
            f"{gguf.path}: no MTP block ({nextn_prefix(args)}.nextn.*); give an MTP support file"
        )
    shapes = nextn_shapes(args)
    # eh_proj in float32: the network splits it in two.
    eh_proj_f32 = GGUFWeights(shapes, gguf, "f32").matrix(eh_proj)
    return nextn_net(args, GGUFWeights(shapes, gguf, weights_dtype), eh_proj_f32, target.network)


def save_mtp(path: str | Path, target: LoadedModel, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ds4's MTP support file from float32 arrays under its names, recording ``target``'s
    identity."""
    write_support_gguf(Path(path), ARCH_MTP, identity_metadata(target.gguf), arrays)
