"""Deciding how much of a draft the target accepts, given its verify logits.

Rows: ``logits[i]`` is the target's distribution for the position of ``draft[i]`` (row 0 follows
the last committed token); the row after the last draft token gives a bonus token when the whole
draft is accepted. Modes:

* greedy (temperature 0): accept the longest prefix equal to the target's argmax; the target's
  argmax at the first mismatch is committed.
* opportunistic (ds4's default at temperature > 0): a draft token equal to the greedy token is
  accepted directly; at the first mismatch the token is sampled with the user's settings. Biased
  towards greedy on purpose: more deterministic, faster.
* exact (``--mtp-exact-sampling``): point-mass rejection sampling. The draft token d is accepted
  with probability p(d) under the sampling distribution p; on rejection a token is drawn from p
  with d removed and renormalised. The output distribution is exactly p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from ds4mlx.engine.sampling import Sampler

import mlx.core as mx


class AcceptanceMode(str, Enum):
    OPPORTUNISTIC = "opportunistic"
    EXACT = "exact"


@dataclass(frozen=True)
class Verdict:
    accepted: int  # draft tokens accepted
    next_token: int  # the target's token after them (correction or bonus)


def exact_acceptance(probs: mx.array, drafts: mx.array) -> tuple[mx.array, mx.array]:
    """Vectorised point-mass rejection step over N independent rows.

    probs [N, V] (each row the sampling distribution), drafts [N]. Returns (accepted bool [N],
    replacement [N]): where not accepted, ``replacement`` is drawn from the row with the draft
    removed and renormalised (where accepted it is meaningless).
    """
    p_draft = mx.take_along_axis(probs, drafts[:, None], axis=-1)[:, 0]
    accepted = mx.random.uniform(shape=p_draft.shape) < p_draft
    residual = mx.put_along_axis(probs, drafts[:, None], mx.array(0.0), axis=-1)
    # A row whose whole mass sat on the draft always accepts; its residual is never used.
    replacement = mx.random.categorical(mx.log(residual))
    return accepted, replacement


def accept(
    logits: mx.array,
    draft: Sequence[int],
    sampler: Sampler,
    mode: AcceptanceMode = AcceptanceMode.OPPORTUNISTIC,
) -> Verdict:
    """How many of ``draft`` the target accepts, from its verify logits [len(draft) + 1, V].

    The rows are scored as plain decoding would score them, each penalised and masked by the
    sampler's constraint (``Sampler.penalized``) as if the draft tokens before it were
    committed; the committed tokens' log-probabilities are noted from those rows."""
    if logits.shape[0] != len(draft) + 1:
        raise ValueError(f"{logits.shape[0]} logit rows for a draft of {len(draft)} tokens")
    logits = sampler.penalized(logits, draft)
    verdict = _verdict(logits, draft, sampler, mode)
    sampler.note_logprobs(logits, [*draft[: verdict.accepted], verdict.next_token])
    return verdict


def _verdict(
    logits: mx.array, draft: Sequence[int], sampler: Sampler, mode: AcceptanceMode
) -> Verdict:
    if sampler.options.greedy:
        targets = mx.argmax(logits, axis=-1).tolist()
        n = 0
        while n < len(draft) and draft[n] == targets[n]:
            n += 1
        return Verdict(n, targets[n])
    if mode is AcceptanceMode.EXACT:
        for i, token in enumerate(draft):
            accepted, replacement = exact_acceptance(
                sampler.probabilities(logits[i : i + 1]), mx.array([token])
            )
            if not bool(accepted[0]):
                return Verdict(i, int(replacement[0]))
        return Verdict(len(draft), sampler.draw(logits[-1]))
    greedy = mx.argmax(logits, axis=-1).tolist()
    for i, token in enumerate(draft):
        if token != greedy[i]:
            return Verdict(i, sampler.draw(logits[i]))
    return Verdict(len(draft), sampler.draw(logits[-1]))
