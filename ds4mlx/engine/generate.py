"""The plain generation loop: prefill a prompt, then decode one token at a time.

Faces (CLI, agent, server) consume the event stream; speculative decoding plugs in here later.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ds4mlx.engine.sampling import Sampler, SamplingOptions
from ds4mlx.engine.session import Session


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


def stop_reason(token: int, generated: int, stop_tokens: set[int], max_tokens: int,
                session_tokens: int, max_context: int | None) -> str:
    """Why generation ends after yielding ``token`` ("" when it goes on)."""
    if token in stop_tokens:
        return "stop"
    if generated >= max_tokens:
        return "length"
    if max_context is not None and session_tokens >= max_context:
        return "context"
    return ""


def generate(
    session: Session,
    prompt: Sequence[int],
    max_tokens: int,
    sampling: SamplingOptions | None = None,
    stop_tokens: Sequence[int] = (),
    max_context: int | None = None,
) -> Iterator[TokenEvent | DoneEvent]:
    """Feed ``prompt`` (continuing the session) and yield sampled tokens, then a DoneEvent.

    Stops at ``max_tokens``, at a stop token (which is yielded; callers decide whether to show
    it), or when the session reaches ``max_context`` tokens.
    """
    sampler = Sampler(sampling or SamplingOptions())
    stats = GenerationStats(prompt_tokens=len(prompt))
    check_prompt_fits(session, prompt, max_context)

    start = time.perf_counter()
    logits = session.feed_mx(prompt)[-1]
    token = sampler(logits)  # forces evaluation, so the prefill time is real
    stats.prefill_seconds = time.perf_counter() - start

    start = time.perf_counter()
    stop_set = set(stop_tokens)
    while True:
        stats.generated_tokens += 1
        yield TokenEvent(token)
        stats.stop_reason = stop_reason(token, stats.generated_tokens, stop_set, max_tokens,
                                        session.n_tokens, max_context)
        if stats.stop_reason:
            break
        token = sampler(session.feed_mx([token])[-1])
    stats.decode_seconds = time.perf_counter() - start
    yield DoneEvent(stats)
