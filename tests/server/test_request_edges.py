"""What a request's fields become, at their edges: the sampling bounds, the seeds of random
draws and of several choices, the thinking switch, text parts, tool choices, log-probabilities,
token limits and streamed usage, on a scripted service that records each call.

Each test was checked against a one-spot mutation of the code it guards (``scripts/
mutation_run.py``, the fresh ``server_*`` mutations).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ds4mlx.engine.chat import TextDelta
from ds4mlx.generation import Finished, TokenLogprobs

import httpx
import pytest

from server.harness import MODEL_ID, TIMEOUT, ScriptedService, serve

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
ANSWER = [TextDelta("ok"), Finished("stop", prompt_tokens=1, completion_tokens=1, cached_tokens=0)]
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture(scope="module")
def scripted(engine) -> Iterator[tuple[str, ScriptedService]]:
    service = ScriptedService(ANSWER)
    with serve(service, engine) as url:
        yield url, service


def post(url: str, **fields: Any) -> httpx.Response:
    body = {"model": MODEL_ID, "messages": HI, **fields}
    return httpx.post(f"{url}{CHAT}", json=body, timeout=TIMEOUT)


def asked(scripted: tuple[str, ScriptedService], **fields: Any) -> dict[str, Any]:
    """What the service was asked for by a chat request with ``fields``."""
    url, service = scripted
    response = post(url, **fields)
    assert response.status_code == 200, response.text
    return service.requests[-1]


def refused_param(url: str, **fields: Any) -> str:
    response = post(url, **fields)
    assert response.status_code == 400, response.text
    return response.json()["error"]["param"]


@pytest.mark.parametrize(
    ("field", "refused", "accepted"),
    [("top_p", 0.0, 1.0), ("min_p", 1.0, 0.99), ("top_p", 1.01, 1e-6), ("min_p", -0.1, 0.0)],
)
def test_sampling_bounds_are_open_or_closed_as_the_sampler_needs(
    scripted, field, refused, accepted
):
    url, _ = scripted
    assert refused_param(url, **{field: refused}) == field
    assert getattr(asked(scripted, **{field: accepted})["sampling"], field) == accepted


@pytest.mark.parametrize("seed", [-1, 0xFFFFFFFF])
def test_llama_cpps_random_seeds_draw_a_random_seed(scripted, seed):
    assert asked(scripted, seed=seed)["sampling"].seed is None
    assert asked(scripted, seed=0xFFFFFFFE)["sampling"].seed == 0xFFFFFFFE


def test_llama_cpps_whole_context_penalty_window_is_the_servers_context(scripted):
    # repeat_last_n -1 (llama.cpp's "the whole context") is cut to this server's context.
    assert asked(scripted, repeat_last_n=-1)["sampling"].repeat_last_n == 4096
    assert asked(scripted, repeat_last_n=8)["sampling"].repeat_last_n == 8


@pytest.mark.parametrize(
    ("thinking", "expected"),
    [({"type": "adaptive"}, True), ({"type": "enabled"}, True), ({"type": "disabled"}, False)],
)
def test_only_a_disabled_thinking_switch_turns_thinking_off(scripted, thinking, expected):
    assert asked(scripted, thinking=thinking)["thinking"] is expected


def test_a_text_part_without_text_is_refused(scripted):
    url, _ = scripted
    parts = [{"role": "user", "content": [{"type": "text"}]}]
    assert refused_param(url, messages=parts) == "messages[0].content[0]"
    joined = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert asked(scripted, messages=joined)["messages"][0]["content"] == "a\nb"


@pytest.mark.parametrize("tools", [None, []])
def test_a_required_tool_choice_needs_a_tool(scripted, tools):
    url, _ = scripted
    fields = (
        {"tool_choice": "required"}
        if tools is None
        else {"tool_choice": "required", "tools": tools}
    )
    assert refused_param(url, **fields) == "tool_choice"
    assert asked(scripted, tool_choice="required", tools=[WEATHER])["tool_choice"] == "required"


@pytest.mark.parametrize("tools", [None, []])
def test_a_chat_without_tools_parses_no_tool_calls(scripted, tools):
    # "none": call markup the model writes is its text; no tool was offered to call.
    fields = {} if tools is None else {"tools": tools}
    assert asked(scripted, **fields).get("tool_choice") == "none"
    assert asked(scripted, tools=[WEATHER]).get("tool_choice", "auto") == "auto"


def test_top_logprobs_need_logprobs_and_logprobs_alone_ask_for_no_alternatives(scripted):
    url, _ = scripted
    assert refused_param(url, top_logprobs=2) == "top_logprobs"
    assert refused_param(url, top_logprobs=2, logprobs=False) == "top_logprobs"
    assert asked(scripted, logprobs=True)["sampling"].logprobs == 0
    assert asked(scripted, logprobs=True, top_logprobs=3)["sampling"].logprobs == 3
    assert asked(scripted)["sampling"].logprobs is None


def test_max_completion_tokens_wins_over_max_tokens(scripted):
    assert asked(scripted, max_tokens=5, max_completion_tokens=7)["max_tokens"] == 7
    assert asked(scripted, max_tokens=5)["max_tokens"] == 5


def test_choices_draw_with_consecutive_seeds_and_usage_counts_them_all(engine):
    def answer(completion_tokens: int) -> list:
        return [TextDelta("x"), Finished("stop", 3, completion_tokens, 0)]

    service = ScriptedService(answer(2), answer(3), answer(4))
    with serve(service, engine) as url:
        response = post(url, n=3, seed=2**64 - 2, temperature=1.0)
    assert response.status_code == 200, response.text
    assert [request["sampling"].seed for request in service.requests] == [2**64 - 2, 2**64 - 1, 0]
    usage = response.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (3, 9)


def frames(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


@pytest.mark.parametrize(
    ("stream_options", "usage_chunks"),
    [(None, 0), ({"include_usage": False}, 0), ({"include_usage": True}, 1)],
)
def test_streamed_usage_only_when_asked(scripted, stream_options, usage_chunks):
    url, _ = scripted
    fields = (
        {"stream": True}
        if stream_options is None
        else {"stream": True, "stream_options": stream_options}
    )
    chunks = frames(post(url, **fields))
    assert sum("usage" in chunk and chunk["usage"] is not None for chunk in chunks) == usage_chunks


def test_log_probabilities_of_the_last_tokens_are_streamed_before_the_finish(engine):
    # The last token's text is held back (it could start a stop string): its log-probability
    # has no text chunk to ride on, and goes in one of its own.
    service = ScriptedService(
        [
            TokenLogprobs("a", b"a", -0.25),
            TextDelta("a"),
            TokenLogprobs("b", b"b", -0.5),
            Finished("stop", 1, 2, 0),
        ]
    )
    with serve(service, engine) as url:
        chunks = frames(post(url, stream=True, logprobs=True))
    streamed = [
        (entry["token"], entry["logprob"])
        for chunk in chunks
        for choice in chunk["choices"]
        if choice.get("logprobs")
        for entry in choice["logprobs"]["content"]
    ]
    assert streamed == [("a", -0.25), ("b", -0.5)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_parallel_tool_calls_false_reaches_the_service(scripted):
    assert (
        asked(scripted, tools=[WEATHER], parallel_tool_calls=False)["parallel_tool_calls"] is False
    )
    assert asked(scripted, tools=[WEATHER])["parallel_tool_calls"] is True


def test_the_any_model_name_is_served(scripted):
    # ds4-agent's default --api-model: a client that does not know the served model's name.
    url, _ = scripted
    response = post(url, model="default")
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("kind", "expected"), [("any", "required"), ("auto", "auto")])
def test_anthropics_any_tool_choice_forces_a_call(engine, kind, expected):
    service = ScriptedService(ANSWER)
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
    body = {
        "model": MODEL_ID,
        "max_tokens": 4,
        "messages": HI,
        "tools": [tool],
        "tool_choice": {"type": kind},
    }
    with serve(service, engine) as url:
        response = httpx.post(f"{url}/v1/messages", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    assert service.requests[-1].get("tool_choice", "auto") == expected
