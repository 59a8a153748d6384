"""``/v1/messages`` translated field by field (no model, no server): content blocks into the
chat turns, tool choices and tools into the engine's, and a turn's events into the message and
its event stream."""

from __future__ import annotations

import json

from ds4mlx.engine.chat import events as chat
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.generation import Finished
from ds4mlx.server.anthropic_messages import MessagesEndpoint
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import GenerationDefaults, parse_request
from ds4mlx.server.turn import ResponseMeta

import pytest

from server.harness import encoded_stream, named_events

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
DEFAULTS = GenerationDefaults(max_tokens=100, sampling=SamplingOptions(temperature=0.5))
META = ResponseMeta("served-model", created=7, prompt_tokens=11)
ENDPOINT = MessagesEndpoint()


def request_for(**body):
    return parse_request(
        ENDPOINT.request_model,
        json.dumps({"model": "asked-model", "max_tokens": 8, **body}).encode(),
    )


def call_for(defaults: GenerationDefaults = DEFAULTS, **body):
    return ENDPOINT.call(request_for(**body), defaults)


def refusal(**body) -> APIError:
    with pytest.raises(APIError) as refused:
        call_for(**body)
    assert refused.value.status == 400
    return refused.value


def finished(reason: str = "stop", stop_sequence: str | None = None) -> Finished:
    return Finished(
        reason,
        prompt_tokens=11,
        completion_tokens=5,
        cached_tokens=4,
        stats=None,
        stop_sequence=stop_sequence,
        reasoning_tokens=2,
    )


# ------------------------------------------------------------------------------ requests


def test_a_tool_result_without_its_id_names_no_call():
    call = call_for(
        messages=[{"role": "user", "content": [{"type": "tool_result", "content": "sunny"}]}]
    )
    assert call.messages == [{"role": "tool", "tool_call_id": "", "content": "sunny"}]


def test_an_image_in_a_tool_result_is_refused_by_its_place():
    error = refusal(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]},
                ],
            }
        ]
    )
    assert error.param == "messages[0].content[1].content[0]"


@pytest.mark.parametrize("role", ["user", "assistant"])
def test_a_text_block_without_text_is_refused(role):
    error = refusal(messages=[{"role": role, "content": [{"type": "text"}]}])
    assert error.param == "messages[0].content[0]"
    assert error.code == "unsupported_parameter"


def test_thinking_blocks_and_text_blocks_of_a_turn_are_joined_redacted_ones_skipped():
    call = call_for(
        messages=[
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "First, ", "signature": "s"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "thinking", "thinking": "then."},
                    {"type": "thinking", "signature": "only"},
                    {"type": "text", "text": "Hello "},
                    {"type": "text", "text": "there."},
                ],
            },
        ]
    )
    assert call.messages[1] == {
        "role": "assistant",
        "content": "Hello there.",
        "reasoning_content": "First, then.",
        "tool_calls": [],
    }


def test_an_unknown_assistant_block_is_refused_by_its_place():
    error = refusal(
        messages=[
            {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}
        ]
    )
    assert (error.param, error.code) == ("messages[0].content[1]", "unsupported_parameter")


def test_a_tool_use_needs_a_name_and_may_leave_out_its_input():
    error = refusal(
        messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "input": {}}]}]
    )
    assert error.param == "messages[0].content[0].name"
    assert "'messages[0].content[0].name' is required for tool_use" in error.message
    call = call_for(
        messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f"}]}]
    )
    assert call.messages[0]["tool_calls"] == [
        {"id": "t1", "function": {"name": "f", "arguments": {}}}
    ]


@pytest.mark.parametrize("system", ["", [], None])
def test_an_empty_system_prompt_adds_no_system_message(system):
    body = {} if system is None else {"system": system}
    call = call_for(messages=[{"role": "user", "content": "hi"}], **body)
    assert call.messages == [{"role": "user", "content": "hi"}]


def test_system_blocks_are_joined_by_newlines_and_string_content_kept_as_is():
    call = call_for(
        system=[{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
        messages=[{"role": "user", "content": "  spaced  "}],
    )
    assert call.messages == [
        {"role": "system", "content": "One.\nTwo."},
        {"role": "user", "content": "  spaced  "},
    ]


TOOL = {"name": "get_weather", "input_schema": SCHEMA}
USER = [{"role": "user", "content": "Weather?"}]


def test_a_named_tool_choice_needs_a_name():
    error = refusal(messages=USER, tools=[TOOL], tool_choice={"type": "tool"})
    assert error.param == "tool_choice.name"
    assert error.message == "'tool_choice.name' is required for tool_choice of type 'tool'"


def test_a_name_beside_another_tool_choice_type_names_nothing():
    call = call_for(messages=USER, tools=[TOOL], tool_choice={"type": "auto", "name": "other"})
    assert call.tool_choice == "auto"
    call = call_for(messages=USER, tools=[TOOL], tool_choice={"type": "any", "name": "other"})
    assert call.tool_choice == "required"


def test_tool_choice_none_offers_no_tools():
    call = call_for(messages=USER, tools=[TOOL], tool_choice={"type": "none"})
    assert (call.tools, call.tool_choice) == (None, "none")


def test_a_tool_without_a_description_has_none_in_the_engine_form():
    call = call_for(messages=USER, tools=[TOOL, {**TOOL, "name": "b", "type": "custom"}])
    assert call.tools == [
        {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
        {"type": "function", "function": {"name": "b", "parameters": SCHEMA}},
    ]


def test_options_left_out_take_the_server_defaults():
    call = call_for(GenerationDefaults(max_tokens=100, thinking=True), messages=USER)
    assert (call.stop, call.thinking, call.max_tokens, call.parallel_tool_calls) == (
        (),
        True,
        8,
        True,
    )
    call = call_for(messages=USER, thinking={"type": "disabled"})
    assert call.thinking is False


# ------------------------------------------------------------------------------ responses


CALL = chat.ToolCall("get_weather", {"city": "Paris"})


def test_the_message_names_the_served_model_and_counts_tokens_apart():
    body = ENDPOINT.response(
        request_for(messages=USER), [chat.TextDelta("Sunny")], finished(), META
    )
    assert body["id"].startswith("msg_") and len(body["id"]) == len("msg_") + 24
    assert {k: v for k, v in body.items() if k != "id"} == {
        "type": "message",
        "role": "assistant",
        "model": "served-model",
        "content": [{"type": "text", "text": "Sunny"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 7,
            "output_tokens": 5,
            "cache_read_input_tokens": 4,
            "cache_creation_input_tokens": 0,
        },
    }


def test_the_message_names_the_stop_sequence_it_stopped_at():
    body = ENDPOINT.response(
        request_for(messages=USER), [chat.TextDelta("a")], finished(stop_sequence="END"), META
    )
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")


def test_reasoning_and_calls_are_content_blocks_in_order():
    events = [
        chat.ReasoningDelta("Think."),
        chat.TextDelta("Checking."),
        chat.ToolCallComplete(CALL),
    ]
    body = ENDPOINT.response(request_for(messages=USER), events, finished("tool_calls"), META)
    call_id = body["content"][2]["id"]
    assert call_id.startswith("toolu_")
    assert body["content"] == [
        {"type": "thinking", "thinking": "Think.", "signature": ""},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {"city": "Paris"}},
    ]
    assert body["stop_reason"] == "tool_use"


def stream_of(*events) -> list[tuple[str, dict]]:
    stream = ENDPOINT.stream(request_for(messages=USER, stream=True), META)
    return named_events(encoded_stream(stream, *events))


def test_the_stream_opens_with_the_served_model_and_the_prompt_length():
    (name, start), *_ = stream_of(finished())
    assert name == "message_start"
    message = start["message"]
    assert message["id"].startswith("msg_")
    assert {k: v for k, v in message.items() if k != "id"} == {
        "type": "message",
        "role": "assistant",
        "model": "served-model",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 0},
    }


def test_the_stream_sends_each_block_open_deltas_close_then_the_totals():
    frames = stream_of(
        chat.ReasoningDelta("Th"),
        chat.ReasoningDelta("ink."),
        chat.TextDelta("Hi"),
        chat.ToolCallStart("get_weather"),
        chat.ToolCallArguments('{"city": '),
        chat.ToolCallArguments('"Paris"}'),
        chat.ToolCallComplete(CALL),
        finished("stop", stop_sequence="END"),
    )[1:]
    call_id = frames[7][1]["content_block"]["id"]
    assert frames == [
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "thinking", "thinking": "",
                                                   "signature": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "thinking_delta", "thinking": "Th"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "thinking_delta", "thinking": "ink."}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                 "delta": {"type": "text_delta", "text": "Hi"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        ("content_block_start", {"type": "content_block_start", "index": 2,
                                 "content_block": {"type": "tool_use", "id": call_id,
                                                   "name": "get_weather", "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 2,
                                 "delta": {"type": "input_json_delta",
                                           "partial_json": '{"city": '}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 2,
                                 "delta": {"type": "input_json_delta",
                                           "partial_json": '"Paris"}'}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"},
                           "usage": {"input_tokens": 7, "output_tokens": 5,
                                     "cache_read_input_tokens": 4,
                                     "cache_creation_input_tokens": 0}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip


def test_the_stream_closes_the_open_block_before_the_totals():
    frames = stream_of(chat.TextDelta("Hi"), finished("length"))
    assert [name for name, _ in frames] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert frames[4][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


def test_a_whole_call_streams_as_one_block_with_its_json():
    frames = stream_of(chat.ToolCallComplete(CALL), finished("tool_calls"))[1:4]
    assert [name for name, _ in frames] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    assert frames[0][1]["content_block"]["input"] == {}
    # Its id is Anthropic's kind, as in a whole response.
    assert frames[0][1]["content_block"]["id"].startswith("toolu_")
    assert frames[1][1]["delta"] == {
        "type": "input_json_delta",
        "partial_json": '{"city": "Paris"}',
    }


def test_a_stream_error_has_the_anthropic_shape():
    stream = ENDPOINT.stream(request_for(messages=USER), META)
    [(name, body)] = named_events(stream.error(APIError(413, "too big")))
    assert (name, body) == (
        "error",
        {"type": "error", "error": {"type": "request_too_large", "message": "too big"}},
    )


def test_a_tool_description_reaches_the_engine_form():
    call = call_for(messages=USER, tools=[{**TOOL, "description": "Weather by city."}])
    assert call.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather by city.",
                "parameters": SCHEMA,
            },
        }
    ]


@pytest.mark.parametrize(
    ("choice", "parallel"),
    [
        ({"type": "auto"}, True),
        ({"type": "any"}, True),
        ({"type": "auto", "disable_parallel_tool_use": True}, False),
    ],
)
def test_a_tool_choice_allows_parallel_calls_unless_disabled(choice, parallel):
    assert call_for(messages=USER, tools=[TOOL], tool_choice=choice).parallel_tool_calls is parallel
