"""Server behaviours at the edges the fourth fresh mutation run found untested (issue 37,
``scripts/mutation_sets/fresh4.py``): slots while a request runs, the refusal shape of
``/v1/messages/count_tokens``, sampling fields at their last allowed value, and the Anthropic
switch that allows one tool call per turn.

Each test was checked against the mutation it is named after in that set.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator, Iterator
from typing import Any

from ds4mlx.generation import Finished, ServiceEvent, TextDelta
from ds4mlx.server.choices import ChoiceEvent, merged

import httpx
import pytest

from server.harness import (
    MODEL_ID,
    TIMEOUT,
    DelayedService,
    ScriptedService,
    config_with,
    serve,
    wait_for_stats,
)

HI = [{"role": "user", "content": "hi"}]
DONE = [Finished("stop", prompt_tokens=1, completion_tokens=0, cached_tokens=0)]


@pytest.fixture(scope="module")
def scripted() -> ScriptedService:
    return ScriptedService(DONE)


@pytest.fixture(scope="module")
def url(scripted, engine) -> Iterator[str]:
    with serve(scripted, engine) as base:
        yield base


# ------------------------------------------------------------------ slots


class HeldService(ScriptedService):
    """Its generations wait for ``release``: a request that keeps its slot busy."""

    def __init__(self) -> None:
        super().__init__(DONE)
        self.release = threading.Event()

    def _answer(self, request: dict[str, Any]) -> Generator[ServiceEvent, None, None]:
        self.release.wait(TIMEOUT)
        yield from super()._answer(request)


def test_slots_report_a_running_request_and_fail_on_no_slot(engine):
    service = HeldService()
    with serve(service, engine) as base:
        idle = httpx.get(f"{base}/slots", timeout=TIMEOUT).json()
        assert [slot["is_processing"] for slot in idle] == [False] * engine.max_sessions
        for flag in ("1", "true"):
            response = httpx.get(f"{base}/slots?fail_on_no_slot={flag}", timeout=TIMEOUT)
            assert response.status_code == 200
        since = httpx.get(f"{base}/stats", timeout=TIMEOUT).json()
        body = {"model": MODEL_ID, "messages": HI, "max_tokens": 1}
        running = threading.Thread(
            target=httpx.post, args=(f"{base}/v1/chat/completions",), kwargs={"json": body}
        )
        running.start()
        try:
            wait_for_stats(base, since, running=1)
            busy = httpx.get(f"{base}/slots", timeout=TIMEOUT).json()
            assert busy[0]["is_processing"] is True
            for flag in ("1", "true"):
                response = httpx.get(f"{base}/slots?fail_on_no_slot={flag}", timeout=TIMEOUT)
                assert response.status_code == 503, flag
            assert httpx.get(f"{base}/slots?fail_on_no_slot=0", timeout=TIMEOUT).is_success
        finally:
            service.release.set()
            running.join(TIMEOUT)


# ------------------------------------------------------------------ count_tokens refusals


def test_count_tokens_refuses_without_a_key_in_anthropic_shape(engine):
    config = config_with(api_keys=("sk-test",))
    with serve(ScriptedService(DONE), engine, config) as base:
        response = httpx.post(
            f"{base}/v1/messages/count_tokens",
            json={"model": MODEL_ID, "messages": HI},
            timeout=TIMEOUT,
        )
    assert response.status_code == 401
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"


# ------------------------------------------------------------------ sampling fields


def chat(url: str, **fields: Any) -> httpx.Response:
    body = {"model": MODEL_ID, "messages": HI, "max_tokens": 1, **fields}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT)


def test_top_logprobs_needs_logprobs_even_when_zero(url):
    refused = chat(url, top_logprobs=0)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "top_logprobs"
    assert chat(url, top_logprobs=0, logprobs=True).status_code == 200


def test_the_largest_seed_is_accepted_and_one_more_refused(url, scripted):
    assert chat(url, seed=2**64 - 1).status_code == 200
    assert scripted.requests[-1]["sampling"].seed == 2**64 - 1
    refused = chat(url, seed=2**64)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "seed"


# ------------------------------------------------------------------ Anthropic tool choice


@pytest.mark.parametrize("disable", [True, False])
def test_anthropic_disable_parallel_tool_use_reaches_the_engine(url, scripted, disable):
    tool = {"name": "get", "description": "d", "input_schema": {"type": "object"}}
    body = {
        "model": MODEL_ID,
        "max_tokens": 1,
        "messages": HI,
        "tools": [tool],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": disable},
    }
    response = httpx.post(f"{url}/v1/messages", json=body, timeout=TIMEOUT)
    assert response.status_code == 200
    assert scripted.requests[-1]["parallel_tool_calls"] is (not disable)


@pytest.mark.parametrize("key", ["-5", "-0", "+5", " 5", "5.0", "0x5", "", "five"])
def test_a_logit_bias_key_that_is_not_a_token_id_is_named(url, key):
    refused = chat(url, logit_bias={key: 1.0})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "logit_bias" and f"key '{key}' is not a token id" in error["message"]


# ------------------------------------------------------------------ stream framing


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 1}),
        ("/v1/messages", {"messages": HI, "max_tokens": 1}),
    ],
)
def test_every_stream_frame_ends_with_a_blank_line(engine, path, body):
    # Clients that split a stream at blank lines (many hand-written ones) must find a
    # keep-alive comment alone in its frame, never glued to the event after it.
    service = DelayedService(ScriptedService(DONE), first_event_delay=0.7)
    with serve(service, engine) as base:
        request = {"model": MODEL_ID, "stream": True, **body}
        with httpx.stream("POST", f"{base}{path}", json=request, timeout=TIMEOUT) as response:
            raw = b"".join(response.iter_bytes())
    frames = raw.split(b"\n\n")
    assert frames[-1] == b"" and frames.count(b": keep-alive") >= 2
    for frame in frames[:-1]:
        assert frame == b": keep-alive" or frame.startswith((b"data: ", b"event: ")), frame


# ------------------------------------------------------------------ choices


async def _events(*items):
    for item in items:
        yield item


def test_a_choice_that_ends_without_finishing_ends_the_request_without_a_total():
    finished = Finished("stop", prompt_tokens=1, completion_tokens=2, cached_tokens=0)
    cancelled = _events(TextDelta("partial"))  # no Finished: the choice was cancelled
    complete = _events(TextDelta("whole"), finished)

    async def collect():
        return [item async for item in merged([cancelled, complete])]

    assert asyncio.run(collect()) == [ChoiceEvent(0, TextDelta("partial"))]
