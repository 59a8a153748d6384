"""Tool calls and reasoning on the way out, in each API's format.

The random-weight model never writes a tool call, so a scripted service produces the events the
chat parser would: reasoning, text, two tool calls, markup it could not parse. The builders are
checked directly, and the streams through the official clients' own accumulators.
"""

from __future__ import annotations

import json

from ds4mlx.engine.chat import ReasoningDelta, TextDelta, ToolCall, ToolCallComplete, ToolCallError
from ds4mlx.generation import Finished
from ds4mlx.server.anthropic_messages import MessagesEndpoint, MessagesRequest
from ds4mlx.server.openai_chat import ChatCompletionRequest, ChatCompletionsEndpoint
from ds4mlx.server.openai_responses import ResponsesEndpoint, ResponsesRequest
from ds4mlx.server.turn import ResponseMeta

import anthropic
import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT, ScriptedService, serve

WEATHER = ToolCall("get_weather", {"city": "Paris", "days": 2})
TIME = ToolCall("get_time", {"zone": "CET"})
EVENTS = [
    ReasoningDelta("The user wants "),
    ReasoningDelta("the weather."),
    TextDelta("Checking."),
    ToolCallComplete(WEATHER),
    ToolCallComplete(TIME),
]
FINISHED = Finished(
    "tool_calls", prompt_tokens=40, completion_tokens=25, cached_tokens=30, reasoning_tokens=6
)
META = ResponseMeta(MODEL_ID)
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def scripted_url(engine):
    with serve(ScriptedService([*EVENTS, FINISHED]), engine) as url:
        yield url


def test_chat_completion_builder():
    request = ChatCompletionRequest(model=MODEL_ID, messages=QUESTION)
    body = ChatCompletionsEndpoint().response(request, EVENTS, FINISHED, META)
    message = body["choices"][0]["message"]
    assert message["content"] == "Checking."
    assert message["reasoning_content"] == "The user wants the weather."
    assert [
        (call["type"], call["function"]["name"], json.loads(call["function"]["arguments"]))
        for call in message["tool_calls"]
    ] == [("function", "get_weather", WEATHER.arguments), ("function", "get_time", TIME.arguments)]
    assert len({call["id"] for call in message["tool_calls"]}) == 2
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 25,
        "total_tokens": 65,
        "prompt_tokens_details": {"cached_tokens": 30},
        "completion_tokens_details": {"reasoning_tokens": 6},
    }


def test_responses_builder():
    request = ResponsesRequest(model=MODEL_ID, input="Weather in Paris?")
    body = ResponsesEndpoint().response(request, EVENTS, FINISHED, META)
    reasoning, message, weather, time = body["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [
        {"type": "reasoning_text", "text": "The user wants the weather."}
    ]
    assert message["type"] == "message" and message["content"][0]["text"] == "Checking."
    assert (weather["type"], weather["name"], json.loads(weather["arguments"])) == (
        "function_call",
        "get_weather",
        WEATHER.arguments,
    )
    assert weather["call_id"] != time["call_id"]
    assert body["status"] == "completed"
    assert body["usage"]["input_tokens_details"] == {"cached_tokens": 30}
    assert body["usage"]["output_tokens_details"] == {"reasoning_tokens": 6}


def test_messages_builder():
    request = MessagesRequest(model=MODEL_ID, max_tokens=10, messages=QUESTION)
    body = MessagesEndpoint().response(request, EVENTS, FINISHED, META)
    thinking, text, weather, time = body["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": "The user wants the weather.",
        "signature": "",
    }
    assert text == {"type": "text", "text": "Checking."}
    assert (weather["type"], weather["name"], weather["input"]) == (
        "tool_use",
        "get_weather",
        WEATHER.arguments,
    )
    assert weather["id"].startswith("toolu_") and weather["id"] != time["id"]
    assert body["stop_reason"] == "tool_use"
    # Anthropic counts cache reads apart from the input.
    assert body["usage"] == {
        "input_tokens": 10,
        "output_tokens": 25,
        "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 0,
    }


def test_unparseable_tool_markup_is_shown_as_text():
    events = [TextDelta("Let me see. "), ToolCallError("<invoke oops>", "bad markup")]
    request = ChatCompletionRequest(model=MODEL_ID, messages=QUESTION)
    body = ChatCompletionsEndpoint().response(request, events, Finished("stop", 5, 5, 0), META)
    assert body["choices"][0]["message"]["content"] == "Let me see. <invoke oops>"
    assert "tool_calls" not in body["choices"][0]["message"]


def test_streamed_chat_tool_calls_through_the_openai_client(scripted_url):
    client = openai.OpenAI(
        base_url=f"{scripted_url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )
    with client.chat.completions.stream(model=MODEL_ID, messages=QUESTION) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Checking."
    assert [
        (call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls
    ] == [("get_weather", WEATHER.arguments), ("get_time", TIME.arguments)]
    assert final.choices[0].finish_reason == "tool_calls"
    raw = list(client.chat.completions.create(model=MODEL_ID, messages=QUESTION, stream=True))
    reasoning = "".join(
        getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
        for chunk in raw
        if chunk.choices
    )
    assert reasoning == "The user wants the weather."


def test_streamed_responses_through_the_openai_client(scripted_url):
    client = openai.OpenAI(
        base_url=f"{scripted_url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )
    with client.responses.stream(model=MODEL_ID, input="Weather in Paris?") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert [item.type for item in final.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    assert final.output_text == "Checking."
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("get_weather", WEATHER.arguments),
        ("get_time", TIME.arguments),
    ]
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    )
    assert kinds[-1] == "response.completed"


def test_streamed_messages_through_the_anthropic_client(scripted_url):
    client = anthropic.Anthropic(
        base_url=scripted_url, api_key="unused", timeout=TIMEOUT, max_retries=0
    )
    with client.messages.stream(model=MODEL_ID, max_tokens=50, messages=QUESTION) as stream:
        for _ in stream:
            pass
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert final.content[0].thinking == "The user wants the weather."
    assert final.content[1].text == "Checking."
    assert [(block.name, block.input) for block in final.content[2:]] == [
        ("get_weather", WEATHER.arguments),
        ("get_time", TIME.arguments),
    ]
    assert final.stop_reason == "tool_use"
    assert (
        final.usage.input_tokens,
        final.usage.cache_read_input_tokens,
        final.usage.output_tokens,
    ) == (10, 30, 25)
