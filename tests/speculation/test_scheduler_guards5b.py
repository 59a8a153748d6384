"""Scheduler bookkeeping edges: a pause covered by a long plain advance, empty costs."""

from __future__ import annotations

from ds4mlx.speculation.scheduler import (
    NO_DRAFT_PAUSES,
    WINDOW_CYCLES,
    Cycle,
    DecayingCost,
    DraftScheduler,
)

BUDGET = 1000


def paused_scheduler() -> DraftScheduler:
    """A sampled request's scheduler whose window drafted nothing: a pause of
    NO_DRAFT_PAUSES[0] cycles."""
    scheduler = DraftScheduler(weighs_cost=False)
    for _ in range(WINDOW_CYCLES):
        assert scheduler.next_cycle(BUDGET) is Cycle.DRAFT
        scheduler.record(0, 0)
    return scheduler


def test_a_one_token_advance_covers_only_its_own_pause_cycle():
    scheduler = paused_scheduler()
    assert scheduler.next_cycle(BUDGET) is Cycle.PAUSE
    assert scheduler.extend_pause(1) == 1
    assert scheduler.stats.paused_cycles == 1


def test_a_long_advance_covers_the_rest_of_the_pause_and_no_more():
    scheduler = paused_scheduler()
    assert scheduler.next_cycle(BUDGET) is Cycle.PAUSE
    assert scheduler.extend_pause(2) == 2
    rest = NO_DRAFT_PAUSES[0] - 2
    assert scheduler.extend_pause(100) == 1 + rest
    assert scheduler.stats.paused_cycles == NO_DRAFT_PAUSES[0]
    assert scheduler.next_cycle(BUDGET) is Cycle.DRAFT


def test_a_cycle_that_committed_nothing_is_not_timed():
    scheduler = DraftScheduler()
    scheduler.record_cost(Cycle.DRAFT, 5.0, 0)
    scheduler.record_cost(Cycle.PLAIN, 5.0, 0)
    assert scheduler.costs.drafted.samples == 0 and scheduler.costs.plain.samples == 0


def test_no_tokens_cost_nothing_per_token():
    assert DecayingCost().per_token == 0.0
    cost = DecayingCost()
    cost.add(3.0, 2)
    assert cost.per_token == 1.5
    # Time without a token (a caller that skipped record_cost's guard) is no division by zero.
    idle = DecayingCost()
    idle.add(3.0, 0)
    assert idle.per_token == 0.0
