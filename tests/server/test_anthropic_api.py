"""``/v1/messages`` through the official ``anthropic`` client, against the chat model."""

from __future__ import annotations

import anthropic
import pytest

from server.harness import MODEL_ID, TIMEOUT

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
AS_OPENAI_TOOL = {
    "type": "function",
    "function": {
        "name": WEATHER_TOOL["name"],
        "description": WEATHER_TOOL["description"],
        "parameters": WEATHER_TOOL["input_schema"],
    },
}


@pytest.fixture(scope="module")
def client(base_url) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)


def test_message_and_its_stream_agree(client, prompt_tokens):
    messages = [{"role": "user", "content": "hello there"}]
    message = client.messages.create(
        model=MODEL_ID, max_tokens=6, system="Be brief.", messages=messages
    )
    assert message.role == "assistant" and message.stop_reason == "max_tokens"
    assert message.content[0].type == "text" and message.content[0].text
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == prompt_tokens(
        [{"role": "system", "content": "Be brief."}, *messages]
    )
    assert usage.output_tokens == 6

    with client.messages.stream(
        model=MODEL_ID, max_tokens=6, system="Be brief.", messages=messages
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == message.content[0].text
    assert final.usage.output_tokens == 6
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == (
        usage.input_tokens + usage.cache_read_input_tokens
    )


def test_tool_use_and_tool_result_go_into_the_prompt(client, prompt_tokens):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    message = client.messages.create(
        model=MODEL_ID,
        max_tokens=2,
        tools=[WEATHER_TOOL],
        messages=[
            question,
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"}
                ],
            },
        ],
    )
    engine_view = [
        question,
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C, sunny"},
    ]
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == prompt_tokens(
        engine_view, [AS_OPENAI_TOOL]
    )


def test_thinking_comes_back_as_a_thinking_block(client):
    message = client.messages.create(
        model=MODEL_ID,
        max_tokens=6,
        messages=[{"role": "user", "content": "hello there"}],
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    # The random model never closes its thinking block: everything it writes is reasoning.
    assert [block.type for block in message.content] == ["thinking"]
    assert message.content[0].thinking


def test_stop_sequences_cut_the_text(client):
    messages = [{"role": "user", "content": "hello there"}]
    text = client.messages.create(model=MODEL_ID, max_tokens=12, messages=messages).content[0].text
    stop = text[3:5]
    cut = client.messages.create(
        model=MODEL_ID, max_tokens=12, messages=messages, stop_sequences=[stop]
    )
    assert cut.content[0].text == text[: text.index(stop)]
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    with client.messages.stream(
        model=MODEL_ID,
        max_tokens=12,
        messages=messages,
        stop_sequences=["never in this text", stop],
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    uncut = client.messages.create(
        model=MODEL_ID, max_tokens=12, messages=messages, stop_sequences=["never in this text"]
    )
    assert uncut.stop_sequence is None and uncut.stop_reason == "max_tokens"


def test_errors_have_the_anthropic_shape(client):
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(
            model="claude-unknown", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert unknown.value.body["type"] == "error"
    assert unknown.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as image:
        client.messages.create(
            model=MODEL_ID,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                        }
                    ],
                }
            ],
        )
    assert image.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in image.value.body["error"]["message"]
