"""The assistant's turn as blocks, fed event by event: which block each event goes to, what it
adds and how it changes the turn; streamed calls and whole ones; the usage object; and the
frames a block stream sends for each change."""

from __future__ import annotations

import re

from ds4mlx.engine.chat import ReasoningDelta, TextDelta, ToolCallError
from ds4mlx.engine.chat import events as chat
from ds4mlx.generation import Finished
from ds4mlx.server.turn import (
    Block,
    BlockStream,
    BlockTracker,
    ResponseMeta,
    chat_usage,
    is_truncated,
    new_id,
    track,
)

import pytest

WEATHER = chat.ToolCall("get_weather", {"city": "Paris"})


def test_a_streamed_call_completed_by_a_call_of_another_tool_stays_unfinished():
    """The completed call names another tool: it is a call of its own, and the streamed one is
    left as cut off (fresh8's turn_streamed_call_completed_by_another_tool)."""
    other = chat.ToolCall("b", {"x": 1})
    tracker = BlockTracker("call_")
    tracker.add(chat.ToolCallStart("a"))
    tracker.add(chat.ToolCallArguments('{"y": '))
    block, text, change = tracker.add(chat.ToolCallComplete(other))
    assert (block.name, block.call, text, change) == ("b", other, "", "call")
    streamed = tracker.blocks[0]
    assert (streamed.name, streamed.call, streamed.arguments) == ("a", None, '{"y": ')
    assert [b.call for b in tracker.tool_calls] == [other]
    assert tracker.complete_blocks == [block]


def test_each_event_says_its_block_text_and_change():
    tracker = BlockTracker("call_")
    changes = [
        tracker.add(event)
        for event in (
            ReasoningDelta("think"),
            ReasoningDelta(" more"),
            TextDelta("Hi"),
            TextDelta(" there"),
            chat.ToolCallStart("get_weather"),
            chat.ToolCallArguments('{"city": '),
            chat.ToolCallArguments('"Paris"}'),
            chat.ToolCallComplete(WEATHER),
            TextDelta("after"),
        )
    ]
    reasoning, text, call, after = tracker.blocks
    assert [(block, added, change) for block, added, change in changes] == [
        (reasoning, "think", "opens"),
        (reasoning, " more", "delta"),
        (text, "Hi", "opens"),
        (text, " there", "delta"),
        (call, "", "call_opens"),
        (call, '{"city": ', "delta"),
        (call, '"Paris"}', "delta"),
        (call, "", "call_ends"),
        (after, "after", "opens"),
    ]
    assert (reasoning.kind, reasoning.text) == ("reasoning", "think more")
    assert (text.kind, text.text) == ("text", "Hi there")
    assert (call.kind, call.name, call.call, call.text) == (
        "tool_call",
        "get_weather",
        WEATHER,
        '{"city": "Paris"}',
    )
    assert (after.kind, after.text) == ("text", "after")
    assert tracker.joined("text") == "Hi thereafter"
    assert tracker.joined("reasoning") == "think more"


def test_reasoning_after_text_opens_a_new_block():
    tracker = track([TextDelta("a"), ReasoningDelta("b"), TextDelta("c")], "call_")
    assert [(b.kind, b.text) for b in tracker.blocks] == [
        ("text", "a"),
        ("reasoning", "b"),
        ("text", "c"),
    ]


def test_wrong_call_markup_is_text_of_the_open_text_block():
    tracker = BlockTracker("call_")
    tracker.add(TextDelta("see "))
    block, text, change = tracker.add(ToolCallError("<invoke oops>", "no name"))
    assert (block.kind, block.text, text, change) == (
        "text",
        "see <invoke oops>",
        "<invoke oops>",
        "delta",
    )


def test_arguments_without_a_streamed_call_are_text():
    tracker = BlockTracker("call_")
    tracker.add(chat.ToolCallComplete(WEATHER))
    block, text, change = tracker.add(chat.ToolCallArguments("{}"))
    assert (block.kind, block.text, text, change) == ("text", "{}", "{}", "opens")


def test_a_whole_call_has_its_own_id_and_its_arguments_as_json():
    tracker = BlockTracker("fc_")
    block, text, change = tracker.add(chat.ToolCallComplete(WEATHER))
    assert (text, change, block.name, block.text) == ("", "call", "get_weather", "")
    assert block.arguments == '{"city": "Paris"}'
    assert re.fullmatch("fc_[0-9a-f]{24}", block.call_id)
    second, *_ = tracker.add(chat.ToolCallComplete(WEATHER))
    assert second is not block and second.call_id != block.call_id


def test_a_completed_streamed_call_shows_its_calls_arguments_not_the_streamed_text():
    """The arguments of a completed call are its parsed arguments as JSON, however the model
    spaced them; those of a call cut off are the text written so far."""
    block = Block("tool_call", text='{ "city" :"Paris" }', call=WEATHER)
    assert block.arguments == '{"city": "Paris"}'
    assert Block("tool_call", text='{"ci').arguments == '{"ci'
    assert Block("tool_call", call=chat.ToolCall("f", {"name": "café"})).arguments == (
        '{"name": "café"}'
    )


def test_a_call_cut_off_is_neither_a_tool_call_nor_a_complete_block():
    tracker = track(
        [TextDelta("a"), chat.ToolCallComplete(WEATHER), chat.ToolCallStart("get_weather")],
        "call_",
    )
    text, whole, cut = tracker.blocks
    assert tracker.tool_calls == [whole]
    assert tracker.complete_blocks == [text, whole]
    assert cut.call is None


def test_the_usage_adds_prompt_and_completion_and_names_cached_and_reasoning_tokens():
    finished = Finished(
        "stop", prompt_tokens=30, completion_tokens=7, cached_tokens=12, reasoning_tokens=5
    )
    assert chat_usage(finished) == {
        "prompt_tokens": 30,
        "completion_tokens": 7,
        "total_tokens": 37,
        "prompt_tokens_details": {"cached_tokens": 12},
        "completion_tokens_details": {"reasoning_tokens": 5},
    }


@pytest.mark.parametrize(
    ("reason", "truncated"),
    [("length", True), ("context", True), ("stop", False), ("tool_calls", False)],
)
def test_only_the_token_limit_and_the_context_end_truncate(reason, truncated):
    assert is_truncated(Finished(reason, 1, 1, 0)) is truncated


def test_ids_take_their_prefix_and_24_random_hex_digits():
    ids = {new_id("resp_") for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch("resp_[0-9a-f]{24}", one) for one in ids)


def test_response_meta_defaults_to_no_prompt_and_now():
    meta = ResponseMeta("m")
    assert meta.prompt_tokens == 0
    assert abs(meta.created - ResponseMeta("m").created) <= 1


class RecordingStream(BlockStream):
    """A block stream whose frames name what was sent."""

    def _open(self, index: int, block: Block) -> list[bytes]:
        return [f"open {index} {block.kind}".encode()]

    def _delta(self, index: int, block: Block, text: str) -> list[bytes]:
        return [f"delta {index} {text}".encode()]

    def _close(self, index: int, block: Block) -> list[bytes]:
        return [f"close {index}".encode()]

    def _tool_call(self, index: int, block: Block) -> list[bytes]:
        return [f"call {index} {block.name}".encode()]


def test_a_block_stream_opens_feeds_and_closes_each_block_once():
    stream = RecordingStream("call_")
    frames = [
        stream.event(event)
        for event in (
            ReasoningDelta("r"),
            TextDelta("a"),
            TextDelta("b"),
            chat.ToolCallStart("get_weather"),
            chat.ToolCallArguments("{}"),
            chat.ToolCallComplete(WEATHER),
            chat.ToolCallComplete(WEATHER),
            TextDelta("c"),
        )
    ]
    assert frames == [
        [b"open 0 reasoning", b"delta 0 r"],
        [b"close 0", b"open 1 text", b"delta 1 a"],
        [b"delta 1 b"],
        [b"close 1", b"open 2 tool_call"],
        [b"delta 2 {}"],
        [b"close 2"],
        [b"call 3 get_weather"],
        [b"open 4 text", b"delta 4 c"],
    ]
    assert stream.close_open_block() == [b"close 4"]
    assert stream.close_open_block() == []
