"""What a generation reports when it ends, with what speculation accepted.

``Finished`` ends a ChatService request (after its text, reasoning and tool-call events);
``Done`` ends a token-level ``generate``. Both carry the generation's statistics and, when a
drafter took part, its acceptance (τ, acceptance rate, drafted and accepted counts, per draft
position and per drafter, the scheduler's pauses): a face reads ``acceptance`` and never needs
to know which decoder ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ds4mlx.engine.chat import ChatEvent
from ds4mlx.engine.generate import DecodeStep, DoneEvent, GenerationStats
from ds4mlx.speculation import SpeculativeStats


def acceptance_of(stats: GenerationStats) -> SpeculativeStats | None:
    """The speculative counters of a generation; None when it decoded without a drafter."""
    return stats if isinstance(stats, SpeculativeStats) else None


@dataclass(frozen=True)
class Finished:
    """The last event of a request."""

    finish_reason: str  # "stop", "length", "tool_calls", "context" or "cancelled"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens reused from the session instead of prefilled
    stats: GenerationStats = field(default_factory=GenerationStats)
    seconds: float = 0.0
    stop_sequence: str | None = None  # the stop string that ended the output, if one did
    reasoning_tokens: int = 0  # completion tokens generated inside the reasoning block

    @property
    def acceptance(self) -> SpeculativeStats | None:
        """What the drafter's drafts came to; None when no drafter took part."""
        return acceptance_of(self.stats)


class GenerationCancelled(Exception):
    """Thrown into a ChatService generation (``generator.throw``) to stop it early: it ends
    with a ``Finished`` whose reason is "cancelled", which counts what it had generated (a
    closed generation ends without one)."""


@dataclass
class Done(DoneEvent):
    """The last event of a token-level generation (``generate``)."""

    @property
    def acceptance(self) -> SpeculativeStats | None:
        """What the drafter's drafts came to; None when no drafter took part."""
        return acceptance_of(self.stats)


@dataclass(frozen=True)
class TokenLogprobs:
    """A generated token's log-probability and its step's most likely tokens, best first, as
    (text, bytes, log-probability); reported, when the sampling options ask, before the text
    the token adds (which a parser may hold back or turn into a tool call). The distribution is
    the sampler's: after logit biases, penalties and any constraint's mask, before temperature
    and the top-k/top-p/min-p filters."""

    text: str
    token_bytes: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...] = ()


ServiceEvent = ChatEvent | TokenLogprobs | Finished
# What a service generation yields to a scheduler that batches (``ChatService(sessions > 1)``).
ScheduledEvent = ServiceEvent | DecodeStep
