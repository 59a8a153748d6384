"""When to draft: back off while drafting does not pay (ds4's scheduler defaults).

Drafted cycles are judged in windows. A window whose mean accepted length is too short, or in
which too many cycles produced no draft at all, pauses drafting for a few cycles; pauses caused by
missing drafts grow when they repeat. Near the end of the token budget a draft is cut to what the
budget can still take, and drafting stops once that is too short to pay for its verify pass. One
scheduler serves one request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class SchedulerStats:
    cycles: int = 0
    drafted_cycles: int = 0
    no_draft_cycles: int = 0
    paused_cycles: int = 0
    pauses: int = 0
    no_draft_pauses: int = 0
    tail_cycles: int = 0


@dataclass
class DraftScheduler:
    stats: SchedulerStats = field(default_factory=SchedulerStats)
    #: The drafter's longest draft; it scales the acceptance threshold (see MIN_ACCEPTED_SHARE).
    max_draft: int = 5
    _window_accepted: list[int] = field(default_factory=list)
    _window_no_draft: int = 0
    _pause_left: int = 0
    _no_draft_streak: int = 0

    def drafting_over(self, remaining_budget: int) -> bool:
        """Whether no cycle drafts any more before the token budget runs out: a cycle commits
        its draft plus one token, so ``remaining_budget - 1`` draft tokens still fit."""
        return remaining_budget - 1 < min(MIN_TAIL_DRAFT, self.max_draft)

    def should_draft(self, remaining_budget: int) -> bool:
        """Whether the next cycle drafts; a cycle that does not draft is counted here."""
        if self.drafting_over(remaining_budget):
            self.stats.cycles += 1
            self.stats.tail_cycles += 1
            return False
        if self._pause_left > 0:
            self._pause_left -= 1
            self.stats.cycles += 1
            self.stats.paused_cycles += 1
            return False
        return True

    def record(self, drafted: int, accepted: int) -> None:
        """The outcome of a cycle that was allowed to draft."""
        self.stats.cycles += 1
        if drafted == 0:
            self.stats.no_draft_cycles += 1
            self._window_no_draft += 1
        else:
            self.stats.drafted_cycles += 1
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
        threshold = min(MIN_MEAN_ACCEPTED, MIN_ACCEPTED_SHARE * self.max_draft)
        if sum(window) / len(window) < threshold:
            self._pause_left = LOW_ACCEPTANCE_PAUSE
            self.stats.pauses += 1
