"""The MTP block inside the main GGUF as a drafter (ds4's ``--mtp``), GLM's built-in MTP above all.

GLM-5.3-Flash (``glm5-next``) carries a NextN block (``blk.{n_layer}.nextn.*``, see
``models.glm5_next.NextNPredictor``): its row for position t pairs the target's final hidden state
at t with the token at t + 1 and predicts the token at t + 2. As in ds4's GLM cycle it drafts one
token; the loop verifies [current, draft] in one target pass and commits up to two tokens.

The block keeps its own MLA cache, row t at position t, and sees committed rows only: ``observe``
feeds each committed position paired with the committed token after it (the last one with the
token the target sampled next), so the cache stays aligned with the target's committed rows, and
a rejected draft never enters it (its row is computed after the verify, with the token the target
chose instead). The logits of the last row fed give the next draft. The block runs on observed
rows when the next draft is asked for: while the scheduler pauses drafting, the rows of many
plain advances then cost one chunked pass, instead of one pass and a host sync per advance.
The draft stays on the device (``DeviceDrafter``): the loop queues the verify pass behind the
block before the host reads the token, so a cycle waits for the host once, not for the block
and then again for the verify.

A DeepSeek-V4 target with llama.cpp's ``blk.{n_layer}.nextn.*`` block gets the legacy MTP
drafter on that block, one token per cycle too (``speculation.mtp``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ds4mlx.gguf import GGUFError
from ds4mlx.models import glm5_next
from ds4mlx.speculation.drafter import Draft, Drafter, TargetRows

import mlx.core as mx

if TYPE_CHECKING:
    from ds4mlx.loader import LoadedModel


class NextNDrafter:
    """The ``Drafter`` over a glm5-next model's NextN block."""

    name = "nextn"
    max_draft = 1  # ds4's GLM cycle: one draft token, up to two tokens committed
    capture_layers: tuple[int, ...] = ()

    def __init__(self, network: glm5_next.Model):
        if network.mtp is None:
            raise ValueError("the model has no NextN (MTP) block")
        self.network = network
        self.reset()

    def reset(self) -> None:
        #: The NextN block's cache: one row per committed position, in order.
        self.mtp_state = self.network.new_mtp_state()
        #: The next draft token, int32 [1], queued on the device.
        self._draft: mx.array | None = None
        #: Observed rows the block has not run on yet: the target's final hidden states and,
        #: for each, the committed token after it.
        self._pending: list[tuple[mx.array, list[int]]] = []
        self._next_pos = 0

    def observe(self, tokens: Sequence[int], next_token: int, rows: TargetRows) -> None:
        if len(tokens) != rows.n_rows:
            raise ValueError(f"{len(tokens)} tokens but {rows.n_rows} target rows")
        if rows.pos0 != self._next_pos:
            raise ValueError(
                f"rows start at position {rows.pos0}, but the NextN cache holds "
                f"{self._next_pos} (call reset() to start over)"
            )
        # Row j pairs the target's hidden state at pos0 + j with the token at pos0 + j + 1.
        self._pending.append((rows.final_hidden, [*tokens[1:], next_token]))
        self._next_pos += rows.n_rows

    def catch_up(self) -> None:
        """Run the block on the observed rows it has not seen (``propose`` does it first)."""
        if not self._pending:
            return
        hidden = mx.concatenate([rows for rows, _ in self._pending])
        following = mx.array([t for _, tokens in self._pending for t in tokens], dtype=mx.int32)
        self._pending = []
        logits = self.network.mtp_logits(
            hidden, following, self.mtp_state, last_only=True, evaluate=False, tiled=True
        )
        self._draft = mx.argmax(logits[0], keepdims=True).astype(mx.int32)
        mx.async_eval(self._draft, *self.mtp_state.arrays())

    def propose(self, max_tokens: int) -> Draft:
        draft = self.propose_on_device(max_tokens)
        return Draft([] if draft is None else draft.tolist())

    def propose_on_device(self, max_tokens: int) -> mx.array | None:
        """``propose``'s token as a queued int32 [1] array, or None (see ``DeviceDrafter``)."""
        if max_tokens < 1:
            return None
        self.catch_up()
        return self._draft


def load_nextn(target: LoadedModel) -> Drafter:
    """The drafter of the MTP block inside ``target``'s own file (``--mtp``). Raises GGUFError
    when the file has none."""
    gguf, args = target.gguf, target.args
    block = f"blk.{args.num_layers}.nextn.eh_proj.weight"
    if not gguf.has_tensor(block):
        raise GGUFError(
            f"{gguf.path}: --mtp needs the MTP draft block inside the model, but "
            f"this {gguf.arch} file has none ({gguf.arch}.nextn_predict_layers = "
            f"{gguf.get(f'{gguf.arch}.nextn_predict_layers', 0)}, no tensor "
            f"'{block}')"
        )
    if gguf.arch == "deepseek4":
        from ds4mlx.speculation.mtp import load_mtp

        # No margin cut: one draft token every cycle, as with GLM's block.
        return load_mtp(target, None, max_draft=1, margin=0.0)
    if gguf.arch != glm5_next.ARCH:
        raise GGUFError(f"{gguf.path}: --mtp does not support architecture '{gguf.arch}'")
    return NextNDrafter(target.network)
