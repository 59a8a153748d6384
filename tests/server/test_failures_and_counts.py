"""Whose fault a failure is, and what the counters count: a service's TypeError before any
output is the request's (400), any failure after output is the server's (500); a body over the
limit is Anthropic's ``request_too_large``; every finished request counts once.

Each test fails on a mutation of the blind set ``scripts/mutation_sets/fresh6.py`` that the
suite missed in its first pass (named in each test).
"""

from __future__ import annotations

from ds4mlx.engine.chat import TextDelta
from ds4mlx.generation import Finished

import httpx

from server.harness import MODEL_ID, TIMEOUT, FailingService, ScriptedService, config_with, serve

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
ANSWER = [TextDelta("ok"), Finished("stop", prompt_tokens=1, completion_tokens=1, cached_tokens=0)]


def chat_status(url: str) -> tuple[int, dict]:
    response = httpx.post(f"{url}{CHAT}", json={"model": MODEL_ID, "messages": HI}, timeout=TIMEOUT)
    return response.status_code, response.json()


def test_a_type_error_before_any_output_is_the_requests_fault(engine):
    """(queue_type_error_before_start_is_a_server_fault)"""
    with serve(
        FailingService(TypeError("content must be a string or a list of parts")), engine
    ) as url:
        status, body = chat_status(url)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "content must be a string" in body["error"]["message"]


def test_a_failure_after_output_is_the_servers_fault(engine):
    """(queue_failure_after_output_as_client_error) A ValueError is the request's only
    before the service has produced anything."""
    with serve(
        FailingService(ValueError("the cache went inconsistent"), [TextDelta("partial")]), engine
    ) as url:
        status, body = chat_status(url)
    assert status == 500 and body["error"]["type"] == "server_error"
    assert "generation failed" in body["error"]["message"]


def test_an_anthropic_body_over_the_limit_is_request_too_large(engine):
    """(errors_request_too_large_typed_as_invalid_request) Anthropic's error type for 413."""
    with serve(ScriptedService(ANSWER), engine, config_with(max_body_bytes=4096)) as url:
        body = {"model": MODEL_ID, "max_tokens": 5, "messages": HI, "metadata": {"x": "y" * 5000}}
        response = httpx.post(f"{url}/v1/messages", json=body, timeout=TIMEOUT)
    assert response.status_code == 413
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "request_too_large"


def requests_total(url: str) -> float:
    page = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    (line,) = [line for line in page.splitlines() if line.startswith("ds4mlx:requests_total ")]
    return float(line.split()[-1])


def test_every_finished_request_counts_once(engine):
    """(metrics_finished_requests_not_counted)"""
    with serve(ScriptedService(ANSWER), engine) as url:
        assert requests_total(url) == 0
        for expected in (1, 2, 3):
            assert chat_status(url)[0] == 200
            assert requests_total(url) == expected
