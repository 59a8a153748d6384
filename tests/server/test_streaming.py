"""Keep-alives, disconnects and the queue: what happens around generations, not in them."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from server.harness import (
    MODEL_ID,
    TIMEOUT,
    DelayedService,
    ScriptedService,
    serve,
    stats,
    wait_for_stats,
)

LONG = {
    "model": MODEL_ID,
    "messages": [{"role": "user", "content": "hello there"}],
    "max_tokens": 1000,
    "stream": True,
}


def sse_lines(response: httpx.Response) -> Iterator[str]:
    return (line for line in response.iter_lines() if line)


class CountingService(DelayedService):
    """Also counts the generations that actually started."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = 0

    def _delayed(self, events):
        self.started += 1
        return super()._delayed(events)


def test_keep_alives_flow_while_the_prompt_prefills(service, engine):
    with serve(DelayedService(service, first_event_delay=1.0), engine) as base_url:
        with httpx.stream(
            "POST",
            f"{base_url}/v1/chat/completions",
            timeout=TIMEOUT,
            json={**LONG, "max_tokens": 3},
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = list(sse_lines(response))
    first_content = next(
        i for i, line in enumerate(lines) if '"content":"' in line and '"content":""' not in line
    )
    assert lines[:first_content].count(": keep-alive") >= 3
    assert lines[-1] == "data: [DONE]"


def test_disconnect_mid_stream_frees_the_engine(service, engine):
    with serve(DelayedService(service, event_delay=0.05), engine) as base_url:
        before = stats(base_url)
        with httpx.stream(
            "POST", f"{base_url}/v1/chat/completions", json=LONG, timeout=TIMEOUT
        ) as response:
            lines = sse_lines(response)
            assert [next(lines) for _ in range(3)]
        # Generation stops within a token of the client leaving, far before 1000 tokens.
        wait_for_stats(base_url, before, cancelled=1, running=0)
        started = time.monotonic()
        reply = httpx.post(
            f"{base_url}/v1/chat/completions",
            timeout=TIMEOUT,
            json={**LONG, "stream": False, "max_tokens": 2},
        )
        # the engine is free: not behind the abandoned 1000-token answer (50 s of delays)
        assert reply.status_code == 200 and time.monotonic() - started < 20
        assert stats(base_url)["completed"] == before["completed"] + 1


def predicted_tokens(base_url: str) -> float:
    page = httpx.get(f"{base_url}/metrics", timeout=TIMEOUT).text
    (line,) = [
        line for line in page.splitlines() if line.startswith("llamacpp:tokens_predicted_total ")
    ]
    return float(line.split()[-1])


def test_a_cancelled_streams_tokens_are_counted(service, engine):
    # They were generated (the machine's time went to them) though nobody read the end.
    with serve(DelayedService(service, event_delay=0.05), engine) as base_url:
        before, predicted = stats(base_url), predicted_tokens(base_url)
        client = openai.OpenAI(
            base_url=f"{base_url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
        )
        stream = client.chat.completions.create(
            model=MODEL_ID, messages=LONG["messages"], max_tokens=1000, stream=True
        )
        received = 0
        for chunk in stream:
            received += sum(bool(choice.delta.content) for choice in chunk.choices)
            if received == 3:
                break
        stream.close()
        wait_for_stats(base_url, before, cancelled=1, running=0)
        counted = predicted_tokens(base_url) - predicted
    assert 3 <= counted < 1000


def test_a_queued_request_whose_client_left_never_runs(service, engine):
    counting = CountingService(service, event_delay=0.05)
    with serve(counting, engine) as base_url:
        before = stats(base_url)
        url = f"{base_url}/v1/chat/completions"
        with httpx.stream("POST", url, json=LONG, timeout=TIMEOUT) as running:
            running_lines = sse_lines(running)  # held: dropping the reader closes the stream
            next(running_lines)
            with httpx.stream("POST", url, json=LONG, timeout=TIMEOUT) as queued:
                # Only keep-alives come while it waits; then its client leaves.
                queued_lines = sse_lines(queued)
                assert [next(queued_lines) for _ in range(3)][1:] == [": keep-alive"] * 2
                assert stats(base_url)["queued"] == 1
        wait_for_stats(base_url, before, cancelled=2, running=0, queued=0)
    assert counting.started == 1


def test_a_non_streamed_request_is_cancelled_when_its_client_gives_up(service, engine):
    with serve(DelayedService(service, event_delay=0.05), engine) as base_url:
        before = stats(base_url)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{base_url}/v1/chat/completions", json={**LONG, "stream": False}, timeout=1.0
            )
        wait_for_stats(base_url, before, cancelled=1, running=0)


def test_fifty_concurrent_streams_get_their_own_complete_answers(base_url):
    prompts = [f"Question number {i}: what is {i} plus {i}?" for i in range(5)]
    # Ten requests a prompt, sent in prompt order: mostly extensions of the session's prompt.
    prompt_of = [prompts[i // 10] for i in range(50)]
    client = openai.OpenAI(
        base_url=f"{base_url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )
    expected = [
        client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": prompt}], max_tokens=2
        )
        .choices[0]
        .message.content
        for prompt in prompts
    ]

    async def stream_one(async_client: openai.AsyncOpenAI, prompt: str) -> tuple[str, str]:
        chunks = await async_client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=2,
            stream=True,
        )
        text, finish = "", ""
        async for chunk in chunks:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def stream_all() -> list[tuple[str, str]]:
        async with openai.AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key="unused", timeout=TIMEOUT * 6, max_retries=0
        ) as async_client:
            return await asyncio.gather(*(stream_one(async_client, prompt) for prompt in prompt_of))

    # The engine answers them one after another: the last waits for the other 49, which a
    # loaded machine makes slow. The bounds only catch a hang.
    results = asyncio.run(asyncio.wait_for(stream_all(), TIMEOUT * 8))
    assert results == [(expected[prompts.index(prompt)], "length") for prompt in prompt_of]


def test_the_queue_is_fifo_and_survives_failing_generations():
    from ds4mlx.engine.chat import TextDelta
    from ds4mlx.generation import Finished
    from ds4mlx.server.errors import APIError
    from ds4mlx.server.queue import GenerationQueue

    started: list[str] = []

    def generation(name: str, failure: Exception | None = None):
        def run():
            started.append(name)
            if failure is not None:
                raise failure
            yield TextDelta(name)
            yield Finished("stop", 1, 1, 0)

        return run

    def engine_threads() -> int:
        return sum(thread.name == "ds4-engine" for thread in threading.enumerate())

    async def drive() -> list[object]:
        queue = GenerationQueue()
        jobs = [
            queue.submit(generation("a")),
            queue.submit(generation("b", ValueError("no"))),
            queue.submit(generation("c", RuntimeError("bug"))),
            queue.submit(generation("d")),
        ]
        outcomes: list[object] = []
        for job in jobs:
            try:
                outcomes.append([event async for event in job.events(TIMEOUT)])
            except APIError as error:
                outcomes.append(error.status)
        await asyncio.to_thread(queue.close)
        return [*outcomes, queue.stats()]

    threads_before = engine_threads()
    a, b, c, d, final = asyncio.run(asyncio.wait_for(drive(), TIMEOUT))
    assert started == ["a", "b", "c", "d"]
    assert a == [TextDelta("a"), Finished("stop", 1, 1, 0)] and d[0] == TextDelta("d")
    assert (b, c) == (400, 500)
    assert (final.completed, final.failed, final.running, final.queued) == (2, 2, 0, 0)
    assert engine_threads() == threads_before  # close() ended the worker


def test_closing_refuses_the_waiting_jobs_and_empties_the_queue():
    """A job still waiting when the queue closes is refused with a 503 and leaves the queue:
    the queued count the metrics report falls back to zero."""
    from ds4mlx.server.errors import APIError
    from ds4mlx.server.queue import GenerationQueue

    async def drive() -> tuple[int, object, object]:
        queue = GenerationQueue()
        running_started = threading.Event()
        running: list = []

        def run_until_cancelled():
            running_started.set()
            # The engine stays busy with this job until close() cancels it, so the next
            # job is still waiting when the queue closes.
            while not running[0].cancelled:
                time.sleep(0.01)
            return
            yield

        running.append(queue.submit(run_until_cancelled))
        await asyncio.to_thread(running_started.wait, TIMEOUT)
        waiting = queue.submit(lambda: iter(()))
        queued_before = queue.stats().queued
        await asyncio.to_thread(queue.close)
        try:
            refusal: object = [event async for event in waiting.events(TIMEOUT)]
        except APIError as error:
            refusal = error.status
        return queued_before, refusal, queue.stats()

    queued_before, refusal, final = asyncio.run(asyncio.wait_for(drive(), TIMEOUT))
    assert queued_before == 1 and refusal == 503
    assert (final.queued, final.running) == (0, 0)


def test_each_generation_is_logged_with_its_speculation_counters(engine, caplog):
    from ds4mlx.engine.chat import TextDelta
    from ds4mlx.generation import Finished
    from ds4mlx.speculation import SpeculativeStats

    stats = SpeculativeStats(drafted_passes=4, drafted_tokens=12, accepted_tokens=9)
    service = ScriptedService([TextDelta("hi"), Finished("stop", 10, 14, 2, stats, 0.5)])
    caplog.set_level(logging.INFO, logger="ds4mlx.server")
    with serve(service, engine) as base_url:
        httpx.post(
            f"{base_url}/v1/completions", json={"model": MODEL_ID, "prompt": "x"}, timeout=TIMEOUT
        ).raise_for_status()
    assert "prompt 10 tokens (2 cached), generated 14, stop" in caplog.text
    assert "12 drafted, 9 accepted (75%), tau 3.25" in caplog.text


def test_concurrent_requests_are_served_first_come_with_their_first_output_timed(service, engine):
    with serve(DelayedService(service, event_delay=0.03), engine) as base_url:
        before = stats(base_url)
        ttft_before = _metric(base_url, "ds4mlx:time_to_first_token_seconds_count")
        finished: list[int] = []

        def ask(index: int) -> None:
            reply = httpx.post(
                f"{base_url}/v1/chat/completions",
                timeout=TIMEOUT,
                json={**LONG, "stream": False, "max_tokens": 4},
            )
            assert reply.status_code == 200
            finished.append(index)

        threads = []
        for index in range(4):
            threads.append(threading.Thread(target=ask, args=(index,)))
            threads[-1].start()
            wait_for_stats(base_url, before, submitted=index + 1)  # queued in this order
        for thread in threads:
            thread.join(TIMEOUT)
        assert finished == [0, 1, 2, 3]
        assert _metric(base_url, "ds4mlx:time_to_first_token_seconds_count") == ttft_before + 4


def _metric(base_url: str, name: str) -> float:
    page = httpx.get(f"{base_url}/metrics", timeout=TIMEOUT).text
    return float(
        next(line.split()[-1] for line in page.splitlines() if line.startswith(name + " "))
    )
