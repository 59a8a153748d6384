"""How the app answers each way a generation can end, streamed or not: a generation that ends
without finishing (503), a refusal before the first event (its own 4xx even when streamed), a
failure after output (an error in the stream), an unhandled error (500), options the engine
refuses (400); and what it counts and logs: refusals, the time to first output (keep-alives are
no output), the engine's detail line."""

from __future__ import annotations

import json
import logging
from typing import Any

from ds4mlx.engine.chat import TextDelta
from ds4mlx.generation import Finished
from ds4mlx.server.app import _log_finished
from ds4mlx.server.openai_chat import ChatCompletionsEndpoint
from ds4mlx.speculation.loop import SpeculativeStats

import httpx
import pytest

from server.harness import (
    MODEL_ID,
    TIMEOUT,
    DelayedService,
    FailingService,
    ScriptedService,
    config_with,
    serve,
)

HI = [{"role": "user", "content": "hi"}]
DONE = Finished("stop", prompt_tokens=1, completion_tokens=1, cached_tokens=0)
CHAT = {"path": "/v1/chat/completions", "body": {"model": MODEL_ID, "messages": HI}}
MESSAGES = {"path": "/v1/messages", "body": {"model": MODEL_ID, "max_tokens": 5, "messages": HI}}


def post(url: str, api: dict[str, Any], **fields: Any) -> httpx.Response:
    return httpx.post(f"{url}{api['path']}", json={**api["body"], **fields}, timeout=TIMEOUT)


def error_message(body: dict[str, Any]) -> str:
    """The message of an OpenAI or Anthropic error body."""
    return body["error"]["message"]


def metric(url: str, name: str) -> float:
    page = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    (line,) = [line for line in page.splitlines() if line.startswith(f"{name} ")]
    return float(line.split()[-1])


@pytest.mark.parametrize("api", [CHAT, MESSAGES], ids=["chat", "messages"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_generation_that_ends_without_finishing_is_unavailable(engine, api, stream):
    """No Finished and, streamed, no event at all: a 503 in the API's shape, never a 500
    (fresh8's app_cancelled_generation_answered_500)."""
    script = [] if stream else [TextDelta("cut")]
    with serve(ScriptedService(script), engine, config_with(keepalive_seconds=TIMEOUT)) as url:
        response = post(url, api, stream=stream)
    assert response.status_code == 503
    assert error_message(response.json()) == "the generation was cancelled"


def test_refusals_are_counted_apart_from_finished_requests(engine):
    """(fresh8's app_refusals_not_counted)"""
    with serve(ScriptedService([TextDelta("ok"), DONE]), engine) as url:
        assert metric(url, "ds4mlx:requests_refused_total") == 0
        assert post(url, CHAT).status_code == 200
        assert metric(url, "ds4mlx:requests_refused_total") == 0
        assert post(url, CHAT, temperature="hot").status_code == 400
        assert post(url, CHAT, model="other").status_code == 404
        assert metric(url, "ds4mlx:requests_refused_total") == 2
        assert metric(url, "ds4mlx:requests_total") == 1


@pytest.mark.parametrize("api", [CHAT, MESSAGES], ids=["chat", "messages"])
def test_a_streamed_request_refused_before_its_first_event_gets_its_4xx(engine, api):
    with serve(
        FailingService(ValueError("the prompt does not fit")),
        engine,
        config_with(keepalive_seconds=TIMEOUT),
    ) as url:
        response = post(url, api, stream=True)
        assert response.status_code == 400
        assert error_message(response.json()) == "the prompt does not fit"
        assert response.headers["content-type"] == "application/json"


def test_a_failure_after_the_first_event_is_an_error_in_the_stream(engine):
    with serve(
        FailingService(RuntimeError("the cache broke"), [TextDelta("partial")]), engine
    ) as url:
        response = post(url, CHAT, stream=True)
    assert response.status_code == 200
    payloads = [
        json.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: {")
    ]
    assert payloads[-1]["error"]["message"] == "generation failed: the cache broke"
    assert "partial" in response.text


def test_options_the_engine_refuses_are_a_400_with_its_message(engine, monkeypatch):
    def refuse(self, parsed, defaults):
        raise ValueError("top_k and min_p cannot be combined here")

    monkeypatch.setattr(ChatCompletionsEndpoint, "call", refuse)
    with serve(ScriptedService([DONE]), engine) as url:
        response = post(url, CHAT)
    assert response.status_code == 400
    assert error_message(response.json()) == "top_k and min_p cannot be combined here"


def test_an_unhandled_error_is_a_500_in_openai_shape(engine, monkeypatch):
    def broken(self, *args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ChatCompletionsEndpoint, "response", broken)
    with serve(ScriptedService([DONE]), engine) as url:
        response = post(url, CHAT)
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "internal server error"


def test_keep_alives_are_not_the_first_output(engine):
    """The time to first output runs to the first event, past the keep-alives sent while the
    generation was silent (its first event comes at least 0.3 s after it started)."""
    slow = DelayedService(ScriptedService([TextDelta("ok"), DONE]), first_event_delay=0.3)
    with serve(slow, engine, config_with(keepalive_seconds=0.02)) as url:
        assert post(url, CHAT, stream=True).status_code == 200
        assert metric(url, "ds4mlx:time_to_first_token_seconds_count") == 1
        assert metric(url, "ds4mlx:time_to_first_token_seconds_sum") >= 0.3
        # Whole, the keep-alives are skipped: the answer is the events'.
        whole = post(url, CHAT)
    assert whole.status_code == 200
    assert whole.json()["choices"][0]["message"]["content"] == "ok"


@pytest.mark.parametrize(("detail", "logged"), [("experts: 3 hits", True), (None, False)])
def test_the_engine_detail_line_is_logged_after_each_request(engine, caplog, detail, logged):
    config = config_with(details=lambda: detail)
    with caplog.at_level(logging.INFO, logger="ds4mlx.server"):
        with serve(ScriptedService([TextDelta("ok"), DONE]), engine, config) as url:
            assert post(url, CHAT).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "ds4mlx.server"]
    assert ("/v1/chat/completions: experts: 3 hits" in lines) is logged
    assert any(line.startswith("/v1/chat/completions: prompt 1 tokens") for line in lines)


def test_a_finished_request_is_logged_with_each_count_and_its_speculation(caplog):
    """The log line of a finished request names each count once, and the speculation line (a
    drafter took part and drafted) gives the acceptance in percent; a drafter that drafted
    nothing adds no line."""
    drafted = SpeculativeStats(drafted_passes=2, drafted_tokens=8, accepted_tokens=6)
    idle = SpeculativeStats()
    with caplog.at_level(logging.INFO, logger="ds4mlx.server"):
        for stats in (drafted, idle):
            finished = Finished(
                "length",
                prompt_tokens=30,
                completion_tokens=9,
                cached_tokens=12,
                stats=stats,
                seconds=1.5,
            )
            _log_finished("/v1/completions", finished, first_output=0.25)
    assert [r.getMessage() for r in caplog.records if r.name == "ds4mlx.server"] == [
        "/v1/completions: prompt 30 tokens (12 cached), generated 9, length, 1.50s; "
        "first output 0.25s after arrival",
        "/v1/completions: speculation: 8 drafted, 6 accepted (75%), tau 4.00",
        "/v1/completions: prompt 30 tokens (12 cached), generated 9, length, 1.50s; "
        "first output 0.25s after arrival",
    ]
