"""``--batched-session``: concurrent requests decode together in batched steps, and each gets
exactly what it would get alone (same greedy text, its own seed, stop strings and limits)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

from ds4mlx.generation import ChatService

import httpx
import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT, serve_sessions, stats, wait_for_stats

N_SESSIONS = 4
# Prompts of different lengths, so that the sessions of a batched step sit at different
# positions; different token limits, so that requests leave the batch at different steps.
REQUESTS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12},
    {
        "messages": [
            {
                "role": "user",
                "content": "Write a poem about the sea and its waves, "
                "with rhymes, in four short lines.",
            }
        ],
        "max_tokens": 20,
    },
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2 + 2?"},
        ],
        "max_tokens": 16,
    },
    {"messages": [{"role": "user", "content": "List three colours."}], "max_tokens": 9},
    {
        "messages": [{"role": "user", "content": "Sampled, with a seed."}],
        "max_tokens": 14,
        "temperature": 0.9,
        "top_p": 0.95,
        "seed": 1234,
    },
    {
        "messages": [{"role": "user", "content": "Another sampled one."}],
        "max_tokens": 10,
        "temperature": 1.3,
        "seed": 99,
    },
]


@pytest.fixture(scope="module")
def batched_url(chat_model, engine) -> Iterator[str]:
    """A server over the chat model that runs up to N_SESSIONS requests together (on the shared
    engine thread, where the model lives)."""
    service = engine.run(lambda: ChatService(chat_model, max_context=1024, sessions=N_SESSIONS))
    with serve_sessions(service, engine) as url:
        yield url


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def chat(url: str, request: dict[str, Any], stream: bool) -> tuple[str, str, int]:
    """The text, finish reason and completion tokens of one chat completion."""
    client = client_for(url)
    if not stream:
        completion = client.chat.completions.create(model=MODEL_ID, **request)
        return (
            completion.choices[0].message.content or "",
            completion.choices[0].finish_reason,
            completion.usage.completion_tokens,
        )
    text, reason, tokens = "", "", -1
    for chunk in client.chat.completions.create(
        model=MODEL_ID, stream=True, stream_options={"include_usage": True}, **request
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reason = choice.finish_reason or reason
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return text, reason, tokens


def concurrently(url: str, requests: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    start = threading.Barrier(len(requests))

    def one(index: int) -> tuple[str, str, int]:
        start.wait()
        return chat(url, requests[index], stream=index % 2 == 0)

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, range(len(requests))))


def test_concurrent_requests_equal_sequential_ones(base_url, batched_url):
    sequential = [chat(base_url, request, stream=False) for request in REQUESTS]
    before = stats(batched_url)
    together = concurrently(batched_url, REQUESTS)
    assert together == sequential
    after = stats(batched_url)
    assert after["completed"] - before["completed"] == len(REQUESTS)
    # They really shared steps, and never more than the server's sessions.
    assert after["batched_steps"] > before["batched_steps"]
    assert 2 <= after["max_batch"] <= N_SESSIONS
    assert all(tokens > 0 for _, _, tokens in together)


def test_the_largest_batch_stays_the_largest_after_smaller_ones(batched_url):
    """``max_batch`` is the most jobs any batched step advanced, not the last step's count
    (fresh6's queue_max_batch_is_the_last_batch): requests that leave at different steps end
    in smaller batches, and a later pair runs in a batch of two."""
    # Four requests started together overlap for most of their steps: some step runs three
    # or four of them. The pair after them ends in a batch of two.
    concurrently(batched_url, [{**request, "max_tokens": 24} for request in REQUESTS[:4]])
    largest = stats(batched_url)["max_batch"]
    assert largest >= 3
    concurrently(batched_url, [REQUESTS[3], REQUESTS[3]])
    assert stats(batched_url)["max_batch"] == largest


def test_stop_strings_and_limits_stay_per_request(base_url, batched_url):
    reference, _, _ = chat(base_url, REQUESTS[1], stream=False)
    stop = reference[len(reference) // 2 :][:3]
    assert stop.strip(), "the reference text is too short to cut"
    requests = [
        dict(REQUESTS[1], stop=[stop]),
        REQUESTS[0],
        dict(REQUESTS[2], max_tokens=3),
        REQUESTS[3],
    ]
    text, reason, _ = concurrently(batched_url, requests)[0]
    assert reason == "stop" and text == reference[: reference.index(stop)]
    assert concurrently(batched_url, requests)[2][2] == 3


def test_a_disconnect_frees_its_session(batched_url):
    """Clients that leave mid-stream free their sessions: the slots serve new requests."""
    before = stats(batched_url)
    # The chat model's greedy answer to this runs on for hundreds of tokens.
    long_request = {
        "model": MODEL_ID,
        "stream": True,
        "max_tokens": 600,
        "messages": [{"role": "user", "content": "hello"}],
    }
    for _ in range(2):
        with httpx.Client(timeout=TIMEOUT) as http, ExitStack() as streams:
            # Dropping a line iterator early closes its connection: keep them all.
            lines = []
            for _ in range(N_SESSIONS):
                response = streams.enter_context(
                    http.stream("POST", f"{batched_url}/v1/chat/completions", json=long_request)
                )
                lines.append(response.iter_lines())
                next(lines[-1])
            # Each has produced a token: all the sessions are taken at once.
            for line in lines:
                while not next(line).startswith("data: "):
                    pass
            # One more waits in the queue: no more jobs run than there are sessions.
            streams.enter_context(
                http.stream("POST", f"{batched_url}/v1/chat/completions", json=long_request)
            )
            wait_for_stats(batched_url, before, queued=1)
            assert stats(batched_url)["running"] == N_SESSIONS
        wait_for_stats(batched_url, before, running=0, queued=0)
    after = stats(batched_url)
    assert after["cancelled"] - before["cancelled"] == 2 * (N_SESSIONS + 1)
    # Every slot is free again: a full batch of new requests completes.
    assert all(tokens > 0 for _, _, tokens in concurrently(batched_url, REQUESTS[:4]))


def test_batched_sessions_are_refused_for_a_model_without_batched_decode(chat_model):
    class NoBatch:
        network = object()
        path = chat_model.path
        gguf = chat_model.gguf

    with pytest.raises(ValueError, match="no batched decode"):
        ChatService(NoBatch(), sessions=2)
