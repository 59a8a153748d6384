"""How much of a chat request's text the length check counts before tokenizing
(``GenerationCall.text_characters``), the least ``max_tokens`` and the tool types of an
Anthropic request, a completions prompt list: survivors of the fifth blind mutation run
(scripts/mutation_sets/fresh5.py)."""

from __future__ import annotations

from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.server.anthropic_messages import MessagesRequest, _tools
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import GenerationCall, GenerationDefaults
from ds4mlx.server.openai_completions import CompletionRequest, CompletionsEndpoint

import pydantic
import pytest


def _characters(messages: list[dict]) -> int:
    return GenerationCall(
        max_tokens=1, sampling=SamplingOptions(), messages=messages
    ).text_characters


def test_tool_results_count_whole_and_an_assistants_answer_as_stripped():
    """System, user and tool texts are in every rendering, so they count whole (fails when a
    tool result, often the longest text of an agent's request, is left out); an assistant's
    answer counts without its surrounding blanks; content that is not text counts nothing."""
    messages = [
        {"role": "system", "content": "s" * 3},
        {"role": "user", "content": "u" * 5},
        {"role": "tool", "content": "t" * 1000, "tool_call_id": "1"},
        {"role": "assistant", "content": "  ab  "},
        {"role": "user", "content": [{"type": "text", "text": "parts"}]},
    ]
    assert _characters(messages) == 3 + 5 + 1000 + 2
    assert _characters(messages[2:3]) == 1000


def test_a_raw_prompt_counts_its_characters():
    call = GenerationCall(max_tokens=1, sampling=SamplingOptions(), prompt="abc")
    assert call.text_characters == 3


def test_an_anthropic_request_asks_for_at_least_one_token():
    """``max_tokens`` 0 is refused on /v1/messages as on the OpenAI routes; 1 is the least
    (fails when the bound admits 0)."""
    hi = [{"role": "user", "content": "hi"}]
    assert MessagesRequest(model="m", max_tokens=1, messages=hi).max_tokens == 1
    with pytest.raises(pydantic.ValidationError, match="max_tokens"):
        MessagesRequest(model="m", max_tokens=0, messages=hi)


def test_a_completions_prompt_list_holds_exactly_one_prompt():
    """An empty prompt list is refused with the same clear error as a list of two (fails when
    only longer lists are refused: an empty one then failed on its missing first prompt)."""
    defaults = GenerationDefaults(max_tokens=8)
    endpoint = CompletionsEndpoint()
    call = endpoint.call(CompletionRequest(model="m", prompt=["one"]), defaults)
    assert call.prompt == "one"
    for prompts in ([], ["one", "two"]):
        with pytest.raises(APIError) as refused:
            endpoint.call(CompletionRequest(model="m", prompt=prompts), defaults)
        assert refused.value.param == "prompt"


def test_an_anthropic_custom_tool_is_offered():
    """A tool of type "custom" (what Anthropic's clients send for a client tool) is offered like
    one without a type; a server tool type is refused (fails when only an untyped tool runs)."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    hi = [{"role": "user", "content": "hi"}]

    def tools(kind: str | None) -> list:
        request = MessagesRequest(
            model="m",
            max_tokens=8,
            messages=hi,
            tools=[{"name": "weather", "type": kind, "input_schema": schema}],
        )
        return _tools(request)[0]

    assert tools("custom")[0]["function"]["name"] == "weather"
    assert tools(None) == tools("custom")
    with pytest.raises(APIError) as refused:
        tools("web_search_20250305")
    assert refused.value.param == "tools[0]"


def test_completions_logprobs_go_up_to_twenty():
    """The legacy completions route takes up to 20 alternatives a token, as the chat route's
    top_logprobs does, and no more (fails when the bound is 5)."""
    assert CompletionRequest(model="m", prompt="x", logprobs=20).logprobs == 20
    with pytest.raises(pydantic.ValidationError, match="logprobs"):
        CompletionRequest(model="m", prompt="x", logprobs=21)


def test_completions_ask_for_at_least_one_choice():
    """``n`` 0 is refused on /v1/completions as on the chat route (fails when 0 passes)."""
    assert CompletionRequest(model="m", prompt="x", n=1).n == 1
    with pytest.raises(pydantic.ValidationError, match="n"):
        CompletionRequest(model="m", prompt="x", n=0)
