"""Repetition penalties on a prompt-cache hit: the tokens restored from the cache stay in the
penalty window, so a repeated request answers as it did cold (issue 36, item 1). Through the
official clients, on chat completions, ``/v1/completions`` and ``/v1/messages``, with one
session and with batched sessions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ds4mlx
from ds4mlx.generation import ChatService, PromptCache

import anthropic
import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT, serve_sessions

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
pytestmark = pytest.mark.skipif(not TINY_MODEL.is_file(), reason=f"{TINY_MODEL} is not built")
PROMPT = "def function_1(x):"
PENALTIES = [
    {"frequency_penalty": 1.0},
    {"presence_penalty": 1.5},
    {"extra_body": {"repeat_penalty": 1.3}},
]


@pytest.fixture(scope="module")
def tiny_model(engine):
    return engine.run(lambda: ds4mlx.load_model(TINY_MODEL))


@pytest.fixture
def url(request, engine, tiny_model) -> Iterator[str]:
    """A server over the tiny model with a prompt cache in memory, as ``ds4-server`` has by
    default; a service of its own, so that every test starts with an empty cache."""
    sessions = request.param
    service = engine.run(
        lambda: ChatService(
            tiny_model, max_context=1024, sessions=sessions, prompt_cache=PromptCache(2**28)
        )
    )
    with serve_sessions(service, engine) as base_url:
        yield base_url


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def chat(url: str, penalty: dict[str, Any]) -> tuple[str, int]:
    reply = openai_client(url).chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=40,
        temperature=0,
        **penalty,
    )
    return reply.choices[0].message.content or "", reply.usage.prompt_tokens_details.cached_tokens


def completion(url: str, penalty: dict[str, Any]) -> tuple[str, int]:
    reply = openai_client(url).completions.create(
        model=MODEL_ID, prompt=PROMPT * 3, max_tokens=40, temperature=0, **penalty
    )
    details = reply.usage.prompt_tokens_details
    return reply.choices[0].text, details.cached_tokens if details else 0


def message(url: str, penalty: dict[str, Any]) -> tuple[str, int]:
    # The Anthropic API has no penalty fields: they go in the body as llama.cpp's server takes
    # them.
    extra = {"temperature": 0, **(penalty.get("extra_body") or penalty)}
    reply = anthropic.Anthropic(
        base_url=url, api_key="unused", timeout=TIMEOUT, max_retries=0
    ).messages.create(
        model=MODEL_ID,
        max_tokens=40,
        messages=[{"role": "user", "content": PROMPT}],
        extra_body=extra,
    )
    return "".join(block.text for block in reply.content if block.type == "text"), (
        reply.usage.cache_read_input_tokens or 0
    )


# Every API with every penalty, and each of them on one session and on batched sessions (each
# pair of the three choices is met; the 18 combinations of all three add no path of their own).
CASES = [
    pytest.param(
        sessions,
        ask,
        penalty,
        id=f"{'one-session' if sessions == 1 else 'batched-4'}-"
        f"{next(iter(penalty.get('extra_body', penalty)))}-{ask.__name__}",
    )
    for a, ask in enumerate([chat, completion, message])
    for p, penalty in enumerate(PENALTIES)
    for sessions in [(1, 4)[(a + p) % 2]]
]


@pytest.mark.parametrize(("url", "ask", "penalty"), CASES, indirect=["url"])
def test_a_cached_prompt_is_penalised_as_a_cold_one(
    url: str, ask: Callable[[str, dict[str, Any]], tuple[str, int]], penalty: dict[str, Any]
) -> None:
    cold, cached = ask(url, penalty)
    assert cached == 0
    warm = [ask(url, penalty) for _ in range(2)]
    assert all(cached > 0 for _, cached in warm), warm  # the prompt came from the cache
    assert [text for text, _ in warm] == [cold, cold]
    assert ask(url, {})[0] != cold  # the penalty changes this answer at all
