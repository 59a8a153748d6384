"""Generated request bodies against each API's validation and translation: every body becomes a
GenerationCall or a client error (APIError 4xx) naming the problem, never another exception.
Part of the robustness suite (issue 10); tests/server keeps the hand-written bad requests."""

from __future__ import annotations

import copy
import json

from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.server.anthropic_messages import MessagesEndpoint
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import GenerationCall, GenerationDefaults, parse_request
from ds4mlx.server.openai_chat import ChatCompletionsEndpoint
from ds4mlx.server.openai_completions import CompletionsEndpoint
from ds4mlx.server.openai_responses import ResponsesEndpoint

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

DEFAULTS = GenerationDefaults(max_tokens=100, sampling=SamplingOptions())
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
# One valid body per API, rich enough that mutations reach nested fields.
VALID = {
    "chat": (
        ChatCompletionsEndpoint(),
        {
            "model": "m",
            "max_tokens": 9,
            "temperature": 0.5,
            "top_p": 0.9,
            "stop": ["END"],
            "stream": False,
            "tools": [TOOL],
            "tool_choice": "auto",
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
        },
    ),
    "completions": (
        CompletionsEndpoint(),
        {"model": "m", "prompt": "Once upon", "max_tokens": 5, "stop": "\n", "seed": 3},
    ),
    "responses": (
        ResponsesEndpoint(),
        {
            "model": "m",
            "instructions": "Be brief.",
            "max_output_tokens": 7,
            "tools": [
                {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
            ],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
        },
    ),
    "messages": (
        MessagesEndpoint(),
        {
            "model": "m",
            "max_tokens": 8,
            "system": "Be brief.",
            "temperature": 1.0,
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}],
                },
            ],
        },
    ),
}

JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
        st.sampled_from(
            [
                "user",
                "assistant",
                "system",
                "tool",
                "text",
                "function",
                "auto",
                "none",
                "required",
                "",
                "low",
                "high",
                "max",
            ]
        ),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def paths(value, prefix=()):
    """Every (container path) in a JSON value: where a mutation can land."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


def mutate(body: dict, draw) -> dict:
    body = copy.deepcopy(body)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(list(paths(body))))
        if not where:
            continue
        parent = body
        for step in where[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[where[-1]] = draw(JSON)
        elif action == "delete":
            del parent[where[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(JSON)
        else:
            parent.append(draw(JSON))
    return body


def check(endpoint, raw: bytes) -> None:
    try:
        call = endpoint.call(parse_request(endpoint.request_model, raw), DEFAULTS)
    except APIError as exc:
        assert 400 <= exc.status < 500 and exc.message, exc
        return
    assert isinstance(call, GenerationCall)
    assert call.max_tokens >= 1
    assert (call.messages is None) != (call.prompt is None)
    assert all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in call.messages or [])


@pytest.mark.parametrize("api", sorted(VALID))
def test_the_valid_bodies_are_accepted(api):
    endpoint, body = VALID[api]
    call = endpoint.call(parse_request(endpoint.request_model, json.dumps(body).encode()), DEFAULTS)
    assert call.max_tokens in (5, 7, 8, 9)


@settings(max_examples=1500, deadline=None, database=None)
@given(api=st.sampled_from(sorted(VALID)), data=st.data())
def test_mutated_bodies_validate_or_answer_a_client_error(api, data):
    endpoint, body = VALID[api]
    check(endpoint, json.dumps(mutate(body, data.draw)).encode())


@settings(max_examples=600, deadline=None, database=None)
@given(
    api=st.sampled_from(sorted(VALID)),
    raw=st.one_of(st.binary(max_size=40), JSON.map(lambda v: json.dumps(v).encode())),
)
@example(api="chat", raw=b'{"model": "m", "messages": [], "max_tokens": 0}')
@example(api="messages", raw=b'{"model": "m", "max_tokens": 1e400, "messages": []}')
@example(api="completions", raw=b'\xff\xfe{"model"')  # not UTF-8
def test_arbitrary_bodies_answer_a_client_error(api, raw):
    check(VALID[api][0], raw)
