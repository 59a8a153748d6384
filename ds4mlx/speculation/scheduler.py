"""When to draft: back off while drafting does not pay (ds4's scheduler defaults).

ds4's rule judges drafted cycles in windows. A window whose mean accepted length is too short,
or in which too many cycles produced no draft at all, pauses drafting for a few cycles; pauses
caused by missing drafts grow when they repeat. Near the end of the token budget a draft is cut to
what the budget can still take, and drafting stops once that is too short to pay for its verify
pass. One scheduler serves one request.

Acceptance is not cost: a drafter whose drafts are mostly accepted can still lose time when its
verify pass (and its own network) costs more than the tokens it saves, as GLM's one-token NextN
does on a CPU. So the scheduler also weighs time (ours, not ds4's): the loop reports how long each
drafted cycle and each plain (pipelined, undrafted) advance took and how many tokens it committed,
and the scheduler keeps a decaying average of seconds per committed token of each. Drafting pauses
for ``COST_PAUSE`` plain advances once drafted cycles cost more than plain ones by more than
``COST_MARGIN`` over ``MIN_DRAFTED_SAMPLES`` cycles, and by more than the noise of that average:
the loss must hold with the drafted cost lowered by ``LOSS_DEVIATIONS`` standard errors. A cycle
commits one to six tokens on chat answers, so five cycles' average spreads by ±30% around a drafter
that breaks even, and a rule that judged the bare average paused DSpark there 6-7 times in 17
answers, at 0.97-1.01x of plain decoding's speed, where drafting every cycle ran 1.10-1.17x (issue
36, item 9). A drafter that cannot pay on any text (below) is judged after ``QUICK_SAMPLES``; one
whose cycles all proposed nothing loses whatever the clock reads, and pauses for
``MAX_SILENT_PAUSE``. Then a probe of fresh drafted cycles judges again, and each probe that loses
doubles the pause (up to ``MAX_COST_PAUSE``; a pause is also long enough that what the probe lost
is a small share of it, ``PROBE_SHARE``, up to ``MAX_LOSS_PAUSE``), while each judgement that
drafting pays halves it (down to ``COST_PAUSE``): on a shared machine one probe can win by chance,
which should not undo what many lost probes learned, while a drafter that really pays is back to
the shortest pause within a few cycles. A drafter that loses thus costs at most about
``PROBE_SHARE`` of plain decoding's speed once its pauses have grown; one whose cycles cost more
than any cycle can commit, every draft accepted (``CANNOT_PAY_MARGIN``), loses on any text and
pauses for ``MAX_LOSS_PAUSE`` at once. The first drafted cycle of each draft length on a meter is
not timed: it compiles the verify pass for that many rows (and, the very first, the drafter's own
graphs), a cost that does not come back and that would make a drafter that pays look as if it lost.

The cost rule judges greedy requests, and ds4's windows of poor acceptance only sampled ones
(whose output must not depend on the clock, ``speculation.loop._weighs_cost``): acceptance stands
in for cost there, and where cost is measured the stand-in only errs. Four-token DSpark drafts on
the tiny model's chat answers pay (1.05-1.08x), yet windows of four cycles averaging below
``MIN_MEAN_ACCEPTED`` paused them often enough to give the gain back. Windows without drafts pause
either kind: the proposal's cost bought nothing there. A greedy request also leaves out of its
drafts the positions accepted too rarely to pay for their verify rows
(``MIN_POSITION_ACCEPTANCE``), measured over the lease's drafts (``DraftPositions``), probing the
full length now and then.

What drafting costs is a property of the drafter, the model and the machine more than of one
request, and most requests are too short to learn it (a 32-token answer is eight plain advances).
So both averages and the pause live in a ``CostMeter`` that the drafter's lease shares across
requests: a request starts where the last one left off, paused if the drafter was losing (for at
most ``MAX_COST_PAUSE`` advances, ``MAX_SILENT_PAUSE`` after a probe that proposed nothing, unless
it cannot pay: the new text may be one it drafts well), judging at its first cycle if enough
drafted cycles are known. Plain cost is measured with ``MIN_PLAIN_SAMPLES`` plain advances once
drafted cycles start to be judged, and a request that would pause drafting on an earlier request's
measurement measures it again first (the load of a shared machine changes), judging as soon as that
measurement ends. The load changes for a drafter that keeps drafting too: plain cost measured more
than ``PLAIN_MAX_AGE`` drafted cycles ago is measured again before the next judgement, so that a
drafter judged against one slow plain sample (another process took the core) does not draft at a
loss for good, however much cheaper that sample made it look."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

#: Drafted cycles per judgement window.
WINDOW_CYCLES = 4
#: A window whose mean accepted draft length is below this pauses drafting (ds4's value for
#: five-token DSpark drafts). Drafters with shorter drafts are held to the same share of their
#: draft cap: a one-token drafter (GLM nextn) pauses below half its drafts accepted.
MIN_MEAN_ACCEPTED = 1.5
MIN_ACCEPTED_SHARE = 0.5
#: A window in which at least this share of cycles produced no draft pauses drafting.
MAX_NO_DRAFT_SHARE = 0.5
#: Pause after a window of poor acceptance, in cycles.
LOW_ACCEPTANCE_PAUSE = 2
#: Pauses after consecutive windows without drafts, in cycles (the last one repeats).
NO_DRAFT_PAUSES = (3, 4, 7)
#: No drafting once the budget leaves room for fewer draft tokens than this (or than the
#: drafter's whole draft, if shorter). ds4 stops drafting 10 tokens before the end; here a draft
#: is cut to the budget (a cycle commits at most the tokens left), and drafting down to
#: two-token drafts beat stopping at ten tokens left on the held-out code prompts, with the same
#: output (docs/performance.md, "Session 10").
MIN_TAIL_DRAFT = 2
#: Cost samples: each new sample weighs 1, the older ones decay by this factor per sample, so
#: the last five or so cycles dominate.
COST_DECAY = 0.8
#: A sample counts at most this many times the average cycle's seconds: another process taking
#: the core for one cycle is noise, not the drafter's cost (a real change shows in every cycle
#: and passes the clip within a few samples, since the average then grows each time).
COST_OUTLIER = 2.0
#: Drafted cycles before the cost rule judges (a probe's length), and plain advances before
#: plain cost is known (each decodes ``Decoder.pipeline`` tokens). One plain advance is enough:
#: the noise of a shared machine only ever adds time, so a noisy plain sample errs towards
#: drafting (ds4's behaviour), never towards a pause.
MIN_DRAFTED_SAMPLES = 4
MIN_PLAIN_SAMPLES = 1
#: Drafted cycles timed since plain decoding was last measured after which it is measured again
#: (a plain advance of about four tokens every few requests: a drafter that wins by little gives
#: up about one cycle's gain in this many, one that doubles the speed about 1% of it). Also for
#: a drafter that seems to win by far: on a loaded machine one plain advance measured at four
#: times its usual cost (seen with GLM nextn at load 5) made a losing drafter look twice as
#: fast as plain decoding, and it drafted at a loss for the rest of the run.
PLAIN_MAX_AGE = 16
#: Drafted cycles that judge a drafter that cannot pay on any text (``CANNOT_PAY_MARGIN``), and
#: after which plain measurement starts. Any other loss waits for ``MIN_DRAFTED_SAMPLES``: two
#: DSpark cycles on a chat answer both commit one token about one time in six (2.7x plain
#: cost on their clock), and legacy MTP proposes nothing in about 45% of its cycles on the chat
#: answers it speeds up by 1.1x, so two such cycles in a row start one probe in five.
QUICK_SAMPLES = 2
#: Standard errors of the drafted cost per token (``DecayingCost.relative_error``) by which a
#: loss must exceed ``COST_MARGIN`` to pause drafting. Judged after every drafted cycle, so
#: each judgement must rarely err alone: at two, DSpark paused on the chat answers 0-1 times in
#: 17 instead of 6-7 (docs/performance.md, "Session 20").
LOSS_DEVIATIONS = 2.0
#: Drafting pauses when its seconds per committed token exceed plain decoding's by this share:
#: below it the difference is within the noise of a shared machine. Small: a drafter kept at
#: a loss within the margin loses all of it, while one paused for nothing loses only what its
#: probes cost (``PROBE_SHARE``), so a drafter that only breaks even (legacy MTP on the tiny
#: model's chat answers) had better pause.
COST_MARGIN = 0.02
#: Plain advances of a cost pause (about four tokens each), doubling after each losing probe.
COST_PAUSE = 8
MAX_COST_PAUSE = 32
#: The pause after a probe whose cycles all proposed nothing (legacy MTP held back by its margin
#: on prose and code), and the most of it a new request keeps. Such a probe costs the drafter's
#: catch-up over its window with no draft to show for it (about half a plain advance on the tiny
#: model); pauses doubling from ``COST_PAUSE`` probed legacy MTP four times in the quick bench's
#: 17 prose answers, which read 0.94-0.98x there against 1.00-1.01x never drafting.
MAX_SILENT_PAUSE = 64
#: A cost pause is also long enough that the time its probe lost against plain decoding is at
#: most this share of the pause's plain decoding, up to ``MAX_LOSS_PAUSE``: a drafter that
#: loses by far (a legacy MTP block on a CPU) pauses long at once, one that loses by little no
#: longer than the doubling gives (its probes cost little, and the next request's text may be
#: one it drafts well: pauses learned on chat answers, where DSpark breaks even, covered the
#: prose prompts it doubles the speed of, at 64 advances and more). 2%: a drafter that loses
#: everywhere then reads at least 0.97x plain decoding's speed (``ds4 bench``), with room for
#: the noise of its probes.
PROBE_SHARE = 0.02
MAX_LOSS_PAUSE = 256
#: A drafter cannot pay on any text when one of its drafted cycles costs more plain decoding
#: than the most tokens a cycle can commit (its whole draft accepted, and the target's token)
#: by more than this share, which keeps the noise of a shared machine from condemning a drafter
#: that pays on text it drafts well (legacy MTP on the tiny model: ~3.1 plain tokens a cycle,
#: at most 4 committed). GLM's one-token NextN on a CPU: 2.3-3.1 plain tokens a cycle, at most
#: 2 committed. Such a drafter pauses for ``MAX_LOSS_PAUSE`` at once (a probe of two cycles then
#: costs it ~0.2%), and a new request keeps the pause; any other pause is capped at
#: ``MAX_COST_PAUSE`` when a new request starts, since its text may be one the drafter drafts
#: well (pauses sized by losses on chat answers, where DSpark loses, covered whole prose prompts
#: it doubles the speed of).
CANNOT_PAY_MARGIN = 0.1
#: A draft ends before the first position accepted in fewer of the drafts that reach it than
#: this (``DraftScheduler.draft_length``). One more position adds its acceptance to a cycle's
#: tokens and a row to its verify pass (and to the drafter's own network, if it has one),
#: which on a CPU costs the tiny model about a sixth of a drafted token: DSpark's fifth
#: position, accepted in about one chat draft in sixteen (prose: seven in eight), lost more
#: than it won, and the fourth (one in five) won more. Drafting every cycle, four-token drafts
#: ran the chat prompts 2-4% faster than five, and three-token ones 5-7% slower than four; with
#: the cost rule, four against five gained 5-9% (docs/performance.md, "Session 21"). On a GPU
#: a MoE's verify row is not free either: each row reads its own experts; ds4 cuts DSpark's
#: drafts before a token its confidence head gives less than 0.7.
MIN_POSITION_ACCEPTANCE = 0.1
#: Drafts that must have reached a position (decayed count) before its acceptance can cut one:
#: the first few drafts of a request can all be rejected early on text the drafter drafts well.
MIN_POSITION_DRAFTS = 8.0
#: Draft positions: each verified draft that reaches a position weighs 1 there, the older ones
#: decay by this factor, so a position's acceptance is that of its last forty or so drafts (a
#: share of 0.2 then spreads by about ±0.06, and one of 0.06 by ±0.04).
POSITION_DECAY = 0.95
#: One draft in this many that its positions' acceptance would cut short
#: (``DraftScheduler.draft_length``) is drafted in full, so that the positions past the cut are
#: measured again: text the drafter drafts far (prose after a chat answer) lengthens the drafts
#: after a probe or two, at the cost of the cut rows in one cycle in this many meanwhile.
FULL_DRAFT_EVERY = 16


class Cycle(Enum):
    """What the next cycle of the loop does."""

    DRAFT = "draft"
    #: ds4's pause: no draft, the token verified alone, the drafter fed its row.
    PAUSE = "pause"
    #: The cost rule's pause: plain pipelined decoding, the drafter following the rows.
    PLAIN = "plain"
    #: No draft fits the rest of the budget.
    TAIL = "tail"


@dataclass
class DecayingCost:
    """Seconds per token over decaying sums of both (not an average of per-cycle ratios: a
    cycle that commits six tokens weighs six times one that commits one), and the decayed
    second moments that tell how far that ratio may be from the drafter's own."""

    seconds: float = 0.0
    tokens: float = 0.0
    #: The decayed count of samples (each sample weighs 1 when it comes), and of its squares.
    weight: float = 0.0
    weight_squares: float = 0.0
    #: Decayed sums of seconds², tokens² and seconds × tokens.
    seconds_squares: float = 0.0
    tokens_squares: float = 0.0
    products: float = 0.0
    samples: int = 0

    def add(self, seconds: float, tokens: int) -> None:
        if self.weight:
            seconds = min(seconds, COST_OUTLIER * self.seconds / self.weight)
        decay = COST_DECAY
        self.seconds = self.seconds * decay + seconds
        self.tokens = self.tokens * decay + tokens
        self.weight = self.weight * decay + 1.0
        self.weight_squares = self.weight_squares * decay * decay + 1.0
        self.seconds_squares = self.seconds_squares * decay + seconds * seconds
        self.tokens_squares = self.tokens_squares * decay + tokens * tokens
        self.products = self.products * decay + seconds * tokens
        self.samples += 1

    @property
    def per_token(self) -> float:
        return self.seconds / self.tokens if self.tokens else 0.0

    def relative_error(self) -> float:
        """The standard error of ``per_token`` as a share of it: the spread of the samples'
        seconds around ``per_token`` times their tokens, over the decayed weights' effective
        count (a ratio estimator's error). 0 before two samples."""
        if self.samples < 2 or not self.seconds:
            return 0.0
        effective = self.weight * self.weight / self.weight_squares
        rate = self.per_token
        # The weighted mean of (seconds - rate * tokens)², with Bessel's correction.
        spread = (
            self.seconds_squares - 2 * rate * self.products + rate * rate * self.tokens_squares
        ) / self.weight
        variance = max(spread, 0.0) * effective / (effective - 1)
        # The weighted mean's variance is the samples' over the effective count; per token.
        return math.sqrt(variance / effective) / (self.tokens / self.weight) / rate

    def restart(self) -> None:
        self.seconds = self.tokens = self.weight = self.weight_squares = 0.0
        self.seconds_squares = self.tokens_squares = self.products = 0.0
        self.samples = 0


@dataclass
class DraftPositions:
    """Per draft position k (0-based): decayed counts of the verified drafts that reached it and
    of those whose first k + 1 tokens were all accepted (``POSITION_DECAY``)."""

    reached: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)

    def add(self, drafted: int, accepted: int) -> None:
        grow = drafted - len(self.reached)
        if grow > 0:
            self.reached += [0.0] * grow
            self.kept += [0.0] * grow
        for k in range(drafted):
            self.reached[k] = self.reached[k] * POSITION_DECAY + 1.0
            self.kept[k] = self.kept[k] * POSITION_DECAY + (k < accepted)

    def acceptance(self, k: int) -> float | None:
        """The share of drafts reaching position ``k`` that had it accepted; None before
        ``MIN_POSITION_DRAFTS``."""
        if k >= len(self.reached) or self.reached[k] < MIN_POSITION_DRAFTS:
            return None
        return self.kept[k] / self.reached[k]


@dataclass
class CostMeter:
    """What drafting and plain decoding cost with one drafter, the cost rule's pause and how
    often each draft position is accepted: shared by the requests of that drafter
    (``DrafterLease``), so that each starts with what the earlier ones learned. Also the clock
    both costs are read from (tests give a scripted one)."""

    clock: Callable[[], float] = time.perf_counter
    plain: DecayingCost = field(default_factory=DecayingCost)
    drafted: DecayingCost = field(default_factory=DecayingCost)
    #: Seconds per drafted cycle that verified a draft (each weighs one "token").
    cycle: DecayingCost = field(default_factory=DecayingCost)
    #: Drafted cycles timed since ``drafted`` last restarted that verified a draft. None: each
    #: proposed nothing (MTP stopped by its margin on prose), and a cycle without a draft is a
    #: plain advance plus the proposal's cost, a loss however noisy the clock.
    verified_cycles: int = 0
    #: Plain advances left of the current cost pause, and the next pause's length.
    pause_left: int = 0
    next_pause: int = COST_PAUSE
    #: Whether the last cost pause found that the drafter cannot pay (``CANNOT_PAY_MARGIN``),
    #: and whether its probe's cycles all proposed nothing (``MAX_SILENT_PAUSE``).
    cannot_pay: bool = False
    silent: bool = False
    #: Drafted cycles timed since the last plain advance was (``PLAIN_MAX_AGE``).
    drafted_since_plain: int = 0
    #: Draft lengths whose first drafted cycle has run (``warm_up``).
    warmed_lengths: set[int] = field(default_factory=set)
    #: How often each draft position is accepted (``DraftScheduler.draft_length``), and the
    #: drafts cut by it since the last one drafted in full instead (``FULL_DRAFT_EVERY``).
    positions: DraftPositions = field(default_factory=DraftPositions)
    cut_cycles: int = 0

    def warm_up(self, draft_length: int) -> bool:
        """Whether a drafted cycle with a draft of ``draft_length`` tokens (0: the drafter
        proposed nothing) is the first of that length on this meter, and so is not timed: it
        compiled graphs for that shape."""
        if draft_length in self.warmed_lengths:
            return False
        self.warmed_lengths.add(draft_length)
        return True


@dataclass
class SchedulerStats:
    cycles: int = 0
    drafted_cycles: int = 0
    no_draft_cycles: int = 0
    paused_cycles: int = 0
    pauses: int = 0
    no_draft_pauses: int = 0
    tail_cycles: int = 0
    #: The cost rule: pauses, plain advances (pauses and plain-cost measurements) and the last
    #: judged seconds per token, drafted and plain (0 before any judgement).
    cost_pauses: int = 0
    plain_advances: int = 0
    drafted_cost: float = 0.0
    plain_cost: float = 0.0


@dataclass
class DraftScheduler:
    stats: SchedulerStats = field(default_factory=SchedulerStats)
    #: The drafter's longest draft; it scales the acceptance threshold (see MIN_ACCEPTED_SHARE).
    max_draft: int = 5
    costs: CostMeter = field(default_factory=CostMeter)
    #: Whether the cost rule applies to this request (the loop's ``_weighs_cost``): without it
    #: no cost pause, not even one an earlier request left, decides what a cycle does.
    weighs_cost: bool = True
    #: Whether proposing costs nothing (prompt lookup: no network, and a cycle without a copy
    #: to draft is a plain advance). Such a drafter loses only by drafts the target rejects,
    #: which depends on the text: its pauses stop at the doubling's ``MAX_COST_PAUSE``, never
    #: sized by a loss, which a pause learned on chat answers would carry into the prose it
    #: doubles the speed of (a quick bench read lookup at 1.14x there instead of 2.3x).
    free_proposals: bool = False
    #: Plain advances left of this request's measurement of plain decoding.
    _measure_left: int = 0
    #: Whether this request has measured plain decoding (see ``_judge_cost``).
    _plain_measured: bool = False
    #: Whether a judgement waits for the measurement of plain decoding under way.
    _judge_after_plain: bool = False
    _window_accepted: list[int] = field(default_factory=list)
    _window_no_draft: int = 0
    _pause_left: int = 0
    _no_draft_streak: int = 0

    def __post_init__(self) -> None:
        if not self.costs.cannot_pay:
            # An earlier request's text paused the drafter; this one's may draft well.
            kept = MAX_SILENT_PAUSE if self.costs.silent else MAX_COST_PAUSE
            self.costs.pause_left = min(self.costs.pause_left, kept)

    def drafting_over(self, remaining_budget: int) -> bool:
        """Whether no cycle drafts any more before the token budget runs out: a cycle commits
        its draft plus one token, so ``remaining_budget - 1`` draft tokens still fit."""
        return remaining_budget - 1 < min(MIN_TAIL_DRAFT, self.max_draft)

    def should_draft(self, remaining_budget: int) -> bool:
        """Whether the next cycle drafts (see ``next_cycle``)."""
        return self.next_cycle(remaining_budget) is Cycle.DRAFT

    def next_cycle(self, remaining_budget: int) -> Cycle:
        """What the next cycle does; a cycle that does not draft is counted here."""
        if self.drafting_over(remaining_budget):
            self.stats.cycles += 1
            self.stats.tail_cycles += 1
            return Cycle.TAIL
        if self._measure_left > 0 or (self.weighs_cost and self.costs.pause_left > 0):
            if self._measure_left > 0:
                self._measure_left -= 1
            else:
                if not self.stats.cycles:
                    self.stats.cost_pauses += 1  # an earlier request's pause goes on here
                self.costs.pause_left -= 1
            self.stats.cycles += 1
            self.stats.plain_advances += 1
            return Cycle.PLAIN
        if self._pause_left > 0:
            self._pause_left -= 1
            self.stats.cycles += 1
            self.stats.paused_cycles += 1
            return Cycle.PAUSE
        return Cycle.DRAFT

    def plain_advances_ahead(self) -> int:
        """Plain advances certain to follow the current cycle before any cycle drafts: the
        rest of the cost pause and of the measurement of plain decoding."""
        return self._measure_left + (self.costs.pause_left if self.weighs_cost else 0)

    def extend_pause(self, steps: int) -> int:
        """How many cycles of ds4's pause (``Cycle.PAUSE``, the first one already counted) one
        plain advance of up to ``steps`` tokens covers: the rest of the pause or ``steps``."""
        more = min(self._pause_left, steps - 1)
        self._pause_left -= more
        self.stats.cycles += more
        self.stats.paused_cycles += more
        return 1 + more

    def draft_length(self, longest: int) -> int:
        """How many tokens the next draft has, of the ``longest`` it may have: it ends before
        the first position whose tokens are accepted in fewer than ``MIN_POSITION_ACCEPTANCE``
        of the drafts that reach it. Greedy requests only, as the cost rule (a sampled
        request's draws depend on its drafts' lengths). The first position always stays
        (whether drafting pays at all is the cost rule's judgement), and one cut draft in
        ``FULL_DRAFT_EVERY`` is drafted in full."""
        if not self.weighs_cost:
            return longest
        costs = self.costs
        length = 1
        while length < longest:
            acceptance = costs.positions.acceptance(length)
            if acceptance is not None and acceptance < MIN_POSITION_ACCEPTANCE:
                break
            length += 1
        if length < longest:
            costs.cut_cycles += 1
            if costs.cut_cycles >= FULL_DRAFT_EVERY:
                costs.cut_cycles = 0
                return longest
        return length

    def record_cost(self, cycle: Cycle, seconds: float, tokens: int, draft_length: int = 0) -> None:
        """How long a drafted cycle (``Cycle.DRAFT``, which verified ``draft_length`` drafted
        tokens) or a plain advance (``Cycle.PLAIN``) took, and how many tokens it committed."""
        if tokens <= 0:
            return
        if cycle is Cycle.PLAIN:
            self.costs.plain.add(seconds, tokens)
            self.costs.drafted_since_plain = 0
            self._plain_measured = True
            if self._judge_after_plain and self._measure_left == 0:
                # The drafted cycles already timed judge now, not one more drafted cycle later
                # (a loss, most often: that cycle would lose too).
                self._judge_after_plain = False
                self._judge_cost()
            return
        self.costs.drafted.add(seconds, tokens)
        if draft_length:
            self.costs.cycle.add(seconds, 1)
            self.costs.verified_cycles += 1
        self.costs.drafted_since_plain += 1
        self._judge_cost()

    def _judge_cost(self) -> None:
        costs = self.costs
        drafted, plain = costs.drafted, costs.plain
        if drafted.samples < QUICK_SAMPLES:
            return
        if plain.samples < MIN_PLAIN_SAMPLES:
            self._measure_left = MIN_PLAIN_SAMPLES - plain.samples
            self._judge_after_plain = True
            return
        # Noise only adds time, so an old plain sample can only overstate plain cost, by any
        # factor on a loaded machine: measure it again.
        if costs.drafted_since_plain >= PLAIN_MAX_AGE:
            self._measure_plain_again()
            return
        nothing_drafted = costs.verified_cycles == 0
        cannot_pay = not self.free_proposals and self._cannot_pay()
        if drafted.samples < MIN_DRAFTED_SAMPLES and not cannot_pay:
            return
        self.stats.drafted_cost, self.stats.plain_cost = drafted.per_token, plain.per_token
        most = plain.per_token * (1 + COST_MARGIN)
        if not nothing_drafted and drafted.per_token <= most:
            costs.next_pause = max(COST_PAUSE, costs.next_pause // 2)
            costs.cannot_pay = False
            return
        within_noise = drafted.per_token <= most * (1 + LOSS_DEVIATIONS * drafted.relative_error())
        if not (nothing_drafted or cannot_pay) and within_noise:
            return  # dearer, but not beyond what its acceptance's spread could make it
        if not self._plain_measured:
            # Plain cost from an earlier request may date from a quieter moment of a shared
            # machine: measure it again now, and judge with that alone, before pausing.
            self._measure_plain_again()
            return
        # The cost pause covers any pause of ds4's rule, and its probe starts from fresh samples.
        pause = costs.next_pause
        costs.cannot_pay = cannot_pay
        if cannot_pay:
            pause = MAX_LOSS_PAUSE
        elif nothing_drafted:
            pause = MAX_SILENT_PAUSE
        elif not self.free_proposals:
            pause = max(pause, min(MAX_LOSS_PAUSE, self._pause_for_loss()))
        costs.pause_left, self._pause_left = pause, 0
        costs.silent = nothing_drafted
        costs.next_pause = min(2 * costs.next_pause, MAX_COST_PAUSE)
        drafted.restart()
        costs.verified_cycles = 0
        self.stats.cost_pauses += 1

    def _cannot_pay(self) -> bool:
        """Whether a drafted cycle costs more plain decoding than any cycle can commit, all
        drafted tokens accepted (``CANNOT_PAY_MARGIN``)."""
        cycle, plain = self.costs.cycle, self.costs.plain
        most = (self.max_draft + 1) * (1 + CANNOT_PAY_MARGIN)
        return cycle.samples > 0 and cycle.per_token > most * plain.per_token

    def _pause_for_loss(self) -> int:
        """Plain advances whose time the drafted cycles just judged lost, over PROBE_SHARE:
        the seconds they took beyond what plain decoding takes for their tokens, against the
        seconds of an average plain advance (sums decayed alike)."""
        drafted, plain = self.costs.drafted, self.costs.plain
        lost = drafted.seconds - plain.per_token * drafted.tokens
        advance = plain.seconds / plain.weight
        return math.ceil(lost / (PROBE_SHARE * advance)) if advance > 0 else 0

    def _measure_plain_again(self) -> None:
        """The next advances measure plain decoding from scratch; the judgement follows them."""
        self.costs.plain.restart()
        self._measure_left = MIN_PLAIN_SAMPLES
        self._judge_after_plain = True

    def record(self, drafted: int, accepted: int) -> None:
        """The outcome of a cycle that was allowed to draft."""
        self.stats.cycles += 1
        if drafted == 0:
            self.stats.no_draft_cycles += 1
            self._window_no_draft += 1
        else:
            self.stats.drafted_cycles += 1
            self.costs.positions.add(drafted, accepted)
        self._window_accepted.append(accepted)
        if len(self._window_accepted) == WINDOW_CYCLES:
            self._judge_window()

    def _judge_window(self) -> None:
        window, no_draft = self._window_accepted, self._window_no_draft
        self._window_accepted, self._window_no_draft = [], 0
        if no_draft >= MAX_NO_DRAFT_SHARE * len(window):
            self._pause_left = NO_DRAFT_PAUSES[min(self._no_draft_streak, len(NO_DRAFT_PAUSES) - 1)]
            self._no_draft_streak += 1
            self.stats.pauses += 1
            self.stats.no_draft_pauses += 1
            return
        self._no_draft_streak = 0
        if self.weighs_cost:
            return  # the cost rule judges what accepted drafts are worth (module docstring)
        threshold = min(MIN_MEAN_ACCEPTED, MIN_ACCEPTED_SHARE * self.max_draft)
        if sum(window) / len(window) < threshold:
            self._pause_left = LOW_ACCEPTANCE_PAUSE
            self.stats.pauses += 1
