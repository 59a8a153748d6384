"""Token-level generation: a prompt's tokens in, sampled tokens out, speculatively when a
drafter is given (``speculation``'s verify loop) and by plain decoding otherwise."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from typing import ParamSpec

from ds4mlx.engine.constraints import Constraint, markup_ban
from ds4mlx.engine.generate import DecodeStep, DoneEvent, TokenEvent, run_alone, stepped_generate
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.session import Session
from ds4mlx.generation.events import Done
from ds4mlx.speculation.config import SpeculationConfig
from ds4mlx.speculation.drafter import Drafter
from ds4mlx.speculation.loop import DrafterLease, SpeculativeDecoder

import mlx.core as mx

P = ParamSpec("P")


def chat_markup_ban(model) -> Constraint | None:
    """What keeps a loaded model's tool-call markup out of a plain chat answer (``ds4 --chat``:
    no tools are on offer, so the tokens that would open a call are never sampled); None for
    a model without a chat template or without such tokens."""
    if model.chat_format is None:
        return None
    return markup_ban(model.tokenizer, model.chat_format.call_marker)


#: A stepped generation: tokens, a ``DecodeStep`` before each step (answered with its logits
#: row, or None to decode it alone), then the ``DoneEvent``.
Stepped = Generator[TokenEvent | DoneEvent | DecodeStep, mx.array | None, None]


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
    constraint: Constraint | None = None,
) -> Stepped:
    """``generate`` in stepped form (see ``engine.generate.DecodeStep``): a step decoded on its
    own drafts with ``drafter`` (unless the config is strict), a batched one does not.
    ``lease`` tracks which generation the shared drafter follows; ``constraint`` masks every
    step (``engine.constraints``), drafted ones included."""
    config = config or SpeculationConfig()
    decoder = (
        None
        if drafter is None or config.strict
        else SpeculativeDecoder(drafter, config.loop_options, lease)
    )
    return stepped_generate(
        session, prompt, max_tokens, sampling, stop_tokens, max_context, decoder, constraint
    )


def _driven_alone(
    stepped_form: Callable[P, Stepped],
) -> Callable[P, Iterator[TokenEvent | Done]]:
    """A stepped generation that decodes every step on its own, as a function with the same
    parameters: one parameter list for both entry points."""

    def generate(*args: P.args, **kwargs: P.kwargs) -> Iterator[TokenEvent | Done]:
        """Feed ``prompt`` (continuing the session) and yield sampled tokens, then a ``Done``
        with the statistics and the acceptance: speculatively with ``drafter`` unless none is
        given or the config is strict (target-only, for comparisons). Stops at ``max_tokens``,
        at a stop token (which is yielded; callers decide whether to show it), or when the
        session reaches ``max_context`` tokens. The parameters are ``stepped``'s."""
        return _ended_by_done(run_alone(stepped_form(*args, **kwargs)))

    return generate


def _ended_by_done(events: Iterator[TokenEvent | DoneEvent]) -> Iterator[TokenEvent | Done]:
    try:
        for event in events:
            yield Done(event.stats) if isinstance(event, DoneEvent) else event
    finally:
        events.close()


generate = _driven_alone(stepped)
