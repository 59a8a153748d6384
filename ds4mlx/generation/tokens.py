"""Token-level generation: a prompt's tokens in, sampled tokens out, speculatively when a
drafter is given (``speculation``'s verify loop) and by plain decoding otherwise."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence

from ds4mlx.engine.generate import DecodeStep, DoneEvent, TokenEvent, run_alone, stepped_generate
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.session import Session
from ds4mlx.generation.events import Done
from ds4mlx.speculation.config import SpeculationConfig
from ds4mlx.speculation.drafter import Drafter
from ds4mlx.speculation.loop import DrafterLease, SpeculativeDecoder

import mlx.core as mx


def stepped(
    session: Session,
    prompt: Sequence[int],
    max_tokens: int,
    sampling: SamplingOptions | None = None,
    drafter: Drafter | None = None,
    config: SpeculationConfig | None = None,
    stop_tokens: Sequence[int] = (),
    max_context: int | None = None,
    lease: DrafterLease | None = None,
) -> Generator[TokenEvent | DoneEvent | DecodeStep, mx.array | None, None]:
    """``generate`` in stepped form (see ``engine.generate.DecodeStep``): a step decoded on its
    own drafts with ``drafter`` (unless the config is strict), a batched one does not.
    ``lease`` tracks which generation the shared drafter follows."""
    config = config or SpeculationConfig()
    decoder = (
        None
        if drafter is None or config.strict
        else SpeculativeDecoder(drafter, config.loop_options, lease)
    )
    return stepped_generate(
        session, prompt, max_tokens, sampling, stop_tokens, max_context, decoder
    )


def generate(
    session: Session,
    prompt: Sequence[int],
    max_tokens: int,
    sampling: SamplingOptions | None = None,
    drafter: Drafter | None = None,
    config: SpeculationConfig | None = None,
    stop_tokens: Sequence[int] = (),
    max_context: int | None = None,
) -> Iterator[TokenEvent | Done]:
    """Feed ``prompt`` (continuing the session) and yield sampled tokens, then a ``Done`` with
    the statistics and the acceptance: speculatively with ``drafter`` unless none is given or
    the config is strict (target-only, for comparisons). Stops at ``max_tokens``, at a stop
    token (which is yielded; callers decide whether to show it), or when the session reaches
    ``max_context`` tokens."""
    events = stepped(
        session, prompt, max_tokens, sampling, drafter, config, stop_tokens, max_context
    )
    return _ended_by_done(run_alone(events))


def _ended_by_done(events: Iterator[TokenEvent | DoneEvent]) -> Iterator[TokenEvent | Done]:
    try:
        for event in events:
            yield Done(event.stats) if isinstance(event, DoneEvent) else event
    finally:
        events.close()
