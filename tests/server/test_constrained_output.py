"""Constrained decoding through the official ``openai`` client, on the trained tiny model (which
answers nearly everything with DSML tool-call markup, offered tools or not):

- ``response_format`` json_schema / json_object on chat, completions and Responses: every answer
  validates against its schema (``jsonschema``), where the unconstrained answers mostly do not;
- ``tool_choice`` required with one tool: a call to it, arguments valid against its schema;
- never a call to a tool that was not offered, nor call markup in the text (issue 36 item 3);
- ``logprobs`` / ``top_logprobs`` in OpenAI's shape, streamed and not.
"""

from __future__ import annotations

import json
import math
import os

import anthropic
import jsonschema
import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "active"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TOPICS = [
    "a database administrator",
    "a guest at a hotel",
    "the user of a phone",
    "a retired teacher",
    "a chess player",
    "a gardener",
    "a pilot",
    "a cook",
    "a student",
    "a painter",
]
PROMPTS = [
    f"{style} {topic}."
    for style in (
        "Describe",
        "Write the record of",
        "Fill in a profile for",
        "def profile(): # return",
        "Find the files of",
    )
    for topic in TOPICS
]
# The suite asks each style with two of the topics, each topic once (ten prompts, every rule of
# the schema and the tool's parameters met as often as in the whole set);
# scripts/grammar_acceptance.py runs all fifty (DS4MLX_GRAMMAR_PROMPTS=all).
SAMPLE = [PROMPTS[10 * style + topic] for style in range(5) for topic in (2 * style, 2 * style + 1)]
ACCEPTANCE = PROMPTS if os.environ.get("DS4MLX_GRAMMAR_PROMPTS") == "all" else SAMPLE
MARKUP = ("DSML", "tool_calls", "invoke", "<｜")


@pytest.fixture(scope="module")
def client(tiny_url):
    return openai.OpenAI(
        base_url=f"{tiny_url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )


def _is_valid(text: str | None, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text or ""), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def _person_format() -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }


def test_json_schema_answers_validate_where_free_answers_do_not(client):
    assert len(PROMPTS) == 50 and len(set(SAMPLE)) == 10
    constrained = free = 0
    for prompt in ACCEPTANCE:
        messages = [{"role": "user", "content": prompt}]
        reply = client.chat.completions.create(
            model=MODEL_ID, messages=messages, max_tokens=80, response_format=_person_format()
        )
        constrained += _is_valid(reply.choices[0].message.content, PERSON)
        unconstrained = client.chat.completions.create(
            model=MODEL_ID, messages=messages, max_tokens=80
        )
        free += _is_valid(unconstrained.choices[0].message.content, PERSON)
    assert constrained == len(ACCEPTANCE)
    assert free < len(ACCEPTANCE) / 2


def test_json_object_and_schema_on_completions_and_responses(client):
    completion = client.completions.create(
        model=MODEL_ID,
        prompt="The user record: ",
        max_tokens=80,
        extra_body={"response_format": _person_format()},
    )
    assert _is_valid(completion.choices[0].text, PERSON)
    response = client.responses.create(
        model=MODEL_ID,
        input="Describe a user.",
        max_output_tokens=80,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}},
    )
    assert response.status == "completed"
    assert _is_valid(response.output_text, PERSON)
    assert response.text.format.type == "json_schema"
    # Any object: its strings may run past the token limit, but what is written is JSON so far.
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Any JSON object, please."}],
        max_tokens=200,
        response_format={"type": "json_object"},
    )
    content = reply.choices[0].message.content
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert content.startswith("{")


def test_a_schema_that_does_not_compile_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "no-such-type"}},
            },
        )


def test_required_tool_choice_calls_the_one_tool_with_valid_arguments(client):
    schema = WEATHER["function"]["parameters"]
    for prompt in ACCEPTANCE:
        reply = client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": prompt}],
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=120,
        )
        calls = reply.choices[0].message.tool_calls
        # A turn of many calls may reach the token limit: the calls it completed come back.
        assert reply.choices[0].finish_reason in ("tool_calls", "length"), prompt
        assert calls and {call.function.name for call in calls} == {"get_weather"}
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("options", [{}, {"tools": [WEATHER], "tool_choice": "none"}])
def test_no_call_markup_in_the_text_when_no_call_may_be_made(client, options):
    # Issue 36 item 3: the tiny model's DSML came back verbatim as the answer's text.
    for prompt in PROMPTS[:10]:
        reply = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": prompt}], max_tokens=60, **options
        )
        text = reply.choices[0].message.content or ""
        assert not any(mark in text for mark in MARKUP), text
        assert not reply.choices[0].message.tool_calls


def test_responses_stream_calls_only_offered_tools_with_parseable_arguments(client):
    # Issue 36 item 3: the stream invented a call to "edit" with unparseable arguments, then
    # raw DSML as text, and called the response completed.
    stream = client.responses.create(
        model=MODEL_ID,
        input="Weather in Paris?",
        tools=[{"type": "function", **WEATHER["function"]}],
        tool_choice="required",
        max_output_tokens=300,
        stream=True,
    )
    events = list(stream)
    final = events[-1].response
    calls = [item for item in final.output if item.type == "function_call"]
    # The tiny model goes on calling until the token limit: the response says so.
    assert calls and final.status == "incomplete"
    for call in calls:
        assert call.name == "get_weather"
        jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    done = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert all(json.loads(event.arguments) for event in done)
    texts = [item for item in final.output if item.type == "message"]
    assert not any(mark in part.text for item in texts for part in item.content for mark in MARKUP)


def test_one_call_without_parallel_tool_calls(client, tiny_url):
    tool = {"type": "function", **WEATHER["function"]}
    response = client.responses.create(
        model=MODEL_ID,
        input="Weather in Paris?",
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=300,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and len(calls) == 1
    assert response.parallel_tool_calls is False
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        parallel_tool_calls=False,
        max_tokens=300,
    )
    assert len(reply.choices[0].message.tool_calls or ()) <= 1
    assert reply.choices[0].finish_reason in ("tool_calls", "stop")
    claude = anthropic.Anthropic(base_url=tiny_url, api_key="unused", timeout=TIMEOUT)
    message = claude.messages.create(
        model=MODEL_ID,
        max_tokens=300,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and len(uses) == 1
    jsonschema.validate(uses[0].input, WEATHER["function"]["parameters"])


def test_auto_tool_choice_names_only_offered_tools(client):
    for prompt in PROMPTS[:10]:
        reply = client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": prompt}],
            tools=[WEATHER],
            max_tokens=120,
        )
        message = reply.choices[0].message
        for call in message.tool_calls or ():
            assert call.function.name == "get_weather"
            json.loads(call.function.arguments)
        assert not any(mark in (message.content or "") for mark in MARKUP)


def _check_top(entry_top: list, chosen: float) -> None:
    values = [alternative.logprob for alternative in entry_top]
    assert values == sorted(values, reverse=True)
    assert sum(math.exp(value) for value in values) < 1 + 1e-6
    assert values[0] >= chosen - 1e-6  # greedy: the chosen token is the most likely


def test_chat_logprobs_streamed_and_not(client):
    request = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 12,
        "logprobs": True,
        "top_logprobs": 3,
        "tool_choice": "none",
        "tools": [WEATHER],
    }
    reply = client.chat.completions.create(**request)
    content = reply.choices[0].logprobs.content
    assert content and all(len(entry.top_logprobs) == 3 for entry in content)
    for entry in content:
        assert entry.logprob <= 0
        _check_top(entry.top_logprobs, entry.logprob)
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    streamed = [
        entry
        for chunk in client.chat.completions.create(**request, stream=True)
        for choice in chunk.choices
        if choice.logprobs and choice.logprobs.content
        for entry in choice.logprobs.content
    ]
    # The second request reuses the first's cached prompt: the same tokens, logits equal to
    # float rounding (a restored prefix is computed in other chunks).
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-4)
    plain = client.chat.completions.create(**{**request, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_streamed_and_not(client):
    request = {"model": MODEL_ID, "prompt": "def add(a, b):", "max_tokens": 10, "logprobs": 2}
    reply = client.completions.create(**request)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs)
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.text_offset[0] == 0
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    streamed = [
        (token, value)
        for chunk in client.completions.create(**request, stream=True)
        for choice in chunk.choices
        if choice.logprobs
        for token, value in zip(choice.logprobs.tokens, choice.logprobs.token_logprobs, strict=True)
    ]
    assert [token for token, _ in streamed] == logprobs.tokens
    assert [value for _, value in streamed] == pytest.approx(logprobs.token_logprobs, abs=1e-4)


def test_top_logprobs_without_logprobs_or_over_20_is_a_400(client):
    for extra in ({"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}):
        with pytest.raises(openai.BadRequestError, match="top_logprobs"):
            client.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], **extra
            )
