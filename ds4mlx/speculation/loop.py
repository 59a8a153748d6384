"""The speculative generation loop: draft, verify in one batched target pass, commit the accepted
prefix, cut the rejected rows off the session (never recomputing the accepted ones)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ds4mlx.engine.generate import (
    DoneEvent,
    GenerationStats,
    TokenEvent,
    check_prompt_fits,
    stop_reason,
)
from ds4mlx.engine.sampling import Sampler, SamplingOptions
from ds4mlx.engine.session import Session
from ds4mlx.speculation.acceptance import AcceptanceMode, accept
from ds4mlx.speculation.drafter import Draft, Drafter, TargetRows
from ds4mlx.speculation.scheduler import DraftScheduler, SchedulerStats


@dataclass(frozen=True)
class SpeculationOptions:
    mode: AcceptanceMode = AcceptanceMode.OPPORTUNISTIC
    #: Cut a draft at the first token whose confidence is below this (DSpark); 0 keeps all.
    confidence_threshold: float = 0.0
    #: Upper bound on tokens per draft (the drafter's own cap applies too).
    max_draft: int = 16


@dataclass
class SpeculativeStats(GenerationStats):
    verify_passes: int = 0  # target passes after the prefill, with or without a draft
    drafted_passes: int = 0  # those that verified a non-empty draft
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accept_seconds: float = 0.0
    scheduler: SchedulerStats = field(default_factory=SchedulerStats)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify of a draft (accepted drafts + the target's own)."""
        if not self.drafted_passes:
            return 0.0
        return (self.accepted_tokens + self.drafted_passes) / self.drafted_passes


def _rows(out, pos0: int) -> TargetRows:
    return TargetRows(pos0, out.layers, out.head_input, out.final_hidden)


def _cut_by_confidence(draft: Draft, threshold: float) -> list[int]:
    if not threshold or draft.confidences is None:
        return list(draft.tokens)
    kept = []
    for token, confidence in zip(draft.tokens, draft.confidences, strict=True):
        if confidence < threshold:
            break
        kept.append(token)
    return kept


def speculative_generate(
    session: Session,
    drafter: Drafter,
    prompt: Sequence[int],
    max_tokens: int,
    sampling: SamplingOptions | None = None,
    options: SpeculationOptions | None = None,
    stop_tokens: Sequence[int] = (),
    max_context: int | None = None,
) -> Iterator[TokenEvent | DoneEvent]:
    """Like ``engine.generate`` (same events, same stopping rules) but drafting with ``drafter``.

    At temperature 0 the committed tokens are the target's greedy tokens. The DoneEvent carries
    SpeculativeStats.
    """
    check_prompt_fits(session, prompt, max_context)
    options = options or SpeculationOptions()
    sampler = Sampler(sampling or SamplingOptions())
    capture = tuple(drafter.capture_layers)
    stats = SpeculativeStats(prompt_tokens=len(prompt))
    scheduler = DraftScheduler(stats.scheduler, max_draft=drafter.max_draft)
    stop_set = set(stop_tokens)
    # Drafts short enough that the verify pass's logits equal one-token decode's bit for bit.
    max_draft_for_parity = getattr(session.model, "max_invariant_rows", 1 << 30) - 1

    start = time.perf_counter()
    pos0 = session.n_tokens
    out = session.feed_hidden(prompt, capture)
    current = sampler(out.logits[-1])
    stats.prefill_seconds = time.perf_counter() - start
    drafter.reset()
    drafter.observe(prompt, current, _rows(out, pos0))

    start = time.perf_counter()
    pending = [current]  # tokens to yield, in order
    while pending:
        token = pending.pop(0)
        stats.generated_tokens += 1
        yield TokenEvent(token)
        stats.stop_reason = stop_reason(token, stats.generated_tokens, stop_set, max_tokens,
                                        session.n_tokens, max_context)
        if stats.stop_reason:
            break
        if pending:
            continue

        # One cycle: `token` is the last committed token, not yet fed to the target.
        room = max_tokens - stats.generated_tokens - 1
        if max_context is not None:
            room = min(room, max_context - session.n_tokens - 1)
        draft: list[int] = []
        drafting = room > 0 and scheduler.should_draft(max_tokens - stats.generated_tokens)
        if drafting:
            tick = time.perf_counter()
            proposal = drafter.propose(min(room, drafter.max_draft, options.max_draft,
                                           max_draft_for_parity))
            draft = _cut_by_confidence(proposal, options.confidence_threshold)
            stats.draft_seconds += time.perf_counter() - tick

        tick = time.perf_counter()
        pos = session.n_tokens
        out = session.feed_hidden([token, *draft], capture)
        stats.verify_seconds += time.perf_counter() - tick
        tick = time.perf_counter()
        verdict = accept(out.logits, draft, sampler, options.mode)
        stats.accept_seconds += time.perf_counter() - tick
        if drafting:
            scheduler.record(len(draft), verdict.accepted)

        committed = draft[: verdict.accepted]
        stats.verify_passes += 1
        stats.drafted_passes += bool(draft)
        stats.drafted_tokens += len(draft)
        stats.accepted_tokens += len(committed)
        stop_at = next((i for i, t in enumerate(committed) if t in stop_set), None)
        if stop_at is not None:
            # As in plain decoding, generation ends with the stop token, which is never fed.
            session.truncate(pos + 1 + stop_at)
            pending = committed[: stop_at + 1]
            continue
        session.truncate(pos + 1 + len(committed))
        drafter.observe([token, *committed], verdict.next_token,
                        _rows(out, pos).take(1 + len(committed)))
        pending = [*committed, verdict.next_token]
    stats.decode_seconds = time.perf_counter() - start
    yield DoneEvent(stats)
