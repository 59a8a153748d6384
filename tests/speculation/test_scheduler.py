"""The drafting scheduler on scripted acceptance sequences."""

from __future__ import annotations

from ds4mlx.speculation.scheduler import (
    CANNOT_PAY_MARGIN,
    COST_DECAY,
    COST_MARGIN,
    COST_PAUSE,
    FULL_DRAFT_EVERY,
    LOW_ACCEPTANCE_PAUSE,
    MAX_COST_PAUSE,
    MAX_LOSS_PAUSE,
    MAX_SILENT_PAUSE,
    MIN_DRAFTED_SAMPLES,
    MIN_PLAIN_SAMPLES,
    MIN_POSITION_ACCEPTANCE,
    MIN_POSITION_DRAFTS,
    MIN_TAIL_DRAFT,
    NO_DRAFT_PAUSES,
    PLAIN_MAX_AGE,
    POSITION_DECAY,
    PROBE_SHARE,
    QUICK_SAMPLES,
    WINDOW_CYCLES,
    CostMeter,
    Cycle,
    DecayingCost,
    DraftPositions,
    DraftScheduler,
)

import pytest

BUDGET = 1000


def ds4_rule(**options) -> DraftScheduler:
    """A scheduler of a sampled request, which ds4's acceptance windows judge (a greedy one's
    cost rule alone pauses it: ``test_a_greedy_request_is_never_paused_by_its_acceptance``)."""
    return DraftScheduler(weighs_cost=False, **options)


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
    scheduler = ds4_rule()
    assert all(drive(scheduler, [(5, 4)] * 12))
    assert scheduler.stats.pauses == 0 and scheduler.stats.drafted_cycles == 12


def test_poor_window_pauses_then_resumes():
    scheduler = ds4_rule()
    trace = drive(scheduler, [(5, 1)] * WINDOW_CYCLES + [(5, 5)] * WINDOW_CYCLES)
    expected = (
        [True] * WINDOW_CYCLES + [False] * LOW_ACCEPTANCE_PAUSE + [True] * (WINDOW_CYCLES + 1)
    )
    assert trace == expected
    assert scheduler.stats.pauses == 1 and scheduler.stats.paused_cycles == LOW_ACCEPTANCE_PAUSE


def test_mean_exactly_at_threshold_keeps_drafting():
    scheduler = ds4_rule()
    drive(scheduler, [(5, 1), (5, 2), (5, 1), (5, 2)])  # mean 1.5
    assert scheduler.stats.pauses == 0


def test_repeated_no_draft_pauses_grow():
    scheduler = ds4_rule()
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
    scheduler = ds4_rule()
    drive(scheduler, [(5, 5), (0, 0), (5, 5), (0, 0)])
    assert scheduler.stats.no_draft_pauses == 1


def test_healthy_window_resets_no_draft_growth():
    scheduler = ds4_rule()
    drive(scheduler, [(0, 0)] * WINDOW_CYCLES + [(5, 5)] * WINDOW_CYCLES + [(0, 0)] * WINDOW_CYCLES)
    assert scheduler.stats.paused_cycles == 2 * NO_DRAFT_PAUSES[0]


def test_no_drafting_once_the_budget_leaves_too_short_a_draft():
    scheduler = ds4_rule(max_draft=5)
    # A cycle commits its draft and one more token: MIN_TAIL_DRAFT draft tokens need one more.
    assert scheduler.should_draft(MIN_TAIL_DRAFT + 1)
    assert not scheduler.should_draft(MIN_TAIL_DRAFT)
    assert scheduler.stats.tail_cycles == 1


def test_a_one_token_drafter_drafts_while_one_draft_token_fits():
    scheduler = ds4_rule(max_draft=1)
    assert scheduler.should_draft(2)
    assert not scheduler.should_draft(1)


def test_a_new_scheduler_per_request_starts_fresh():
    first = ds4_rule()
    for _ in range(WINDOW_CYCLES):
        assert first.should_draft(BUDGET)
        first.record(5, 0)
    assert not first.should_draft(BUDGET)  # paused
    assert ds4_rule().should_draft(BUDGET)


def test_one_token_drafters_are_judged_by_their_share_accepted():
    # A GLM nextn drafter accepts at most one token a cycle; 3 of 4 accepted keeps drafting ...
    scheduler = ds4_rule(max_draft=1)
    assert all(drive(scheduler, [(1, 1), (1, 0), (1, 1), (1, 1)]))
    # ... while 1 of 4 pauses it.
    scheduler = ds4_rule(max_draft=1)
    drive(scheduler, [(1, 0), (1, 0), (1, 1), (1, 0)])
    assert scheduler.stats.pauses == 1


# The cost rule: drafted cycles against plain advances, in seconds per committed token.


def drive_costs(
    scheduler: DraftScheduler,
    drafted_seconds: list[float],
    plain_seconds: float = 4.0,
    draft_length: int = 1,
) -> list[Cycle]:
    """Run cycles until ``drafted_seconds`` (one per drafted cycle, each committing a drafted
    token and the target's) is used up; plain advances commit four tokens in ``plain_seconds``
    (one second a token by default). ``draft_length``: the drafted tokens each cycle reports
    it verified (0: the drafter proposed nothing). Returns what each cycle
    did."""
    cycles = [(seconds, 2) for seconds in drafted_seconds]
    return drive_commits(scheduler, cycles, plain_seconds, draft_length)


def drive_commits(
    scheduler: DraftScheduler,
    cycles: list[tuple[float, int]],
    plain_seconds: float = 4.0,
    draft_length: int = 5,
) -> list[Cycle]:
    """``drive_costs`` with each drafted cycle's seconds and committed tokens given, every
    committed draft token accepted (ds4's rule never pauses here)."""
    trace, queue = [], list(cycles)
    while queue:
        assert len(trace) < 10_000, "the scheduler stopped drafting for good"
        cycle = scheduler.next_cycle(BUDGET)
        trace.append(cycle)
        if cycle is Cycle.DRAFT:
            seconds, tokens = queue.pop(0)
            scheduler.record(max(draft_length, 1), tokens - 1)
            scheduler.record_cost(Cycle.DRAFT, seconds, tokens, draft_length)
        elif cycle is Cycle.PLAIN:
            scheduler.record_cost(Cycle.PLAIN, plain_seconds, 4)
    return trace


def measured() -> CostMeter:
    """A meter on which an earlier request measured plain decoding at one second a token."""
    costs = CostMeter()
    costs.plain.add(4.0, 4)
    return costs


def judged(max_draft: int = 1) -> DraftScheduler:
    """A scheduler whose request has measured plain decoding itself, at one second a token."""
    scheduler = DraftScheduler(max_draft=max_draft)
    scheduler.record_cost(Cycle.PLAIN, 4.0, 4)
    return scheduler


D, P = Cycle.DRAFT, Cycle.PLAIN
#: Seconds of a drafted cycle of two tokens that loses by little: 5% dearer than plain decoding
#: (beyond COST_MARGIN, within CANNOT_PAY_MARGIN), so little that what a probe of it loses
#: sizes no pause beyond the shortest (PROBE_SHARE).
LOSING = 2.1


def test_a_drafter_that_costs_more_than_plain_steps_pauses_then_probes():
    scheduler = judged()
    # LOSING: 1.05 s a token against plain decoding's 1.0.
    trace = drive_costs(scheduler, [LOSING] * (3 * MIN_DRAFTED_SAMPLES))
    probe = [D] * MIN_DRAFTED_SAMPLES
    assert trace == [
        *probe,
        *[P] * COST_PAUSE,
        *probe,
        *[P] * (2 * COST_PAUSE),  # each losing probe doubles the pause
        *probe,
    ]
    assert scheduler.stats.cost_pauses == 3
    assert scheduler.stats.plain_advances == COST_PAUSE + 2 * COST_PAUSE
    assert scheduler.stats.drafted_cost == pytest.approx(LOSING / 2)
    assert scheduler.stats.plain_cost == 1.0


def plain_runs(trace: list[Cycle]) -> list[int]:
    """The lengths of the runs of plain advances in ``trace``."""
    runs, run = [], 0
    for cycle in [*trace, D]:
        if cycle is P:
            run += 1
        elif run:
            runs.append(run)
            run = 0
    return runs


def test_the_cost_pause_stops_growing():
    scheduler = judged()
    pauses = plain_runs(drive_costs(scheduler, [LOSING] * (10 * MIN_DRAFTED_SAMPLES)))
    assert pauses[:4] == [COST_PAUSE, 2 * COST_PAUSE, 4 * COST_PAUSE, 4 * COST_PAUSE]
    # A drafter that loses by little stops at MAX_COST_PAUSE: its probes cost little, and
    # later text may be text it drafts well.
    assert max(pauses) == MAX_COST_PAUSE


def test_a_drafter_that_pays_never_pauses():
    scheduler = DraftScheduler(max_draft=1, costs=measured())
    trace = drive_costs(scheduler, [1.5] * 40)  # 0.75 s a token
    assert scheduler.stats.cost_pauses == 0
    # Its only plain advances measure plain decoding again, after PLAIN_MAX_AGE drafted cycles.
    refresh = [*[D] * PLAIN_MAX_AGE, *[P] * MIN_PLAIN_SAMPLES]
    assert trace == [*refresh, *refresh, *[D] * (40 - 2 * PLAIN_MAX_AGE)]
    # So is one that seems to halve the cost per token: on a loaded machine a plain sample can
    # be overstated by any factor.
    scheduler = DraftScheduler(max_draft=1, costs=measured())
    assert drive_costs(scheduler, [0.9] * 40) == [*refresh, *refresh, *[D] * 8]


def test_a_cost_within_the_margin_keeps_drafting():
    scheduler = DraftScheduler(max_draft=1, costs=measured())
    within = 2.0 * (1 + COST_MARGIN * 0.9)
    drive_costs(scheduler, [within] * 40)
    assert scheduler.stats.cost_pauses == 0
    scheduler = DraftScheduler(max_draft=1, costs=measured())
    beyond = 2.0 * (1 + COST_MARGIN * 1.1)
    drive_costs(scheduler, [beyond] * 40)
    assert scheduler.stats.cost_pauses > 0


def test_a_plain_cost_measured_long_ago_is_measured_again():
    """A plain sample taken while another process had the core (1.6 s a token instead of 1,
    as measured for legacy MTP on prose) makes a losing drafter (1.25 s a token) look as if it
    paid; after PLAIN_MAX_AGE drafted cycles plain decoding is measured again, from scratch,
    and the drafter pauses."""
    costs = CostMeter()
    costs.plain.add(6.4, 4)
    scheduler = DraftScheduler(max_draft=1, costs=costs)
    trace = drive_costs(scheduler, [LOSING] * PLAIN_MAX_AGE)
    assert trace == [D] * PLAIN_MAX_AGE and scheduler.stats.cost_pauses == 0
    assert scheduler.next_cycle(BUDGET) is P
    # The judgement follows the measurement at once.
    scheduler.record_cost(Cycle.PLAIN, 4.0, 4)
    assert scheduler.stats.plain_cost == 1.0 and scheduler.stats.cost_pauses == 1
    assert scheduler.costs.pause_left == COST_PAUSE


def test_one_slow_cycle_does_not_pause_a_drafter_that_pays():
    # Another process takes the core for one cycle: 6 s instead of 1.2 s.
    scheduler = DraftScheduler(max_draft=1, costs=measured())
    assert set(drive_costs(scheduler, [1.2, 1.2, 6.0, 1.2, 1.2, 1.2, 1.2, 1.2])) == {D}


def test_a_loss_by_rejected_drafts_waits_for_enough_drafted_cycles():
    """Two cycles whose drafts were rejected (1.5 s a token against plain decoding's 1.0) say
    little of a five-token drafter, which can commit six tokens a cycle: the judgement waits for
    MIN_DRAFTED_SAMPLES cycles, then pauses."""
    scheduler = judged(max_draft=5)
    trace = drive_costs(scheduler, [3.0] * (MIN_DRAFTED_SAMPLES - 1))
    assert trace == [D] * (MIN_DRAFTED_SAMPLES - 1)
    assert scheduler.next_cycle(BUDGET) is D
    scheduler.record_cost(Cycle.DRAFT, 3.0, 2, 1)
    assert scheduler.next_cycle(BUDGET) is P and scheduler.stats.cost_pauses == 1


def test_a_drafter_that_cannot_pay_pauses_after_the_quick_samples():
    # A one-token drafter's cycle costs 3.3 s, more than the two tokens it can commit at most
    # cost plain decoding (2 s): acceptance cannot save it.
    scheduler = judged()
    trace = drive_costs(scheduler, [3.3] * QUICK_SAMPLES)
    assert trace == [D] * QUICK_SAMPLES
    assert scheduler.next_cycle(BUDGET) is P and scheduler.stats.cost_pauses == 1


def lost_once() -> DraftScheduler:
    """A scheduler whose five-token drafter has lost (by little) and run out its first
    pause."""
    scheduler = judged(max_draft=5)
    trace = drive_costs(scheduler, [LOSING] * MIN_DRAFTED_SAMPLES)
    trace += [scheduler.next_cycle(BUDGET) for _ in range(COST_PAUSE)]
    assert trace[-1] is P and scheduler.costs.pause_left == 0
    scheduler.record_cost(Cycle.PLAIN, 4.0, 4)
    return scheduler


def test_a_later_pause_is_long_enough_that_its_probe_cost_a_small_share_of_it():
    # Four cycles of two tokens at 5 s each (plain decoding: 2 s): the probe lost
    # (5 - 2) * (1 + 0.8 + 0.64 + 0.512) = 8.856 s (decayed alike), 2.2 plain advances of 4 s.
    scheduler = lost_once()
    drive_costs(scheduler, [5.0] * MIN_DRAFTED_SAMPLES)
    lost_advances = (5.0 - 2.0) * 2.952 / 4.0
    assert scheduler.costs.pause_left == pytest.approx(lost_advances / PROBE_SHARE, abs=1)
    assert scheduler.costs.pause_left == 111  # 110.7 advances, rounded up: never shorter
    assert MAX_COST_PAUSE < scheduler.costs.pause_left < MAX_LOSS_PAUSE
    # The doubling goes on from the learned pause, not from the long one.
    assert scheduler.costs.next_pause == 4 * COST_PAUSE
    # A loss far beyond it pauses for the longest pause at once.
    scheduler = lost_once()
    drive_costs(scheduler, [50.0] * MIN_DRAFTED_SAMPLES)
    assert scheduler.costs.pause_left == MAX_LOSS_PAUSE


def test_the_first_pause_is_as_long_as_its_loss_asks():
    """A first probe that loses by far pauses for long at once: the first drafted cycles, which
    compile graphs, are not timed (``CostMeter.warm_up``), so the loss is the drafter's."""
    scheduler = judged()
    drive_costs(scheduler, [50.0] * QUICK_SAMPLES)
    assert scheduler.costs.pause_left == MAX_LOSS_PAUSE


def test_a_drafter_that_cannot_pay_on_any_text_pauses_longest_at_once():
    """A one-token drafter commits at most two tokens a cycle: cycles that cost more than two
    plain tokens by more than CANNOT_PAY_MARGIN lose on any text, and pause for the longest
    pause at the first judgement; a cycle within the margin is judged by its loss alone."""
    hopeless = 2 * (1 + CANNOT_PAY_MARGIN) * 1.05  # seconds; plain decoding: 1 s a token
    scheduler = judged(max_draft=1)
    drive_costs(scheduler, [hopeless] * MIN_DRAFTED_SAMPLES, draft_length=1)
    assert scheduler.costs.cannot_pay and scheduler.costs.pause_left == MAX_LOSS_PAUSE
    # The same seconds with a five-token draft could pay on text it drafts well.
    scheduler = judged(max_draft=5)
    drive_costs(scheduler, [hopeless] * MIN_DRAFTED_SAMPLES, draft_length=1)
    assert not scheduler.costs.cannot_pay
    assert COST_PAUSE <= scheduler.costs.pause_left < MAX_LOSS_PAUSE
    # Within the margin, or cycles that proposed nothing: a loss like any other.
    scheduler = judged(max_draft=1)
    drive_costs(scheduler, [2 * (1 + CANNOT_PAY_MARGIN) * 0.95] * 4, draft_length=1)
    assert not scheduler.costs.cannot_pay and scheduler.costs.pause_left < MAX_LOSS_PAUSE
    scheduler = judged(max_draft=1)
    drive_costs(scheduler, [hopeless] * MIN_DRAFTED_SAMPLES, draft_length=0)
    assert not scheduler.costs.cannot_pay and scheduler.costs.pause_left < MAX_LOSS_PAUSE


def test_cycles_that_proposed_nothing_pause_whatever_the_clock_says():
    """A cycle without a draft is a plain advance plus the proposal: a loss, even when a noisy
    clock reads it cheaper than plain decoding. MIN_DRAFTED_SAMPLES of them pause drafting for
    MAX_SILENT_PAUSE (fewer do not: legacy MTP proposes nothing in about half its cycles on
    text it drafts well); one cycle that verified a draft among them leaves the judgement to
    the clock."""
    scheduler = judged(max_draft=3)
    trace = drive_costs(scheduler, [1.0] * (MIN_DRAFTED_SAMPLES + 1), draft_length=0)
    assert trace[:MIN_DRAFTED_SAMPLES] == [D] * MIN_DRAFTED_SAMPLES
    assert trace[MIN_DRAFTED_SAMPLES:] == [P] * MAX_SILENT_PAUSE + [D]
    assert scheduler.stats.cost_pauses == 1 and scheduler.costs.silent
    scheduler = judged(max_draft=3)
    drive_costs(scheduler, [1.0], draft_length=1)
    drive_costs(scheduler, [1.0] * (2 * MIN_DRAFTED_SAMPLES), draft_length=0)
    assert scheduler.stats.cost_pauses == 0


def test_a_probe_that_proposes_nothing_pauses_again_after_drafts_that_verified():
    """The drafts verified before a cost pause say nothing of its probe: a probe whose cycles
    propose nothing loses however cheap the clock reads them, as on a fresh meter."""
    scheduler = judged(max_draft=3)
    drive_costs(scheduler, [LOSING] * MIN_DRAFTED_SAMPLES, draft_length=1)
    assert scheduler.stats.cost_pauses == 1 and not scheduler.costs.silent
    trace = drive_costs(scheduler, [1.0] * MIN_DRAFTED_SAMPLES, draft_length=0)
    assert trace == [*[P] * COST_PAUSE, *[D] * MIN_DRAFTED_SAMPLES]
    assert scheduler.stats.cost_pauses == 2 and scheduler.costs.pause_left == MAX_SILENT_PAUSE


def test_a_new_request_keeps_only_a_short_pause_unless_the_drafter_cannot_pay():
    """A pause sized by a loss on one request's text is cut to MAX_COST_PAUSE when the next
    request starts (its text may draft well); one for a drafter that cannot pay is kept."""
    costs = CostMeter(pause_left=MAX_LOSS_PAUSE)
    DraftScheduler(max_draft=5, costs=costs)
    assert costs.pause_left == MAX_COST_PAUSE
    DraftScheduler(max_draft=5, costs=costs)
    assert costs.pause_left == MAX_COST_PAUSE
    costs = CostMeter(pause_left=MAX_LOSS_PAUSE, cannot_pay=True)
    DraftScheduler(max_draft=1, costs=costs)
    assert costs.pause_left == MAX_LOSS_PAUSE
    # A probe that pays afterwards clears the finding.
    scheduler = DraftScheduler(max_draft=1, costs=CostMeter(cannot_pay=True))
    scheduler.record_cost(Cycle.PLAIN, 4.0, 4)
    drive_costs(scheduler, [1.0] * MIN_DRAFTED_SAMPLES, draft_length=1)
    assert scheduler.stats.cost_pauses == 0 and not scheduler.costs.cannot_pay


def test_a_drafter_whose_proposals_cost_nothing_pauses_no_longer_than_the_doubling():
    """Prompt lookup loses only by rejected drafts, which depend on the text: however much its
    probe lost, its pause is the doubling's."""
    scheduler = DraftScheduler(max_draft=1, free_proposals=True)
    scheduler.record_cost(Cycle.PLAIN, 4.0, 4)
    pauses = plain_runs(drive_costs(scheduler, [50.0] * (8 * QUICK_SAMPLES)))
    assert pauses[:3] == [COST_PAUSE, 2 * COST_PAUSE, 4 * COST_PAUSE]
    assert max(pauses) == MAX_COST_PAUSE


def test_the_first_cycle_of_each_draft_length_is_a_warm_up():
    costs = CostMeter()
    assert [costs.warm_up(n) for n in (3, 3, 0, 1, 0, 3, 1)] == [
        True,
        False,
        True,
        True,
        False,
        False,
        False,
    ]
    assert not CostMeter().warmed_lengths  # per meter: each drafter's lease warms up once


def test_a_probe_that_pays_resumes_drafting_and_resets_the_pause():
    scheduler = judged()
    slow, fast = [LOSING] * MIN_DRAFTED_SAMPLES, [1.0] * (3 * MIN_DRAFTED_SAMPLES)
    trace = drive_costs(scheduler, [*slow, *fast, *[LOSING] * (10 * MIN_DRAFTED_SAMPLES)])
    # Drafting pays again after the first pause: the fast cycles run without one ...
    assert trace[: MIN_DRAFTED_SAMPLES + COST_PAUSE + len(fast)] == [
        *[D] * MIN_DRAFTED_SAMPLES,
        *[P] * COST_PAUSE,
        *[D] * len(fast),
    ]
    # ... and when it loses again, the pause starts over at the first pause's length. A loss
    # of 5% after cycles that paid shows beyond the noise (LOSS_DEVIATIONS) only once those
    # have decayed out of the average: plain decoding is measured again twice before
    # (PLAIN_MAX_AGE drafted cycles pass each time).
    runs = plain_runs(trace)
    assert runs[:4] == [COST_PAUSE, MIN_PLAIN_SAMPLES, MIN_PLAIN_SAMPLES, COST_PAUSE]


def test_plain_cost_from_an_earlier_request_is_measured_again_before_a_pause():
    # Drafting looks slower than an earlier request's plain decoding: one plain advance
    # measures it now; it is as fast as before, so drafting pauses at the next judgement ...
    scheduler = DraftScheduler(max_draft=1, costs=measured())
    trace = drive_costs(scheduler, [LOSING] * MIN_DRAFTED_SAMPLES)
    assert trace == [D] * MIN_DRAFTED_SAMPLES and scheduler.stats.cost_pauses == 0
    assert scheduler.next_cycle(BUDGET) is P
    scheduler.record_cost(Cycle.PLAIN, 4.0, 4)  # the judgement follows it at once
    assert scheduler.next_cycle(BUDGET) is P and scheduler.stats.cost_pauses == 1
    # ... unless the machine got slower for plain decoding too (3 s a token now).
    scheduler = DraftScheduler(max_draft=1, costs=measured())
    trace = drive_costs(scheduler, [LOSING] * 20, plain_seconds=12.0)
    assert trace == [*[D] * MIN_DRAFTED_SAMPLES, *[P] * MIN_PLAIN_SAMPLES, *[D] * 16]


def test_plain_cost_is_measured_once_per_meter():
    costs = CostMeter()
    first = DraftScheduler(max_draft=1, costs=costs)
    trace = drive_costs(first, [1.0] * (MIN_DRAFTED_SAMPLES + 2))
    # Once drafted cycles start to be judged, plain advances measure plain decoding once.
    assert trace == [
        *[D] * QUICK_SAMPLES,
        *[P] * MIN_PLAIN_SAMPLES,
        *[D] * (MIN_DRAFTED_SAMPLES + 2 - QUICK_SAMPLES),
    ]
    # The next request on the same meter (the drafter's lease) judges without measuring again.
    second = DraftScheduler(max_draft=1, costs=costs)
    assert set(drive_costs(second, [1.0] * (MIN_DRAFTED_SAMPLES + 2))) == {D}


def test_cost_pauses_cover_ds4_pauses():
    # Poor acceptance and slow cycles: the cost pause runs plain advances, and ds4's pause of
    # one-token verifies does not follow it.
    scheduler = judged(max_draft=5)
    for _ in range(WINDOW_CYCLES):
        assert scheduler.next_cycle(BUDGET) is D
        scheduler.record(5, 0)
        # Within the margin of plain cost: only ds4's rule would pause ...
        scheduler.record_cost(Cycle.DRAFT, 1.0, 1, 5)
    # ... until the last cycle of the window is slow enough to tip the average.
    scheduler.stats.cost_pauses = 0
    scheduler.costs.drafted.restart()
    for _ in range(MIN_DRAFTED_SAMPLES):
        scheduler.record_cost(Cycle.DRAFT, 1.2, 1, 5)
    after = [scheduler.next_cycle(BUDGET) for _ in range(COST_PAUSE + 1)]
    assert after == [*[P] * COST_PAUSE, D]


def test_the_tail_comes_before_a_cost_pause():
    scheduler = DraftScheduler(max_draft=1, costs=measured())
    drive_costs(scheduler, [LOSING] * MIN_DRAFTED_SAMPLES)
    assert scheduler.next_cycle(1) is Cycle.TAIL


# What the cost rule learned carries over to the next request on the same meter (lease).


def test_a_request_starts_in_the_pause_an_earlier_one_left():
    costs = CostMeter()
    first = DraftScheduler(max_draft=1, costs=costs)
    first.record_cost(Cycle.PLAIN, 4.0, 4)
    trace = drive_costs(first, [LOSING] * MIN_DRAFTED_SAMPLES)
    assert trace == [D] * MIN_DRAFTED_SAMPLES and costs.pause_left == COST_PAUSE
    assert first.next_cycle(BUDGET) is P  # the request ends here, one advance into its pause
    second = DraftScheduler(max_draft=1, costs=costs)
    trace = [second.next_cycle(BUDGET) for _ in range(COST_PAUSE)]
    assert trace == [*[P] * (COST_PAUSE - 1), D]
    assert second.stats.cost_pauses == 1 and second.stats.plain_advances == COST_PAUSE - 1
    # Its probe loses too: the pause doubles, as within one request.
    second.record_cost(Cycle.PLAIN, 4.0, 4)
    drive_costs(second, [LOSING] * MIN_DRAFTED_SAMPLES)
    assert costs.pause_left == 2 * COST_PAUSE and second.stats.cost_pauses == 2


def test_a_request_judges_at_once_with_the_drafted_cycles_an_earlier_one_timed():
    costs = CostMeter()
    first = DraftScheduler(max_draft=1, costs=costs)
    first.record_cost(Cycle.PLAIN, 4.0, 4)
    drive_costs(first, [LOSING] * (MIN_DRAFTED_SAMPLES - 1))  # ends before its judgement
    second = DraftScheduler(max_draft=1, costs=costs)
    second.record_cost(Cycle.PLAIN, 4.0, 4)
    assert drive_costs(second, [LOSING]) == [D]
    assert second.next_cycle(BUDGET) is P and second.stats.cost_pauses == 1


def test_a_sampled_request_ignores_a_pause_an_earlier_one_left():
    costs = CostMeter(pause_left=COST_PAUSE)
    sampled = DraftScheduler(max_draft=1, costs=costs, weighs_cost=False)
    assert sampled.next_cycle(BUDGET) is D and sampled.stats.cost_pauses == 0
    assert costs.pause_left == COST_PAUSE  # left for the next greedy request
    # Nor are its advances counted as plain ones ahead (the loop would leave rows out).
    assert sampled.plain_advances_ahead() == 0
    greedy = DraftScheduler(max_draft=1, costs=CostMeter(pause_left=COST_PAUSE))
    assert greedy.plain_advances_ahead() == COST_PAUSE


def test_a_plain_advance_covers_as_many_cycles_of_ds4s_pause_as_it_decodes():
    scheduler = ds4_rule()
    drive(scheduler, [(5, 0)] * (WINDOW_CYCLES - 1))
    scheduler.record(5, 0)  # the window closes: a pause of LOW_ACCEPTANCE_PAUSE cycles
    assert scheduler.next_cycle(BUDGET) is Cycle.PAUSE
    assert scheduler.extend_pause(4) == LOW_ACCEPTANCE_PAUSE
    assert scheduler.stats.paused_cycles == LOW_ACCEPTANCE_PAUSE
    assert scheduler.next_cycle(BUDGET) is D


def test_one_winning_probe_halves_the_pause_and_winning_cycles_shorten_it_to_the_first():
    scheduler = judged()
    slow, fast = [LOSING] * MIN_DRAFTED_SAMPLES, [1.0] * MIN_DRAFTED_SAMPLES
    # Three losing probes (pauses 8, 16, 32), then one lucky probe: the next pause is 16
    # (half of the longest), not the first pause's 8.
    trace = drive_costs(scheduler, [*slow, *slow, *slow, *fast])
    assert plain_runs(trace) == [COST_PAUSE, 2 * COST_PAUSE, 4 * COST_PAUSE]
    assert scheduler.costs.next_pause == 2 * COST_PAUSE
    # A drafter that keeps paying is back to the first pause within a few cycles.
    drive_costs(scheduler, [1.0] * 8)
    assert scheduler.costs.next_pause == COST_PAUSE


def test_a_loss_within_the_spread_of_the_commits_keeps_drafting():
    """DSpark on a chat answer: cycles of 3.6 s commit one token or six, 3% dearer a token
    than plain decoding on average (beyond COST_MARGIN). With commits that spread so, the
    average of a few cycles cannot tell that from a drafter that pays: no pause. The same
    loss from cycles that all commit alike pauses at the first judgement."""
    scheduler = judged(max_draft=5)
    trace = drive_commits(scheduler, [(3.6, 1), (3.6, 6)] * 20)
    assert scheduler.stats.cost_pauses == 0 and set(trace) == {D, P}  # P: plain measured again
    scheduler = judged(max_draft=5)
    trace = drive_commits(scheduler, [(4.12, 4)] * 5)  # 1.03 s a token
    assert trace[:MIN_DRAFTED_SAMPLES] == [D] * MIN_DRAFTED_SAMPLES
    assert trace[MIN_DRAFTED_SAMPLES] is P and scheduler.stats.cost_pauses == 1


def test_the_spread_is_the_standard_error_of_the_seconds_per_token():
    """``relative_error`` against the ratio estimator's error computed from the samples, with
    their weights written out (COST_DECAY per newer sample)."""
    samples = [(3.6, 1), (3.6, 6), (4.0, 2), (3.0, 5), (3.8, 3)]
    cost = DecayingCost()
    for seconds, tokens in samples:
        cost.add(seconds, tokens)
    weights = [COST_DECAY ** (len(samples) - 1 - i) for i in range(len(samples))]
    weighted = [(w, s, t) for w, (s, t) in zip(weights, samples, strict=True)]
    total = sum(weights)
    rate = sum(w * s for w, s, _ in weighted) / sum(w * t for w, _, t in weighted)
    residuals = [w * (s - rate * t) ** 2 for w, s, t in weighted]
    effective = total**2 / sum(w * w for w in weights)
    variance = sum(residuals) / total * effective / (effective - 1)
    mean_tokens = sum(w * t for w, _, t in weighted) / total
    expected = (variance / effective) ** 0.5 / mean_tokens / rate
    assert cost.per_token == pytest.approx(rate)
    assert cost.relative_error() == pytest.approx(expected)
    assert 0.1 < expected < 0.3  # about ±20%: the spread the cost rule must see past
    # Cycles alike have no spread; one sample has no error to tell.
    steady = DecayingCost()
    for _ in range(4):
        steady.add(4.0, 4)
    assert steady.relative_error() == 0.0
    single = DecayingCost()
    single.add(4.0, 1)
    assert single.relative_error() == 0.0
    # A restart forgets the spread with the samples: afterwards it reads as a fresh one.
    cost.restart()
    fresh = DecayingCost()
    for seconds, tokens in samples[:3]:
        cost.add(seconds, tokens)
        fresh.add(seconds, tokens)
    assert fresh.relative_error() > 0
    assert cost.relative_error() == pytest.approx(fresh.relative_error())


def test_a_new_request_keeps_a_silent_pause_whole():
    """A pause after cycles that proposed nothing is MAX_SILENT_PAUSE, and a new request keeps
    all of it; a pause sized by a loss of drafts that verified is cut to MAX_COST_PAUSE."""
    costs = CostMeter(pause_left=MAX_LOSS_PAUSE, silent=True)
    DraftScheduler(max_draft=3, costs=costs)
    assert costs.pause_left == MAX_SILENT_PAUSE
    # A later probe whose drafts verify, and lose, clears the finding.
    scheduler = judged(max_draft=3)
    drive_costs(scheduler, [1.0] * MIN_DRAFTED_SAMPLES, draft_length=0)
    assert scheduler.costs.silent
    drive_costs(scheduler, [LOSING] * MIN_DRAFTED_SAMPLES)
    assert not scheduler.costs.silent and scheduler.stats.cost_pauses == 2
    scheduler.costs.pause_left = MAX_LOSS_PAUSE
    DraftScheduler(max_draft=3, costs=scheduler.costs)
    assert scheduler.costs.pause_left == MAX_COST_PAUSE


def test_a_greedy_request_is_never_paused_by_its_acceptance():
    """Under the cost rule, ds4's windows of poor acceptance do not pause: four-token DSpark
    drafts on chat answers commit about 2.5 tokens a cycle and pay, yet windows of four such
    cycles averaging below MIN_MEAN_ACCEPTED paused them often enough to give the gain back
    (docs/performance.md, "Session 21"). Windows without drafts still pause: a drafter with a
    network of its own spent it on nothing there (legacy MTP held back by its margin)."""
    scheduler = DraftScheduler()
    assert all(drive(scheduler, [(5, 0)] * (3 * WINDOW_CYCLES)))
    assert scheduler.stats.pauses == 0 and scheduler.stats.drafted_cycles == 3 * WINDOW_CYCLES
    drive(scheduler, [(0, 0)] * WINDOW_CYCLES)
    assert scheduler.stats.no_draft_pauses == 1
    assert scheduler.stats.paused_cycles == NO_DRAFT_PAUSES[0]


# Draft lengths: positions accepted too rarely to pay for their rows are left out.


def test_a_draft_ends_before_the_first_position_accepted_too_rarely():
    """Drafts whose fifth token was accepted once, long ago (below MIN_POSITION_ACCEPTANCE),
    and their fourth in about four of ten: four-token drafts."""
    scheduler = DraftScheduler()
    drive(
        scheduler,
        [(5, kept) for kept in [5, 3, 3, 3, 0] + [1, 0, 2, 1, 0] * 3 + [4, 4, 4, 0, 1] * 4],
    )
    acceptance = [scheduler.costs.positions.acceptance(k) for k in range(5)]
    assert acceptance[4] < MIN_POSITION_ACCEPTANCE <= acceptance[3]
    assert scheduler.draft_length(5) == 4
    # A budget that leaves room for fewer tokens is no cut of the drafter's (tail drafts).
    assert scheduler.draft_length(3) == 3


def test_the_acceptance_of_a_position_is_its_decayed_share():
    positions = DraftPositions()
    positions.add(3, 1)
    positions.add(3, 3)
    positions.add(2, 0)
    # Position 0: reached by the three drafts (weights d², d, 1), kept by the first two.
    d = POSITION_DECAY
    assert positions.reached[0] == pytest.approx(d * d + d + 1)
    assert positions.kept[0] == pytest.approx(d * d + d)
    # Position 2: reached by the first two drafts only, kept by the second.
    assert positions.reached[2] == pytest.approx(d + 1)
    assert positions.kept[2] == pytest.approx(1)
    # Too few drafts reached it to judge it yet.
    assert positions.acceptance(2) is None and positions.acceptance(5) is None
    for _ in range(20):
        positions.add(3, 1)
    assert positions.acceptance(0) == pytest.approx(positions.kept[0] / positions.reached[0])
    assert 0.97 < positions.acceptance(0) < 1 and positions.acceptance(1) < 0.03


def test_no_cut_before_enough_drafts_reached_a_position():
    """A request's first drafts can all be rejected early on text the drafter drafts well: a
    position is judged once MIN_POSITION_DRAFTS drafts reached it."""
    scheduler = DraftScheduler()
    # The decayed count of n drafts is (1 - d^n) / (1 - d): the first n that reaches the least.
    needed = next(
        n
        for n in range(1, 100)
        if (1 - POSITION_DECAY**n) / (1 - POSITION_DECAY) >= MIN_POSITION_DRAFTS
    )
    drive(scheduler, [(5, 0)] * (needed - 1))
    assert scheduler.draft_length(5) == 5
    drive(scheduler, [(5, 0)])
    assert scheduler.draft_length(5) == 1  # the first position always stays


def test_a_cut_draft_is_drafted_in_full_once_in_full_draft_every():
    """Probes keep the positions past the cut measured: prose after chat answers lengthens
    the drafts again after a probe or two whose tokens were all accepted."""
    scheduler = DraftScheduler()
    drive(scheduler, [(5, 4)] * 30)
    lengths = [scheduler.draft_length(5) for _ in range(2 * FULL_DRAFT_EVERY)]
    assert lengths.count(5) == 2 and lengths[FULL_DRAFT_EVERY - 1] == 5
    assert set(lengths) == {4, 5}
    # Tail drafts, shorter than the cut, neither count towards a probe nor are one.
    tails = [scheduler.draft_length(3) for _ in range(FULL_DRAFT_EVERY - 1)]
    assert tails == [3] * (FULL_DRAFT_EVERY - 1)
    lengths = [scheduler.draft_length(5) for _ in range(FULL_DRAFT_EVERY)]
    assert lengths == [4] * (FULL_DRAFT_EVERY - 1) + [5]
    # A probe on prose, every token accepted, makes full drafts pay again.
    drive(scheduler, [(5, 5)] * 2)
    assert scheduler.draft_length(5) == 5


def test_a_sampled_request_drafts_in_full():
    """A sampled request's draws depend on its drafts' lengths: never cut (as the cost rule)."""
    costs = CostMeter()
    greedy = DraftScheduler(costs=costs)
    drive(greedy, [(5, 0)] * 20)
    assert greedy.draft_length(5) == 1
    assert DraftScheduler(costs=costs, weighs_cost=False).draft_length(5) == 5
