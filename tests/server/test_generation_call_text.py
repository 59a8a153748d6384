"""How much of a chat request's text the length check counts before tokenizing
(``GenerationCall.text_characters``), and the least ``max_tokens`` of an Anthropic request:
survivors of the fifth blind mutation run (scripts/mutation_sets/fresh5.py)."""

from __future__ import annotations

from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.server.anthropic_messages import MessagesRequest
from ds4mlx.server.generation import GenerationCall

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
