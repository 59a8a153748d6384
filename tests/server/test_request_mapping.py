"""Each API's request translated into the ChatService call (no model needed)."""

from __future__ import annotations

import json

from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.server.anthropic_messages import MessagesEndpoint
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import GenerationDefaults, parse_request
from ds4mlx.server.openai_chat import ChatCompletionsEndpoint
from ds4mlx.server.openai_completions import CompletionsEndpoint
from ds4mlx.server.openai_responses import ResponsesEndpoint

import pytest

DEFAULTS = GenerationDefaults(max_tokens=100, sampling=SamplingOptions(temperature=0.5, top_k=7))
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
ENGINE_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather.", "parameters": SCHEMA},
}


def call_for(endpoint, body: dict):
    return endpoint.call(parse_request(endpoint.request_model, json.dumps(body).encode()), DEFAULTS)


def test_chat_messages_options_and_defaults():
    call = call_for(
        ChatCompletionsEndpoint(),
        {
            "model": "m",
            "max_completion_tokens": 9,
            "temperature": 0,
            "stop": "END",
            "tools": [ENGINE_TOOL],
            "messages": [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}],
                },
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "Look it up.",
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
    )
    assert call.messages == [
        {"role": "system", "content": "Be\nbrief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Look it up.",
            "tool_calls": [
                {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert call.tools == [ENGINE_TOOL]
    assert (call.max_tokens, call.stop, call.thinking) == (9, ("END",), False)
    # The request's temperature replaces the server default; its other defaults stay.
    assert call.sampling == SamplingOptions(temperature=0.0, top_k=7)


@pytest.mark.parametrize(
    "switch, expected",
    [
        ({}, False),
        ({"thinking": True}, True),
        ({"thinking": {"type": "enabled"}}, True),
        ({"reasoning_effort": "high"}, True),
        ({"reasoning_effort": "none"}, False),
        ({"chat_template_kwargs": {"enable_thinking": True}}, True),
        ({"thinking": False, "reasoning_effort": "high"}, False),
    ],
)
def test_chat_thinking_switches(switch, expected):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **switch}
    assert call_for(ChatCompletionsEndpoint(), body).thinking is expected


def test_completion_prompt_and_limits():
    call = call_for(CompletionsEndpoint(), {"model": "m", "prompt": ["def f():"], "seed": 3})
    assert (call.prompt, call.messages, call.max_tokens) == ("def f():", None, 100)
    assert call.sampling.seed == 3


def test_responses_items_become_turns():
    call = call_for(
        ResponsesEndpoint(),
        {
            "model": "m",
            "instructions": "Be brief.",
            "max_output_tokens": 5,
            "reasoning": {"effort": "medium"},
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "Weather.",
                    "parameters": SCHEMA,
                }
            ],
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "Look it up."}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Checking."}],
                },
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"role": "user", "content": "Thanks"},
            ],
        },
    )
    assert call.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Look it up.",
            "tool_calls": [
                {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "Thanks"},
    ]
    assert call.tools == [ENGINE_TOOL]
    assert (call.max_tokens, call.thinking) == (5, True)


def test_anthropic_blocks_become_turns():
    call = call_for(
        MessagesEndpoint(),
        {
            "model": "m",
            "max_tokens": 8,
            "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["\n\n"],
            "top_k": 3,
            "thinking": {"type": "enabled", "budget_tokens": 100},
            "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": SCHEMA}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Look it up.", "signature": "x"},
                        {"type": "text", "text": "Checking."},
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "sunny"}],
                        },
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
        },
    )
    assert call.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Look it up.",
            "tool_calls": [
                {"id": "t1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "user", "content": "Thanks"},
    ]
    assert call.tools == [ENGINE_TOOL]
    assert (call.max_tokens, call.stop, call.thinking, call.sampling.top_k) == (
        8,
        ("\n\n",),
        True,
        3,
    )


@pytest.mark.parametrize(
    "endpoint, body, param",
    [
        (
            ChatCompletionsEndpoint(),
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "messages[0].content[0]",
        ),
        (CompletionsEndpoint(), {"prompt": ["a", "b"]}, "prompt"),
        (CompletionsEndpoint(), {"prompt": "a", "echo": True}, "echo"),
        (
            ResponsesEndpoint(),
            {"input": "x", "previous_response_id": "resp_1"},
            "previous_response_id",
        ),
        (ResponsesEndpoint(), {"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (ResponsesEndpoint(), {"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
        (
            MessagesEndpoint(),
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
            },
            "messages[0].content[0]",
        ),
    ],
)
def test_what_cannot_be_served_is_refused_by_name(endpoint, body, param):
    with pytest.raises(APIError) as refused:
        call_for(endpoint, {"model": "m", **body})
    assert refused.value.status == 400 and refused.value.param == param


@pytest.mark.parametrize(
    "endpoint, body",
    [
        (ChatCompletionsEndpoint(), {"messages": [{"role": "user", "content": "x"}]}),
        (CompletionsEndpoint(), {"prompt": "a"}),
        (ResponsesEndpoint(), {"input": "x"}),
        (MessagesEndpoint(), {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
    ],
)
def test_penalties_and_biases_reach_the_sampler(endpoint, body):
    """OpenAI's frequency/presence penalties and logit_bias, and llama.cpp's repeat_penalty/
    repeat_last_n as extensions, on every API; an empty logit_bias (sent by default) is no
    bias."""
    call = call_for(
        endpoint,
        {
            "model": "m",
            **body,
            "frequency_penalty": 0.25,
            "presence_penalty": -0.5,
            "repeat_penalty": 1.2,
            "repeat_last_n": 32,
            "logit_bias": {"42": -100, "7": 2.5},
        },
    )
    sampling = call.sampling
    assert (
        sampling.frequency_penalty,
        sampling.presence_penalty,
        sampling.repeat_penalty,
        sampling.repeat_last_n,
    ) == (0.25, -0.5, 1.2, 32)
    assert sampling.logit_bias == ((42, -100.0), (7, 2.5))
    assert call_for(endpoint, {"model": "m", **body}).sampling == DEFAULTS.sampling
    assert call_for(endpoint, {"model": "m", **body, "logit_bias": {}}).sampling == (
        DEFAULTS.sampling
    )
