"""Malformed requests get a 4xx with a clear error object, and the server stays healthy."""

from __future__ import annotations

import json
import select
import socket
from urllib.parse import urlsplit

from ds4mlx.server.app import MAX_BODY_BYTES

import anthropic
import httpx
import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT, FailingService, ScriptedService, config_with, serve

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def chat(**fields) -> bytes:
    return json.dumps({"model": MODEL_ID, "messages": HI, **fields}).encode()


BAD_REQUESTS = [
    # path, body, status, the field the error names
    (CHAT, b"{bad", 400, None),
    (CHAT, b"", 400, None),
    (CHAT, b"[1, 2]", 400, None),
    (CHAT, b"\xff\xfe{}", 400, None),
    (CHAT, b"[" * 5000 + b"]" * 5000, 400, None),
    (CHAT, json.dumps({"messages": HI}).encode(), 400, "model"),
    (CHAT, json.dumps({"model": MODEL_ID, "messages": "hi"}).encode(), 400, "messages"),
    (CHAT, json.dumps({"model": MODEL_ID, "messages": []}).encode(), 400, "messages"),
    (CHAT, chat(messages=[{"role": "robot", "content": "x"}]), 400, "messages[0].role"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (CHAT, chat(temperature="hot"), 400, "temperature"),
    (CHAT, chat(temperature=-1), 400, "temperature"),
    (CHAT, chat()[:-1] + b', "temperature": NaN}', 400, "temperature"),
    (CHAT, chat()[:-1] + b', "temperature": Infinity}', 400, "temperature"),  # no upper bound
    (CHAT, chat(top_p=1.5), 400, "top_p"),
    (CHAT, chat(max_tokens=0), 400, "max_tokens"),
    (CHAT, chat(max_tokens=True), 400, "max_tokens"),
    (CHAT, chat(seed="7"), 400, "seed"),
    (CHAT, chat(stop=7), 400, "stop"),
    (CHAT, chat(stream="yes"), 400, "stream"),
    (CHAT, chat(tools=[{"type": "function"}]), 400, "tools[0].function"),
    (CHAT, chat(n=0), 400, "n"),
    (CHAT, chat(logit_bias={"abc": 5}), 400, "logit_bias"),
    (CHAT, chat(logit_bias={"99999999": 5}), 400, "logit_bias"),  # outside the vocabulary
    (CHAT, chat(repeat_last_n=-2), 400, "repeat_last_n"),
    (CHAT, chat(repeat_penalty=0), 400, "repeat_penalty"),
    (CHAT, chat(presence_penalty=3), 400, "presence_penalty"),
    (CHAT, chat(reasoning_effort="extreme"), 400, "reasoning_effort"),
    (
        "/v1/responses",
        json.dumps({"model": MODEL_ID, "input": "x", "reasoning": {"effort": 3}}).encode(),
        400,
        "reasoning.effort",
    ),
    (CHAT, chat(model="gpt-4o"), 404, "model"),
    (CHAT, chat(messages=[{"role": "user", "content": "hello " * 2000}]), 400, "messages"),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": "hello " * 2000}], stream=True),
        400,
        "messages",
    ),
    (CHAT, chat(seed=-2), 400, "seed"),
    (CHAT, chat(seed=2**64), 400, "seed"),
    (CHAT, chat(tool_choice="required"), 400, "tool_choice"),
    (
        CHAT,
        chat(
            tools=[{"type": "function", "function": {"name": "a"}}],
            tool_choice={"type": "function", "function": {"name": "b"}},
        ),
        400,
        "tool_choice",
    ),
    ("/v1/responses", json.dumps({"model": MODEL_ID, "input": []}).encode(), 400, "input"),
    (
        "/v1/responses",
        json.dumps(
            {"model": MODEL_ID, "input": "x", "previous_response_id": "resp_unknown"}
        ).encode(),
        400,
        "previous_response_id",
    ),
    ("/v1/completions", json.dumps({"model": MODEL_ID}).encode(), 400, "prompt"),
    (
        "/v1/completions",
        json.dumps({"model": MODEL_ID, "prompt": [1, 2]}).encode(),
        400,
        "prompt[0]",
    ),
    ("/v1/responses", json.dumps({"model": MODEL_ID, "input": 5}).encode(), 400, "input"),
    (
        "/v1/responses",
        json.dumps({"model": MODEL_ID, "input": "x", "max_output_tokens": -1}).encode(),
        400,
        "max_output_tokens",
    ),
]


@pytest.fixture
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=TIMEOUT) as client:
        yield client


def assert_healthy(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}


@pytest.mark.parametrize("path, body, status, param", BAD_REQUESTS)
def test_openai_style_errors(http, path, body, status, param):
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    assert_healthy(http)


@pytest.mark.parametrize(
    "body, status, error_type",
    [
        ({"model": MODEL_ID, "messages": HI}, 400, "invalid_request_error"),  # no max_tokens
        ({"model": "claude-x", "max_tokens": 5, "messages": HI}, 404, "not_found_error"),
        (
            {"model": MODEL_ID, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            400,
            "invalid_request_error",
        ),
    ],
)
def test_anthropic_style_errors(http, body, status, error_type):
    response = http.post("/v1/messages", json=body)
    assert response.status_code == status
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == error_type and response.json()["error"]["message"]
    assert_healthy(http)


def test_a_failed_generation_is_a_server_error_to_both_clients(engine):
    """A generation that fails is the server's fault, not the request's: 500 with OpenAI's
    ``server_error`` and Anthropic's ``api_error`` types."""
    with serve(FailingService(RuntimeError("the model broke")), engine) as url:
        gpt = openai.OpenAI(base_url=f"{url}/v1", api_key="k", timeout=TIMEOUT, max_retries=0)
        with pytest.raises(openai.InternalServerError) as failed:
            gpt.chat.completions.create(model=MODEL_ID, messages=HI)
        assert failed.value.status_code == 500 and failed.value.type == "server_error"
        claude = anthropic.Anthropic(base_url=url, api_key="k", timeout=TIMEOUT, max_retries=0)
        with pytest.raises(anthropic.InternalServerError) as refused:
            claude.messages.create(model=MODEL_ID, max_tokens=5, messages=HI)
        assert refused.value.status_code == 500
        assert refused.value.body["error"]["type"] == "api_error"


def test_unknown_paths_and_methods(http):
    assert http.get(CHAT).status_code == 405
    missing = http.post("/v1/embeddings", json={})
    assert missing.status_code == 404 and missing.json()["error"]["message"]
    assert http.get("/v1/messages").json()["type"] == "error"
    assert http.get("/v1/models/nope").status_code == 404
    assert_healthy(http)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of a plain (Content-Length) HTTP response."""
    response = b""
    while b"\r\n\r\n" not in response and (data := sock.recv(65536)):
        response += data
    head, _, body = response.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
    )
    while len(body) < length and (data := sock.recv(65536)):
        body += data
    return int(head.split(b" ", 2)[1]), body


def test_a_declared_oversize_body_is_refused_before_it_is_sent(base_url, http):
    url = urlsplit(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=TIMEOUT) as sock:
        sock.sendall(
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode()
            + b"{" * 1024
        )
        status, body = read_response(sock)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert_healthy(http)


def test_an_undeclared_oversize_body_is_cut_off_while_it_arrives(engine):
    with serve(ScriptedService(), engine, config_with(max_body_bytes=4096)) as base_url:
        url = urlsplit(base_url)
        chunk = b"400\r\n" + b" " * 1024 + b"\r\n"  # 1 KiB chunks
        sent = 0
        with socket.create_connection((url.hostname, url.port), timeout=TIMEOUT) as sock:
            sock.sendall(
                f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            )
            try:
                while sent < 64 * 1024 and not select.select([sock], [], [], 0.05)[0]:
                    sock.sendall(chunk)
                    sent += 1024
            except OSError:  # the server closed the connection after answering
                pass
            status, _ = read_response(sock)
        assert status == 413
        assert sent < 64 * 1024, "the server read the whole body before refusing it"
        assert httpx.get(f"{base_url}/health", timeout=TIMEOUT).status_code == 200


def test_still_generates_after_all_that(http):
    response = http.post(CHAT, content=chat(max_tokens=3))
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3
