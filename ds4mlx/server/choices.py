"""``n > 1`` on chat and legacy completions: several choices for one request.

Each choice is a generation of its own, queued on the engine as its own job, so that the
batched sessions (``--batched-session``) decode the choices together in batched steps, as they
would decode separate requests. The jobs are started one after another on the engine thread:
the first prefills the prompt, and the prompt state it keeps (the prompt cache, or the session's
prompt snapshot when the choices run one after another) gives the others the prompt without
prefilling it again.

Seeds: choice ``i`` samples with the request's ``seed + i`` (modulo 2**64), so that the choices
differ and each equals a single request made with that seed; without a seed each choice draws
its own. Greedy choices (temperature 0) are all the same text.

Usage counts the prompt once and the completion tokens of all choices, as OpenAI does; the
prompt's cached tokens are the first choice's. Streamed, each choice's chunks carry its index
and come choice after choice (``merged``), each ended by its finish reason, then the usage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from ds4mlx.generation import ChatEvent, Finished
from ds4mlx.server.generation import GenerationCall
from ds4mlx.server.queue import KeepAlive

SEED_MODULUS = 2**64


@dataclass(frozen=True)
class ChoicesCall(GenerationCall):
    """A call that asks for ``n`` choices (``choice_calls`` splits it)."""

    n: int = 1


@dataclass(frozen=True)
class ChoiceEvent:
    """An event of choice ``index``: its text, reasoning and tool-call events, then its own
    ``Finished`` (the request's ``Finished``, after all choices, counts them all)."""

    index: int
    event: ChatEvent | Finished


def with_choices(call: GenerationCall, n: int) -> GenerationCall:
    """``call`` asking for ``n`` choices."""
    if n == 1:
        return call
    return ChoicesCall(**{f.name: getattr(call, f.name) for f in dataclasses.fields(call)}, n=n)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed choice ``index`` samples with (see the module's text)."""
    return None if seed is None else (seed + index) % SEED_MODULUS


def choice_calls(call: GenerationCall) -> list[GenerationCall]:
    """One single-choice call per choice of ``call``."""
    if not isinstance(call, ChoicesCall):
        return [call]
    fields = {f.name: getattr(call, f.name) for f in dataclasses.fields(GenerationCall)}
    return [
        GenerationCall(
            **{
                **fields,
                "sampling": dataclasses.replace(
                    call.sampling, seed=choice_seed(call.sampling.seed, index)
                ),
            }
        )
        for index in range(call.n)
    ]


def total(finished: Sequence[Finished]) -> Finished:
    """The request's ``Finished`` over its choices': the prompt once, every choice's completion
    tokens, the first choice's finish reason (each choice carries its own)."""
    first = finished[0]
    return dataclasses.replace(
        first,
        completion_tokens=sum(f.completion_tokens for f in finished),
        reasoning_tokens=sum(f.reasoning_tokens for f in finished),
        seconds=max(f.seconds for f in finished),
    )


async def merged(
    streams: Sequence[AsyncIterator[ChatEvent | Finished | KeepAlive]],
) -> AsyncIterator[ChatEvent | Finished | KeepAlive]:
    """The choices' events tagged with their index, choice after choice (their jobs run
    meanwhile, their events waiting in their queues), then the request's ``Finished``. A
    choice that ends without one (cancelled) ends the whole without one too."""
    finished: list[Finished] = []
    for index, stream in enumerate(streams):
        async for item in stream:
            if isinstance(item, KeepAlive):
                yield item
                continue
            if isinstance(item, Finished):
                finished.append(item)
            yield ChoiceEvent(index, item)
        if len(finished) <= index:
            return
    yield total(finished)


def split_choices(
    events: Sequence[ChatEvent | ChoiceEvent], finished: Finished
) -> list[tuple[list[ChatEvent], Finished]]:
    """Per choice, in order: its events and its ``Finished`` (a single choice's are the
    request's own)."""
    if not any(isinstance(event, ChoiceEvent) for event in events):
        return [([e for e in events if not isinstance(e, ChoiceEvent)], finished)]
    count = 1 + max(e.index for e in events if isinstance(e, ChoiceEvent))
    choices: list[tuple[list[ChatEvent], Finished]] = [([], finished) for _ in range(count)]
    for event in events:
        if not isinstance(event, ChoiceEvent):
            continue
        own, ended = choices[event.index]
        if isinstance(event.event, Finished):
            choices[event.index] = (own, event.event)
        else:
            own.append(event.event)
    return choices
