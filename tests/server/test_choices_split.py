"""``n`` choices without a model: splitting a call, seeds, merging streams, totals."""

from __future__ import annotations

import asyncio

from ds4mlx.engine.chat.events import TextDelta
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.generation import Finished
from ds4mlx.server.choices import (
    ChoiceEvent,
    ChoicesCall,
    choice_calls,
    merged,
    split_choices,
    total,
    with_choices,
)
from ds4mlx.server.generation import GenerationCall
from ds4mlx.server.queue import KEEP_ALIVE

CALL = GenerationCall(max_tokens=8, sampling=SamplingOptions(temperature=1.0, seed=7))


def ended(completion: int, reason: str = "stop", seconds: float = 1.0, reasoning: int = 0):
    return Finished(reason, 10, completion, 4, seconds=seconds, reasoning_tokens=reasoning)


def test_one_choice_stays_the_call_itself():
    assert with_choices(CALL, 1) is CALL
    assert choice_calls(CALL) == [CALL]


def test_n_choices_split_into_n_calls_with_consecutive_seeds():
    many = with_choices(CALL, 3)
    assert isinstance(many, ChoicesCall) and many.n == 3
    calls = choice_calls(many)
    assert [type(call) for call in calls] == [GenerationCall] * 3
    assert [call.sampling.seed for call in calls] == [7, 8, 9]
    assert all(call.max_tokens == 8 and call.sampling.temperature == 1.0 for call in calls)


def test_without_a_seed_no_choice_gets_one():
    unseeded = GenerationCall(max_tokens=8, sampling=SamplingOptions(temperature=1.0))
    assert [c.sampling.seed for c in choice_calls(with_choices(unseeded, 2))] == [None, None]


def test_the_total_counts_every_choice_and_keeps_the_first_reason():
    summed = total([ended(3, "length", 2.0, 1), ended(5, "stop", 6.0, 2), ended(1, "stop", 1.0)])
    assert summed.finish_reason == "length"
    assert (summed.prompt_tokens, summed.completion_tokens, summed.cached_tokens) == (10, 9, 4)
    assert summed.reasoning_tokens == 3 and summed.seconds == 6.0


async def _stream(*items):
    for item in items:
        yield item


def _collect(streams):
    async def run():
        return [item async for item in merged(streams)]

    return asyncio.run(run())


def test_merged_tags_each_choice_in_order_then_totals():
    first, second = ended(2), ended(3, "length")
    items = _collect(
        [
            _stream(TextDelta("a"), KEEP_ALIVE, first),
            _stream(TextDelta("b"), second),
        ]
    )
    assert items[:5] == [
        ChoiceEvent(0, TextDelta("a")),
        KEEP_ALIVE,
        ChoiceEvent(0, first),
        ChoiceEvent(1, TextDelta("b")),
        ChoiceEvent(1, second),
    ]
    assert items[5] == total([first, second]) and len(items) == 6


def test_a_choice_without_its_end_ends_the_whole_without_one():
    items = _collect(
        [_stream(TextDelta("a"), ended(1)), _stream(TextDelta("b")), _stream(ended(1))]
    )
    assert items == [
        ChoiceEvent(0, TextDelta("a")),
        ChoiceEvent(0, ended(1)),
        ChoiceEvent(1, TextDelta("b")),
    ]
    first_cut = _collect([_stream(TextDelta("a")), _stream(ended(1))])
    assert first_cut == [ChoiceEvent(0, TextDelta("a"))]


def test_split_choices_gives_each_its_events_and_end():
    request_end = ended(9)
    events = [
        ChoiceEvent(0, TextDelta("a")),
        ChoiceEvent(0, ended(1, "length")),
        ChoiceEvent(2, TextDelta("c")),
        ChoiceEvent(1, TextDelta("b")),
        ChoiceEvent(1, ended(2)),
    ]
    choices = split_choices(events, request_end)
    assert choices == [
        ([TextDelta("a")], ended(1, "length")),
        ([TextDelta("b")], ended(2)),
        ([TextDelta("c")], request_end),
    ]


def test_a_single_choice_is_the_requests_own_events():
    events = [TextDelta("a"), TextDelta("b")]
    assert split_choices(events, ended(2)) == [(events, ended(2))]
