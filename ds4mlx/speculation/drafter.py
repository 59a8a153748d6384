"""The one interface every drafter (DSpark, legacy MTP, GLM nextn) implements.

The speculative loop owns the target session. After the target commits rows (prefill or an
accepted verify prefix) it tells the drafter what was committed and the target's hidden states for
those rows (``observe``); then it asks for a draft continuing after the last committed token
(``propose``). Drafters keep their own context state (DSpark's per-stage rings of target rows,
an MTP block's KV cache); ``reset`` starts a new sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import mlx.core as mx


@dataclass(frozen=True)
class TargetRows:
    """Target hidden states of committed rows at positions ``pos0 .. pos0 + n - 1``.

    ``layers[i]``: mean over the mHC streams after target layer i, [n, D], for each layer the
    drafter asked for in ``capture_layers``; ``head_input``: the streams after the last layer,
    [n, hc, D]; ``final_hidden``: the output head's input, [n, D].
    """

    pos0: int
    layers: dict[int, mx.array]
    head_input: mx.array
    final_hidden: mx.array

    @property
    def n_rows(self) -> int:
        return int(self.final_hidden.shape[0])

    def take(self, n: int) -> TargetRows:
        """The first ``n`` rows (the accepted prefix of a verify pass)."""
        return TargetRows(
            self.pos0,
            {i: h[:n] for i, h in self.layers.items()},
            self.head_input[:n],
            self.final_hidden[:n],
        )


@dataclass
class Draft:
    """Proposed tokens for positions after the last committed token, best first.

    ``confidences`` (DSpark's confidence head, one per token) may be None.
    """

    tokens: list[int] = field(default_factory=list)
    confidences: list[float] | None = None


class Drafter(Protocol):
    name: str
    #: The most tokens one ``propose`` may return (DSpark: the block size; MTP: ``--mtp-draft``).
    max_draft: int
    #: Target layers whose stream-mean hidden states ``observe`` must receive (DSpark taps).
    capture_layers: tuple[int, ...]

    def reset(self) -> None:
        """Forget all context: a new sequence starts."""

    def observe(self, tokens: Sequence[int], next_token: int, rows: TargetRows) -> None:
        """The target committed ``tokens`` (positions rows.pos0 ...); ``next_token`` is the token
        it sampled after them, not yet fed to the target (the next draft continues after it)."""

    def propose(self, max_tokens: int) -> Draft:
        """Up to ``min(max_tokens, max_draft)`` tokens following ``next_token``."""


# Optional: a drafter with ``needs_target_rows = False`` (prompt lookup) drafts from tokens
# alone, so the loop decodes its draftless cycles as plain decoding does, pipelined, and hands
# ``observe`` rows without hidden states. One with ``reads_rows_after_last_draft = False``
# (DSpark, MTP: ``reset`` starts them over at the next prefill) never reads the rows fed after
# its last draft, so once no cycle drafts any more (the end of the token budget) the loop
# decodes the rest that way too, without observing. One with a ``window`` (DSpark: a draft
# reads the rows of the last ``window`` committed tokens) and ``observe_tokens(tokens,
# next_token)`` is not shown the rows of a plain advance that at least ``window`` more
# committed tokens follow before the next draft (a long cost pause): the target skips
# computing what the drafter would never read. One with ``settle_followed()`` (DSpark) runs
# then on the rows followed since its last draft, all but one cycle's worth
# (``dspark.rows_to_settle``), so that the loop can time the first drafted cycle after the
# prompt or a pause as a steady one. One with ``for_request(greedy)`` (legacy MTP: its margin)
# is told at each prefill whether the request decodes greedily, which the scheduler judges by
# measured cost, or samples, which ds4's rules alone judge.
# Legacy MTP and GLM's NextN have none: settled so, their catch-ups ran as two block passes
# instead of one, and NextN's probes kept it drafting on prose at a loss (0.964x against 1.018x,
# MTP prose 0.95-0.97x against 0.98-0.99x; four interleaved quick benches).


class DeviceDrafter(Drafter, Protocol):
    """A drafter that can also leave its draft on the device, so that the verify pass is queued
    behind it before the host reads a token (``SpeculativeDecoder`` uses it when no confidence
    cut needs the draft on the host first)."""

    def propose_on_device(self, max_tokens: int) -> mx.array | None:
        """``propose``'s tokens as a queued int32 [n] array (no confidences), or None when
        there is nothing to draft."""
