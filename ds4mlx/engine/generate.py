"""The generation loop: prefill a prompt, then decode step by step.

A ``Decoder`` says how a generation advances on its own (one token at a time here; drafting and
verifying in ``speculation``); the stepped form lets a scheduler decode many generations' steps
in one batched pass instead. The entry points are ``ds4mlx.generation``'s ``generate`` and
``stepped``, which pick the decoder.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence, Set
from dataclasses import dataclass, field

from ds4mlx.engine.constraints import Constraint
from ds4mlx.engine.sampling import Sampler, SamplingOptions, TokenLogprob
from ds4mlx.engine.session import Session

import mlx.core as mx


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    stop_reason: str = ""

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        # The first generated token comes out of the prefill; decode time covers the rest.
        decoded = self.generated_tokens - 1
        return decoded / self.decode_seconds if decoded > 0 and self.decode_seconds else 0.0


@dataclass
class TokenEvent:
    token: int
    #: its log-probability, when the sampling options ask for them
    logprob: TokenLogprob | None = None


@dataclass
class DoneEvent:
    stats: GenerationStats = field(default_factory=GenerationStats)


def check_prompt_fits(session: Session, prompt: Sequence[int], max_context: int | None) -> None:
    if not prompt:
        raise ValueError("the prompt is empty")
    if max_context is not None and session.n_tokens + len(prompt) > max_context:
        raise ValueError(
            f"prompt of {len(prompt)} tokens does not fit the context of {max_context} "
            f"({session.n_tokens} already used)"
        )


def stop_reason(
    token: int,
    generated: int,
    stop_tokens: Set[int],
    max_tokens: int,
    session_tokens: int,
    max_context: int | None,
) -> str:
    """Why generation ends after yielding ``token`` ("" when it goes on)."""
    if token in stop_tokens:
        return "stop"
    if generated >= max_tokens:
        return "length"
    if max_context is not None and session_tokens >= max_context:
        return "context"
    return ""


@dataclass(frozen=True)
class DecodeStep:
    """What a stepped generation yields when its session holds every token but ``token``, the
    last one sampled: the driver answers (``send``) with the logits row of ``token``, computed in
    one batched step with other sessions' steps (``feed_batch``), or with None to let the
    generation decode on its own, speculatively if its decoder can."""

    session: Session
    token: int


@dataclass(frozen=True)
class Limits:
    """Where a generation must end: after ``max_tokens``, at a stop token, or with the session
    at ``max_context`` tokens."""

    max_tokens: int
    stop_tokens: frozenset[int] = frozenset()
    max_context: int | None = None


class Decoder:
    """How a generation advances on its own: one token per target pass. The speculative decoder
    (``speculation.loop``) overrides the prefill and the step to draft and verify.

    Plain decoding is pipelined: an ``advance`` decodes up to ``pipeline`` tokens back to back,
    sampling on the device and feeding each sampled token to the next step before the host has
    read it, so the host builds step t + 1's graph while the device computes step t and syncs
    once for the lot. Greedy output is the same as one step at a time; a stop token or the
    limits inside the run cut it there (the steps past a stop are rolled back). Under a
    constraint the steps share its mask, so a run is queued only while the mask is ``static``,
    and it is cut after a token that changes it (``cut_tokens``) as after a stop.
    """

    #: steps one ``advance`` queues before the host reads their tokens
    pipeline: int = 4

    def new_stats(self, prompt_tokens: int) -> GenerationStats:
        return GenerationStats(prompt_tokens=prompt_tokens)

    def prefill(
        self, session: Session, prompt: Sequence[int], sampler: Sampler, stats: GenerationStats
    ) -> int:
        """Feed ``prompt``; the first generated token."""
        return sampler(session.feed_mx(prompt, all_logits=False)[-1])

    def advance(
        self, session: Session, token: int, sampler: Sampler, stats: GenerationStats, limits: Limits
    ) -> list[int]:
        """Feed ``token``, the last committed one; the tokens that follow it (at least one)."""
        room = limits.max_tokens - stats.generated_tokens
        if limits.max_context is not None:
            room = min(room, limits.max_context - session.n_tokens)
        steps = min(self.pipeline, room)
        constraint = sampler.constraint
        if steps <= 1 or not session.lazy_feeds or not (constraint is None or constraint.static):
            return [sampler(self.feed_read(session, token))]
        pos = session.n_tokens
        session.check_tokens([token])
        window = sampler.recent_tokens()
        last_n = sampler.options.repeat_last_n
        logits = self.feed_queued(session, mx.array([token], dtype=mx.int32))
        drawn: list[mx.array] = []
        rows: list[mx.array] = []
        for step in range(steps):
            row = sampler.masked_on_device(sampler.penalized_on_device(logits[-1], window))
            sampled = sampler.draw_on_device(row)
            drawn.append(sampled)
            rows.append(row)
            if step == steps - 1:
                mx.async_eval(sampled)
                break
            window = mx.concatenate([window, sampled])[-last_n:]
            logits = self.feed_queued(session, sampled)
        sampled_tokens = mx.concatenate(drawn)
        logprobs = sampler.logprob_arrays(mx.stack(rows), sampled_tokens)
        tokens = [int(t) for t in sampled_tokens.tolist()]
        session.confirm([token, *tokens[:-1]])
        cuts = limits.stop_tokens | (constraint.cut_tokens if constraint is not None else set())
        stop_at = next((i for i, t in enumerate(tokens) if t in cuts), None)
        if stop_at is not None:
            # As in plain decoding, generation ends with the stop token, which is never fed;
            # a token that changes the constraint's mask is fed by the next step, under it.
            session.truncate(pos + 1 + stop_at)
            tokens = tokens[: stop_at + 1]
        sampler.keep_logprobs(logprobs, tokens)
        return tokens

    def feed_read(self, session: Session, token: int) -> mx.array:
        """Feed one token the host knows; its logits row. A subclass that also wants the
        step's hidden states (a drafter following plain steps) overrides both feeds."""
        return session.feed_mx([token])[-1]

    def feed_queued(self, session: Session, token: mx.array) -> mx.array:
        """Feed one token the device sampled, unread (``Session.feed_lazy``); its logits."""
        return session.feed_lazy(token)

    def batched(self) -> None:
        """A batched step, which this decoder did not take part in, advanced the session."""


def stepped_generate(
    session: Session,
    prompt: Sequence[int],
    max_tokens: int,
    sampling: SamplingOptions | None = None,
    stop_tokens: Sequence[int] = (),
    max_context: int | None = None,
    decoder: Decoder | None = None,
    constraint: Constraint | None = None,
) -> Generator[TokenEvent | DoneEvent | DecodeStep, mx.array | None, None]:
    """``generate`` that yields a DecodeStep before each decode step (see DecodeStep), so that a
    scheduler can decode many generations in one batched pass. The prefill always runs alone.
    ``constraint`` masks every step's logits (``engine.constraints``)."""
    decoder = decoder or Decoder()
    sampler = Sampler(sampling or SamplingOptions(), constraint)
    stats = decoder.new_stats(len(prompt))
    check_prompt_fits(session, prompt, max_context)
    if sampler.options.logit_bias:
        try:
            session.check_tokens([token for token, _ in sampler.options.logit_bias])
        except ValueError as exc:
            raise ValueError(f"logit_bias: {exc}") from None

    start = time.perf_counter()
    # The penalties look back on the context, not on what this call feeds: a prompt-cache hit
    # restores part of the prompt into the session and feeds only the rest, and its answer
    # must equal the cold one's (llama.cpp's window covers the cached prompt tokens too).
    sampler.record(session.tokens[-sampler.options.repeat_last_n :])
    sampler.record(prompt)
    pending = [decoder.prefill(session, prompt, sampler, stats)]  # tokens to yield, in order
    stats.prefill_seconds = time.perf_counter() - start  # sampling forced the evaluation

    start = time.perf_counter()
    limits = Limits(max_tokens, frozenset(stop_tokens), max_context)
    while pending:
        token = pending.pop(0)
        sampler.commit(token)
        stats.generated_tokens += 1
        yield TokenEvent(token, sampler.take_logprob())
        # A pipelined or verified advance has already fed the tokens still pending (all but
        # its last): the context holds what was yielded so far, not what was fed ahead.
        stats.stop_reason = stop_reason(
            token,
            stats.generated_tokens,
            limits.stop_tokens,
            max_tokens,
            session.n_tokens - len(pending),
            max_context,
        )
        if stats.stop_reason:
            break
        if pending:
            continue
        logits = yield DecodeStep(session, token)
        if logits is None:
            pending = decoder.advance(session, token, sampler, stats, limits)
        else:
            decoder.batched()
            pending = [sampler(logits)]
    stats.decode_seconds = time.perf_counter() - start
    yield DoneEvent(stats)


def run_alone(
    events: Generator[TokenEvent | DoneEvent | DecodeStep, mx.array | None, None],
) -> Iterator[TokenEvent | DoneEvent]:
    """A stepped generation driven by itself: it decodes every step on its own."""
    try:
        for event in events:
            if not isinstance(event, DecodeStep):
                yield event
    finally:
        events.close()
