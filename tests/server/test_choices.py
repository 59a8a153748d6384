"""``n > 1`` with the official ``openai`` client: choice i equals a single request made with the
request's seed + i, usage counts the prompt once and every choice's completion, and on batched
sessions the choices decode together with the prompt prefilled once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial

from ds4mlx.generation import ChatService, PromptCache
from ds4mlx.server.choices import choice_seed

import httpx
import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT, serve, stats

N_SESSIONS = 4
MESSAGES = [{"role": "user", "content": "Write a short poem about the harbour at dawn."}]
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "max_tokens": 12}


@pytest.fixture(scope="module")
def batched_url(chat_model, engine) -> Iterator[str]:
    """A server running up to N_SESSIONS generations together, with a prompt cache (as
    ds4-server keeps by default), on the shared engine thread."""
    cache = PromptCache(256 * 2**20, None)
    service = engine.run(
        partial(ChatService, chat_model, max_context=1024, sessions=N_SESSIONS, prompt_cache=cache)
    )
    with ExitStack() as stack:
        engine.max_sessions = N_SESSIONS
        stack.callback(setattr, engine, "max_sessions", 1)  # the engine outlives this server
        yield stack.enter_context(serve(service, engine))


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def prefilled_tokens(url: str) -> int:
    """Prompt tokens the server has fed so far (prompt tokens less those reused)."""
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=TIMEOUT).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return int(values["llamacpp:prompt_tokens_total"] - values["ds4mlx:prompt_tokens_cached_total"])


def single_chats(url: str, seeds: list[int]) -> list[openai.types.chat.ChatCompletion]:
    client = client_for(url)
    return [
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, seed=seed, **SAMPLED)
        for seed in seeds
    ]


def test_four_chat_choices_equal_four_single_requests(base_url, batched_url):
    seed, n = 1234, 4
    singles = single_chats(base_url, [choice_seed(seed, i) for i in range(n)])
    before, prefilled = stats(batched_url), prefilled_tokens(batched_url)
    completion = client_for(batched_url).chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, seed=seed, n=n, **SAMPLED
    )
    assert [c.index for c in completion.choices] == list(range(n))
    texts = [c.message.content for c in completion.choices]
    assert texts == [s.choices[0].message.content for s in singles]
    assert len(set(texts)) > 1  # each choice its own seed stream
    assert [c.finish_reason for c in completion.choices] == [
        s.choices[0].finish_reason for s in singles
    ]
    usage = completion.usage
    assert usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    after = stats(batched_url)
    # The choices decoded together in batched steps, each in its own session ...
    assert after["batched_steps"] > before["batched_steps"]
    assert after["completed"] - before["completed"] == n
    # ... and the prompt was prefilled once: the other choices took it from the first's state
    # (each feeds only the prompt's last token again).
    assert prefilled_tokens(batched_url) - prefilled <= usage.prompt_tokens + n - 1


def test_completion_choices_on_one_session(base_url):
    """One session: the choices run one after another, each continuing the prompt's state."""
    client = client_for(base_url)
    request = {"prompt": "The harbour at dawn", "temperature": 1.1, "max_tokens": 10}
    singles = [
        client.completions.create(model=MODEL_ID, seed=choice_seed(7, i), **request)
        for i in range(3)
    ]
    prefilled = prefilled_tokens(base_url)
    completion = client.completions.create(model=MODEL_ID, seed=7, n=3, **request)
    texts = [c.text for c in completion.choices]
    assert texts == [s.choices[0].text for s in singles], texts
    assert len(set(texts)) > 1
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert completion.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert completion.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert prefilled_tokens(base_url) - prefilled <= completion.usage.prompt_tokens + 2


def test_greedy_choices_are_the_same_text(base_url):
    completion = client_for(base_url).chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, n=2, max_tokens=8
    )
    first, second = completion.choices
    assert first.message.content == second.message.content


def test_seeds_wrap_around():
    assert choice_seed(2**64 - 1, 1) == 0
    assert choice_seed(None, 3) is None


def streamed_choices(chunks) -> tuple[dict[int, str], dict[int, str], object]:
    """Per choice index: the text accumulated from the chunks' deltas and the finish reason;
    and the usage chunk's usage."""
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            texts[choice.index] = texts.get(choice.index, "") + (piece or "")
            if choice.finish_reason:
                assert choice.index not in reasons  # one finish per choice
                reasons[choice.index] = choice.finish_reason
    return texts, reasons, usage


def test_streamed_chat_choices_equal_the_unstreamed_ones(base_url):
    client = client_for(base_url)
    request = {"model": MODEL_ID, "messages": MESSAGES, "seed": 99, "n": 3, **SAMPLED}
    whole = client.chat.completions.create(**request)
    chunks = list(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    assert len({chunk.id for chunk in chunks}) == 1  # one request, one id
    texts, reasons, usage = streamed_choices(chunks)
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert len(set(texts.values())) > 1
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_streamed_completion_choices_equal_the_unstreamed_ones(base_url):
    client = client_for(base_url)
    request = {"model": MODEL_ID, "prompt": "The harbour at dawn", "seed": 5, "n": 2}
    request |= {"temperature": 1.1, "max_tokens": 10}
    whole = client.completions.create(**request)
    texts, reasons, usage = streamed_choices(client.completions.create(**request, stream=True))
    assert texts == {c.index: c.text for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert usage is None  # not asked for
