"""The drafting scheduler on scripted acceptance sequences."""

from __future__ import annotations

from ds4mlx.speculation.scheduler import (
    LOW_ACCEPTANCE_PAUSE,
    MIN_TAIL_DRAFT,
    NO_DRAFT_PAUSES,
    WINDOW_CYCLES,
    DraftScheduler,
)

BUDGET = 1000


def drive(scheduler: DraftScheduler, outcomes: list[tuple[int, int]]) -> list[bool]:
    """Feed (drafted, accepted) per drafting cycle, then run out any pause they caused; returns
    whether each cycle drafted (the trailing True is the first cycle allowed to draft again)."""
    trace, queue = [], list(outcomes)
    while True:
        drafting = scheduler.should_draft(BUDGET)
        trace.append(drafting)
        if drafting:
            if not queue:
                return trace
            scheduler.record(*queue.pop(0))


def test_good_acceptance_never_pauses():
    scheduler = DraftScheduler()
    assert all(drive(scheduler, [(5, 4)] * 12))
    assert scheduler.stats.pauses == 0 and scheduler.stats.drafted_cycles == 12


def test_poor_window_pauses_then_resumes():
    scheduler = DraftScheduler()
    trace = drive(scheduler, [(5, 1)] * WINDOW_CYCLES + [(5, 5)] * WINDOW_CYCLES)
    expected = (
        [True] * WINDOW_CYCLES + [False] * LOW_ACCEPTANCE_PAUSE + [True] * (WINDOW_CYCLES + 1)
    )
    assert trace == expected
    assert scheduler.stats.pauses == 1 and scheduler.stats.paused_cycles == LOW_ACCEPTANCE_PAUSE


def test_mean_exactly_at_threshold_keeps_drafting():
    scheduler = DraftScheduler()
    drive(scheduler, [(5, 1), (5, 2), (5, 1), (5, 2)])  # mean 1.5
    assert scheduler.stats.pauses == 0


def test_repeated_no_draft_pauses_grow():
    scheduler = DraftScheduler()
    trace = drive(scheduler, [(0, 0)] * (WINDOW_CYCLES * 4))
    pauses = []
    run = 0
    for drafted in trace:
        if drafted:
            if run:
                pauses.append(run)
            run = 0
        else:
            run += 1
    assert pauses == list(NO_DRAFT_PAUSES) + [NO_DRAFT_PAUSES[-1]]
    assert scheduler.stats.no_draft_pauses == 4


def test_half_no_draft_window_pauses_even_with_good_acceptance():
    scheduler = DraftScheduler()
    drive(scheduler, [(5, 5), (0, 0), (5, 5), (0, 0)])
    assert scheduler.stats.no_draft_pauses == 1


def test_healthy_window_resets_no_draft_growth():
    scheduler = DraftScheduler()
    drive(scheduler, [(0, 0)] * WINDOW_CYCLES + [(5, 5)] * WINDOW_CYCLES + [(0, 0)] * WINDOW_CYCLES)
    assert scheduler.stats.paused_cycles == 2 * NO_DRAFT_PAUSES[0]


def test_no_drafting_once_the_budget_leaves_too_short_a_draft():
    scheduler = DraftScheduler(max_draft=5)
    # A cycle commits its draft and one more token: MIN_TAIL_DRAFT draft tokens need one more.
    assert scheduler.should_draft(MIN_TAIL_DRAFT + 1)
    assert not scheduler.should_draft(MIN_TAIL_DRAFT)
    assert scheduler.stats.tail_cycles == 1


def test_a_one_token_drafter_drafts_while_one_draft_token_fits():
    scheduler = DraftScheduler(max_draft=1)
    assert scheduler.should_draft(2)
    assert not scheduler.should_draft(1)


def test_a_new_scheduler_per_request_starts_fresh():
    first = DraftScheduler()
    for _ in range(WINDOW_CYCLES):
        assert first.should_draft(BUDGET)
        first.record(5, 0)
    assert not first.should_draft(BUDGET)  # paused
    assert DraftScheduler().should_draft(BUDGET)


def test_one_token_drafters_are_judged_by_their_share_accepted():
    # A GLM nextn drafter accepts at most one token a cycle; 3 of 4 accepted keeps drafting ...
    scheduler = DraftScheduler(max_draft=1)
    assert all(drive(scheduler, [(1, 1), (1, 0), (1, 1), (1, 1)]))
    # ... while 1 of 4 pauses it.
    scheduler = DraftScheduler(max_draft=1)
    drive(scheduler, [(1, 0), (1, 0), (1, 1), (1, 0)])
    assert scheduler.stats.pauses == 1
