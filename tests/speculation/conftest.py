"""Test drafters: they know the target's plain continuation and propose (corrupted) pieces of it,
so the loop's bookkeeping can be checked against plain decoding without a trained drafter."""

from __future__ import annotations

import random
from collections.abc import Sequence

import ds4mlx
from ds4mlx.speculation.drafter import Draft, TargetRows
from ds4mlx.speculation.loop import DrafterLease
from ds4mlx.speculation.scheduler import CostMeter, DecayingCost

import pytest


class ScriptedDrafter:
    """Proposes the next tokens of ``reference`` (what plain decoding generates after the
    prompt), replacing each with a wrong token with probability ``error_rate``."""

    name = "scripted"
    capture_layers = (0,)

    def __init__(
        self,
        prompt: Sequence[int],
        reference: Sequence[int],
        vocab: int,
        max_draft: int = 5,
        error_rate: float = 0.2,
        seed: int = 0,
        confidences: bool = False,
    ):
        self.sequence = [*prompt, *reference]
        self.vocab = vocab
        self.max_draft = max_draft
        self.error_rate = error_rate
        self.rng = random.Random(seed)
        self.confidences = confidences
        self.committed = 0
        self.observed_rows: list[int] = []

    def reset(self) -> None:
        self.committed = 0
        self.observed_rows.clear()

    def observe(self, tokens: Sequence[int], next_token: int, rows: TargetRows) -> None:
        assert rows.n_rows == len(tokens)
        assert rows.pos0 == self.committed
        assert set(rows.layers) == set(self.capture_layers)
        self.committed += len(tokens)
        self.observed_rows.append(rows.n_rows)

    def propose(self, max_tokens: int) -> Draft:
        start = self.committed + 1  # the position after next_token
        tokens = []
        for token in self.sequence[start : start + min(max_tokens, self.max_draft)]:
            if self.rng.random() < self.error_rate:
                token = (token + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
            tokens.append(token)
        confidences = [1.0 - 0.15 * i for i in range(len(tokens))] if self.confidences else None
        return Draft(tokens, confidences)


def record_asks(drafter: ScriptedDrafter) -> list[int]:
    """The ``max_tokens`` of each ``propose`` call to ``drafter`` from now on, in order."""
    asked: list[int] = []
    scripted = drafter.propose

    def recorded(max_tokens: int) -> Draft:
        asked.append(max_tokens)
        return scripted(max_tokens)

    drafter.propose = recorded
    return asked


@pytest.fixture(scope="module")
def ds4_model(ds4_fixture_path):
    return ds4mlx.load_model(ds4_fixture_path)


class TickingClock:
    """A clock that moves one second per reading: every cycle the loop times lasts one tick, so
    the cost rule sees seconds per token = 1 / tokens committed, whatever the machine does."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def measured_lease() -> DrafterLease:
    """A lease whose plain cost is already known (one tick per plain advance of four tokens, as
    the ticking clock measures it again), on a ticking clock: the cost rule pauses a drafter
    whose cycles commit fewer than four tokens, and keeps one whose cycles commit more."""
    costs = CostMeter(clock=TickingClock())
    costs.plain.add(1.0, 4)
    return DrafterLease(costs)


class FreePlainCost(DecayingCost):
    """Plain decoding measured as costing nothing, whatever the clock says."""

    @property
    def per_token(self) -> float:
        return 0.0


def paying_lease() -> DrafterLease:
    """A lease on a clock that never moves: every cycle costs nothing, so the cost rule never
    pauses a drafter that proposes (tests of what drafts do, not of when they are made)."""
    return DrafterLease(CostMeter(clock=lambda: 0.0))


def losing_lease() -> DrafterLease:
    """A lease on which every drafter loses to plain decoding: the cost rule pauses it after
    each probe."""
    return DrafterLease(CostMeter(clock=TickingClock(), plain=FreePlainCost()))
