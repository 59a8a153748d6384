"""Measure a drafter's greedy acceptance without running the speculative loop.

The target's greedy continuation of a prompt is decoded once, then one target pass over prompt +
continuation gives the hidden rows of every position. The drafter is driven as the loop would
drive it at temperature 0: propose after the last committed token, accept the longest prefix that
equals the continuation, commit it plus the target's own next token, observe those rows. Verify
passes give the same rows as that single pass up to float rounding, so this measures what the
loop would see, cheaply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ds4mlx.speculation.drafter import Drafter, TargetRows

import mlx.core as mx

if TYPE_CHECKING:
    from ds4mlx.loader import LoadedModel


@dataclass
class ProbeStats:
    cycles: int = 0  # drafted verify passes
    drafted: int = 0
    accepted: int = 0

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify of a draft (accepted drafts + the target's own),
        as ``SpeculativeStats.tau`` counts them."""
        return (self.accepted + self.cycles) / self.cycles if self.cycles else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def add(self, other: ProbeStats) -> None:
        self.cycles += other.cycles
        self.drafted += other.drafted
        self.accepted += other.accepted


def greedy_continuation(
    target: LoadedModel, prompt: Sequence[int], n: int, *, exact: bool = True
) -> list[int]:
    """The target's ``n`` greedy tokens after ``prompt``, decoded one token at a time as plain
    generation does. ``exact=False`` skips the decode tiles that make those steps bit-identical
    to a batched verify pass: about twice as fast, but a near tie between two logits may go the
    other way (good enough for training data)."""
    net = target.network
    state = net.new_state()
    tokens: list[int] = []
    chunk = list(prompt)
    while True:
        logits = net.forward(mx.array(chunk, dtype=mx.int32), state, evaluate=exact)
        if not exact:
            mx.eval(logits, *state.arrays())
        tokens.append(int(mx.argmax(logits[-1])))
        if len(tokens) == n:
            return tokens
        chunk = tokens[-1:]


def rows_between(out, start: int, stop: int) -> TargetRows:
    """The rows ``start .. stop - 1`` of a target pass from position 0 (a ForwardOutput)."""
    return TargetRows(
        start,
        {i: h[start:stop] for i, h in out.layers.items()},
        out.head_input[start:stop],
        out.final_hidden[start:stop],
    )


def probe_greedy(
    target: LoadedModel,
    drafter: Drafter,
    prompt: Sequence[int],
    continuation: Sequence[int],
    confidence_threshold: float = 0.0,
) -> ProbeStats:
    """Drive ``drafter`` along ``prompt`` + the target's greedy ``continuation`` and count what a
    temperature-0 speculative loop would draft and accept (drafts cut at the first confidence
    under ``confidence_threshold``, when the drafter gives confidences)."""
    sequence = [*prompt, *continuation]
    out = target.network.forward(
        mx.array(sequence, dtype=mx.int32),
        target.network.new_state(),
        capture_layers=drafter.capture_layers,
        return_hidden=True,
    )
    stats = ProbeStats()
    drafter.reset()
    drafter.observe(prompt, continuation[0], rows_between(out, 0, len(prompt)))
    done = len(prompt)  # committed positions; sequence[done] is the next token, not yet fed
    while done < len(sequence) - 1:
        draft = drafter.propose(len(sequence) - 1 - done)
        tokens = draft.tokens
        if draft.confidences is not None and confidence_threshold:
            kept = next(
                (i for i, c in enumerate(draft.confidences) if c < confidence_threshold),
                len(tokens),
            )
            tokens = tokens[:kept]
        accepted = 0
        while accepted < len(tokens) and tokens[accepted] == sequence[done + 1 + accepted]:
            accepted += 1
        if tokens:
            stats.cycles += 1
            stats.drafted += len(tokens)
            stats.accepted += accepted
        stop = done + 1 + accepted
        if stop < len(sequence):
            drafter.observe(sequence[done:stop], sequence[stop], rows_between(out, done, stop))
        done = stop
    return stats
