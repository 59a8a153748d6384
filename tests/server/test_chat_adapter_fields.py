"""The chat completions adapter field by field, called directly (no model, no server): what a
request's history and switches become, every field of a response, and the chunks a stream
sends (of one choice and of several), including its error frame."""

from __future__ import annotations

import json

from ds4mlx.engine.chat import events as chat
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.generation import Finished, TokenLogprobs
from ds4mlx.server.choices import ChoiceEvent
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import GenerationDefaults, parse_request
from ds4mlx.server.openai_chat import ChatCompletionRequest, ChatCompletionsEndpoint, with_logprobs
from ds4mlx.server.sse import DONE_FRAME
from ds4mlx.server.turn import ResponseMeta

import pytest

from server.harness import encoded_stream

DEFAULTS = GenerationDefaults(max_tokens=100)
META = ResponseMeta("served-model", created=1234)
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}
DONE = Finished("stop", prompt_tokens=5, completion_tokens=3, cached_tokens=1)


def request(**fields) -> ChatCompletionRequest:
    body = {"model": "m", "messages": QUESTION, **fields}
    return parse_request(ChatCompletionRequest, json.dumps(body).encode())


def call_for(**fields):
    return ChatCompletionsEndpoint().call(request(**fields), DEFAULTS)


def data(frame: bytes) -> dict | str:
    """A ``data:`` frame's payload (the text "[DONE]" for the end)."""
    text = frame.decode()
    assert text.startswith("data: ") and text.endswith("\n\n"), text
    payload = text.removeprefix("data: ").removesuffix("\n\n")
    return payload if payload == "[DONE]" else json.loads(payload)


# ------------------------------------------------------------------ requests


def test_history_keeps_call_ids_default_arguments_empty_ids_and_reasoning():
    call = call_for(
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "reasoning_content": "Use the tool.",
                "tool_calls": [{"id": "c7", "function": {"name": "get_weather"}}],
            },
            {"role": "tool", "tool_call_id": "", "content": "sunny"},
        ]
    )
    assert call.messages[1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [{"id": "c7", "function": {"name": "get_weather", "arguments": "{}"}}],
            "reasoning_content": "Use the tool.",
        },
        # An empty id is still the client's id (the template renders it), not a missing one.
        {"role": "tool", "content": "sunny", "tool_call_id": ""},
    ]


def test_parallel_calls_are_allowed_unless_switched_off():
    assert call_for().parallel_tool_calls is True
    assert call_for(parallel_tool_calls=False).parallel_tool_calls is False


def test_tool_choice_none_offers_no_tools():
    assert call_for(tools=[WEATHER_TOOL], tool_choice="none").tools is None
    assert call_for(tools=[WEATHER_TOOL], tool_choice="auto").tools == [WEATHER_TOOL]


@pytest.mark.parametrize("enabled", [True, False])
def test_chat_template_kwargs_switch_thinking(enabled):
    thinking = call_for(chat_template_kwargs={"enable_thinking": enabled}).thinking
    assert thinking is enabled
    # ``thinking`` itself wins over the template's switch.
    both = call_for(thinking=not enabled, chat_template_kwargs={"enable_thinking": enabled})
    assert both.thinking is (not enabled)


def test_a_response_format_of_an_unknown_type_names_its_field():
    with pytest.raises(APIError) as refused:
        call_for(response_format={"type": "yaml"})
    assert refused.value.status == 400
    assert refused.value.param == "response_format.type"


def test_logprobs_without_top_ask_for_the_token_alone():
    sampling = SamplingOptions()
    assert with_logprobs(sampling, 0).logprobs == 0
    assert with_logprobs(sampling, None) is sampling
    assert call_for(logprobs=True).sampling.logprobs == 0
    assert call_for(logprobs=False).sampling.logprobs is None


# ------------------------------------------------------------------ responses


def respond(events, finished=DONE, **fields) -> dict:
    return ChatCompletionsEndpoint().response(request(**fields), events, finished, META)


def test_a_text_answer_is_every_field_and_nothing_more():
    body = respond([chat.TextDelta("Sunny")])
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) > len("chatcmpl-")
    del body["id"]
    assert body == {
        "object": "chat.completion",
        "created": 1234,
        "model": "served-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Sunny"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": body["usage"],  # its fields: test_tool_output
    }
    assert body["usage"]["total_tokens"] == 8


def test_a_call_answer_has_typed_calls_and_its_reasoning():
    weather = chat.ToolCall("get_weather", {"city": "Paris"})
    finished = Finished("tool_calls", prompt_tokens=5, completion_tokens=3, cached_tokens=0)
    body = respond([chat.ReasoningDelta("Look."), chat.ToolCallComplete(weather)], finished)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    [call] = message.pop("tool_calls")
    assert call["id"].startswith("call_") and len(call["id"]) > len("call_")
    assert call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert message == {"role": "assistant", "content": None, "reasoning_content": "Look."}


def test_choices_are_numbered_in_order():
    events = [
        ChoiceEvent(0, chat.TextDelta("a")),
        ChoiceEvent(0, DONE),
        ChoiceEvent(1, chat.TextDelta("b")),
        ChoiceEvent(1, Finished("length", 5, 2, 1)),
    ]
    choices = respond(events, n=2)["choices"]
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in choices] == [
        (0, "a", "stop"),
        (1, "b", "length"),
    ]


def test_logprobs_false_gives_none_and_true_gives_each_tokens_bytes():
    half = TokenLogprobs("\ufffd", b"\xc3", -0.5, (("\ufffd", b"\xc3", -0.5), ("a", b"a", -2.0)))
    events = [half, chat.TextDelta("é")]
    assert respond(events, logprobs=False)["choices"][0]["logprobs"] is None
    logprobs = respond(events, logprobs=True)["choices"][0]["logprobs"]
    assert logprobs == {
        "content": [
            {
                "token": "\ufffd",
                "logprob": -0.5,
                "bytes": [0xC3],
                "top_logprobs": [
                    {"token": "\ufffd", "logprob": -0.5, "bytes": [0xC3]},
                    {"token": "a", "logprob": -2.0, "bytes": [0x61]},
                ],
            }
        ],
        "refusal": None,
    }


# ------------------------------------------------------------------ streams


def stream_for(**fields):
    parsed = request(stream=True, **fields)
    return ChatCompletionsEndpoint().stream(parsed, META)


@pytest.mark.parametrize("options", [{}, {"stream_options": {}}])
def test_a_stream_without_include_usage_sends_no_usage(options):
    frames = encoded_stream(stream_for(**options), chat.TextDelta("Hi"), DONE)
    payloads = [data(frame) for frame in frames]
    assert payloads[-1] == "[DONE]" and frames[-1] == DONE_FRAME
    chunks = payloads[:-1]
    assert all("usage" not in chunk for chunk in chunks)
    first, text, last = chunks
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert text["choices"][0]["delta"] == {"content": "Hi"}
    assert last["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert {(chunk["model"], chunk["created"]) for chunk in chunks} == {("served-model", 1234)}


def test_a_stream_with_usage_ends_with_a_usage_chunk():
    stream = stream_for(stream_options={"include_usage": True})
    payloads = [data(frame) for frame in encoded_stream(stream, DONE)]
    assert payloads[-2]["choices"] == [] and payloads[-2]["usage"]["total_tokens"] == 8


def test_a_streamed_call_opens_with_empty_arguments_then_sends_pieces_by_call_index():
    frames = encoded_stream(
        stream_for(tools=[WEATHER_TOOL]),
        chat.ToolCallComplete(chat.ToolCall("get_weather", {"city": "Rome"})),
        chat.ToolCallStart("get_weather"),
        chat.ToolCallArguments('{"city"'),
        chat.ToolCallArguments(': "Oslo"}'),
        chat.ToolCallComplete(chat.ToolCall("get_weather", {"city": "Oslo"})),
        Finished("tool_calls", 5, 9, 0),
    )
    pieces = [
        data(frame)["choices"][0]["delta"]["tool_calls"]
        for frame in frames[1:-2]  # between the first chunk and the finish
    ]
    whole, opened, first_piece, second_piece = (piece for [piece] in pieces)
    assert whole["index"] == 0 and whole["function"]["arguments"] == '{"city": "Rome"}'
    assert opened["index"] == 1 and opened["type"] == "function"
    assert opened["id"].startswith("call_") and opened["id"] != whole["id"]
    assert opened["function"] == {"name": "get_weather", "arguments": ""}
    assert first_piece == {"index": 1, "function": {"arguments": '{"city"'}}
    assert second_piece == {"index": 1, "function": {"arguments": ': "Oslo"}'}}
    # The call's end sends nothing: its arguments were all sent.
    assert data(frames[-2])["choices"][0]["finish_reason"] == "tool_calls"


def test_several_choices_share_one_id_and_carry_their_index():
    stream = stream_for(n=2, stream_options={"include_usage": True})
    second_end = Finished("length", 5, 2, 1)
    frames = encoded_stream(
        stream,
        ChoiceEvent(0, chat.TextDelta("a")),
        ChoiceEvent(0, DONE),
        ChoiceEvent(1, chat.TextDelta("b")),
        ChoiceEvent(1, second_end),
        Finished("stop", 5, 5, 1),
    )
    payloads = [data(frame) for frame in frames]
    assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1
    chunks = payloads[:-1]
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert [sum(1 for chunk in chunks if "usage" in chunk)] == [1]
    seen = [
        (choice["index"], choice["delta"], choice["finish_reason"])
        for chunk in chunks[:-1]
        for choice in chunk["choices"]
    ]
    assert seen == [
        (0, {"role": "assistant", "content": ""}, None),
        (1, {"role": "assistant", "content": ""}, None),
        (0, {"content": "a"}, None),
        (0, {}, "stop"),
        (1, {"content": "b"}, None),
        (1, {}, "length"),
    ]


@pytest.mark.parametrize("n", [1, 3])
def test_a_stream_error_is_one_openai_error_frame(n):
    error = APIError(503, "the engine stopped", code="engine_stopped")
    [frame] = stream_for(n=n).error(error)
    assert data(frame) == {
        "error": {
            "message": "the engine stopped",
            "type": "server_error",
            "param": None,
            "code": "engine_stopped",
        }
    }


def test_chunks_without_logprobs_carry_none():
    frames = encoded_stream(stream_for(logprobs=True), chat.TextDelta("a"), DONE)
    assert [data(frame)["choices"][0]["logprobs"] for frame in frames[:-1]] == [None] * 3
    held = TokenLogprobs("a", b"a", -0.25)
    frames = encoded_stream(
        stream_for(logprobs=True), held, chat.TextDelta("a"), chat.TextDelta("b"), DONE
    )
    logprobs = [data(frame)["choices"][0]["logprobs"] for frame in frames[:-1]]
    assert logprobs[0] is None and logprobs[2:] == [None, None]
    assert logprobs[1]["content"][0]["token"] == "a"
