"""API keys and cross-origin requests."""

from __future__ import annotations

from ds4mlx.cli.server import api_keys_from

import anthropic
import httpx
import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT, config_with, serve, stats

KEY = "sk-local-test"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def keyed_url(service, engine):
    with serve(service, engine, config_with(api_keys=(KEY, "second-key"))) as url:
        yield url


def test_requests_need_a_valid_key(keyed_url):
    wrong = openai.OpenAI(
        base_url=f"{keyed_url}/v1", api_key="sk-wrong", timeout=TIMEOUT, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    missing = httpx.post(
        f"{keyed_url}/v1/chat/completions",
        timeout=TIMEOUT,
        json={"model": MODEL_ID, "messages": HI},
    )
    assert missing.status_code == 401 and "API key" in missing.json()["error"]["message"]
    for path in ("/tokenize", "/metrics", "/props"):
        assert (
            httpx.request(
                "POST" if path == "/tokenize" else "GET", f"{keyed_url}{path}", timeout=TIMEOUT
            ).status_code
            == 401
        )
    # Health checks need no key.
    assert httpx.get(f"{keyed_url}/health", timeout=TIMEOUT).status_code == 200


def test_bearer_and_x_api_key_are_accepted(keyed_url):
    client = openai.OpenAI(base_url=f"{keyed_url}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)
    assert (
        client.chat.completions.create(
            model=MODEL_ID, messages=HI, max_tokens=1
        ).usage.completion_tokens
        == 1
    )
    claude = anthropic.Anthropic(
        base_url=keyed_url, api_key="second-key", timeout=TIMEOUT, max_retries=0
    )
    assert (
        claude.messages.create(model=MODEL_ID, max_tokens=1, messages=HI).usage.output_tokens == 1
    )
    wrong = anthropic.Anthropic(base_url=keyed_url, api_key="nope", timeout=TIMEOUT, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=MODEL_ID, max_tokens=1, messages=HI)


def test_a_cross_origin_simple_request_runs_nothing(base_url):
    before = stats(base_url)
    # What a page on another site can send without a preflight: a text/plain POST.
    response = httpx.post(
        f"{base_url}/v1/chat/completions",
        timeout=TIMEOUT,
        headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
        content=f'{{"model": "{MODEL_ID}", "messages": [{{"role": "user", "content": "hi"}}]}}',
    )
    assert response.status_code == 403 and "--cors" in response.json()["error"]["message"]
    assert stats(base_url)["submitted"] == before["submitted"]
    # The server's own origin, and clients that send none, are served.
    same = httpx.post(
        f"{base_url}/v1/chat/completions",
        timeout=TIMEOUT,
        headers={"Origin": base_url},
        json={"model": MODEL_ID, "messages": HI, "max_tokens": 1},
    )
    assert same.status_code == 200


def test_cors_allows_browser_pages(service, engine):
    with serve(service, engine, config_with(cors=True)) as url:
        preflight = httpx.options(
            f"{url}/v1/chat/completions",
            timeout=TIMEOUT,
            headers={
                "Origin": "http://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 200
        response = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=TIMEOUT,
            headers={"Origin": "http://app.example"},
            json={"model": MODEL_ID, "messages": HI, "max_tokens": 1},
        )
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] in ("*", "http://app.example")


def test_api_key_flags(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("one\n\n two \n")
    assert api_keys_from(["zero"], keys) == ("zero", "one", "two")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="no key"):
        api_keys_from([], tmp_path / "empty")
    with pytest.raises(ValueError, match="blank"):
        api_keys_from([" "], None)
