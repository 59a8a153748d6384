"""The server's guards at their edges: API keys that are almost the configured one, the body
size limit on every route that reads a body (one byte either side of it), origins that look
like the server's own, and the context and vocabulary bounds at their last allowed value.

Each test here was checked against a one-character mutation of the code it guards (see
``scripts/mutation_run.py``, the ``server_*`` mutations).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from ds4mlx.engine.tokenizer import NumericTokenizer
from ds4mlx.generation import Finished

import httpx
import pytest

from server.harness import MODEL_ID, TIMEOUT, ScriptedService, config_with, serve

KEY = "sk-local-test"
OTHER_KEY = "second-key"
LIMIT = 4096  # the body size limit of these servers
HI = [{"role": "user", "content": "hi"}]
ANSWER = [Finished("stop", prompt_tokens=1, completion_tokens=0, cached_tokens=0)]
VOCAB = 4096  # the scripted model's NumericTokenizer
CONTEXT = 4096

# Every route that reads a body, with a small valid body for it.
BODY_ROUTES = {
    "/v1/chat/completions": {"model": MODEL_ID, "messages": HI, "max_tokens": 1},
    "/v1/completions": {"model": MODEL_ID, "prompt": "hi", "max_tokens": 1},
    "/v1/messages": {"model": MODEL_ID, "messages": HI, "max_tokens": 1},
    "/v1/responses": {"model": MODEL_ID, "input": "hi", "max_output_tokens": 16},
    "/v1/messages/count_tokens": {"model": MODEL_ID, "messages": HI},
    "/tokenize": {"content": "hi"},
    "/detokenize": {"tokens": [1, 2]},
}


@pytest.fixture(scope="module")
def keyed_url(engine) -> Iterator[str]:
    config = config_with(api_keys=(KEY, OTHER_KEY), max_body_bytes=LIMIT)
    with serve(ScriptedService(ANSWER), engine, config) as url:
        yield url


def keyed(headers: dict[str, str] | None = None, key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **(headers or {})}


# ------------------------------------------------------------------ API keys

ALMOST_KEYS = [
    KEY[:-1],  # a prefix of the key
    KEY[:1],
    KEY + "x",  # the key is a prefix of it
    KEY + KEY,
    KEY + OTHER_KEY,
    KEY.upper(),
    "x" + KEY,
    KEY[:-1] + "T",
    OTHER_KEY[:-1],
    f"{KEY} {OTHER_KEY}",
]


@pytest.mark.parametrize("wrong", ALMOST_KEYS)
@pytest.mark.parametrize("header", ["Authorization", "x-api-key"])
def test_a_key_that_is_almost_the_configured_one_is_refused(keyed_url, header, wrong):
    value = f"Bearer {wrong}" if header == "Authorization" else wrong
    response = httpx.get(f"{keyed_url}/v1/models", headers={header: value}, timeout=TIMEOUT)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("key", [KEY, OTHER_KEY])
def test_each_configured_key_works_on_both_headers(keyed_url, key):
    for headers in ({"Authorization": f"Bearer {key}"}, {"x-api-key": key}):
        response = httpx.get(f"{keyed_url}/v1/models", headers=headers, timeout=TIMEOUT)
        assert response.status_code == 200, headers
    lower = httpx.get(
        f"{keyed_url}/v1/models", headers={"Authorization": f"bearer {key}"}, timeout=TIMEOUT
    )
    assert lower.status_code == 200  # the scheme's case does not matter (RFC 9110)


@pytest.mark.parametrize(
    "authorization", [f"Basic {KEY}", f"Token {KEY}", f"Bearer{KEY}", "Bearer"]
)
def test_only_a_bearer_token_is_taken_from_authorization(keyed_url, authorization):
    response = httpx.get(
        f"{keyed_url}/v1/models", headers={"Authorization": authorization}, timeout=TIMEOUT
    )
    assert response.status_code == 401


def test_anthropic_paths_refuse_in_anthropic_shape(keyed_url):
    response = httpx.post(
        f"{keyed_url}/v1/messages",
        headers={"x-api-key": KEY[:-1]},
        json=BODY_ROUTES["/v1/messages"],
        timeout=TIMEOUT,
    )
    assert response.status_code == 401
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("path", ["/stats", "/v1/models", "/metrics", "/props", "/slots"])
def test_only_health_checks_are_open(keyed_url, path):
    assert httpx.get(f"{keyed_url}{path}", timeout=TIMEOUT).status_code == 401
    for open_path in ("/health", "/v1/health"):
        assert httpx.get(f"{keyed_url}{open_path}", timeout=TIMEOUT).status_code == 200


@pytest.mark.parametrize("spaces", ["  ", "   "])
def test_a_bearer_token_may_follow_several_spaces(keyed_url, spaces):
    # RFC 9110's credentials: the scheme, one or more spaces, then the token.
    authorization = f"Bearer{spaces}{KEY}"
    response = httpx.get(
        f"{keyed_url}/v1/models", headers={"Authorization": authorization}, timeout=TIMEOUT
    )
    assert response.status_code == 200


def test_with_cors_a_browsers_preflight_needs_no_key_and_its_request_does(engine):
    # Browsers send a preflight without credentials; the CORS layer answers it before the
    # key check, and the request that follows must still bring a key.
    config = config_with(api_keys=(KEY,), cors=True)
    browser = {"Origin": "http://app.example"}
    with serve(ScriptedService(ANSWER), engine, config) as url:
        preflight = httpx.options(
            f"{url}/v1/chat/completions",
            headers={**browser, "Access-Control-Request-Method": "POST"},
            timeout=TIMEOUT,
        )
        assert preflight.status_code == 200
        body = BODY_ROUTES["/v1/chat/completions"]
        for headers, status in ((browser, 401), (keyed(browser), 200)):
            response = httpx.post(
                f"{url}/v1/chat/completions", headers=headers, json=body, timeout=TIMEOUT
            )
            assert response.status_code == status
        # Any other OPTIONS request is refused without a key like every other method.
        assert httpx.options(f"{url}/v1/models", timeout=TIMEOUT).status_code == 401


# ------------------------------------------------------------------ body size limit


def padded(body: dict, size: int) -> bytes:
    """``body`` as JSON, padded with spaces to exactly ``size`` bytes (still valid JSON)."""
    text = json.dumps(body).encode()
    return text + b" " * (size - len(text))


def chunks(data: bytes) -> Iterator[bytes]:
    """A body of undeclared length: httpx sends an iterator chunked, without Content-Length."""
    for start in range(0, len(data), 1000):
        yield data[start : start + 1000]


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_every_route_that_reads_a_body_refuses_one_byte_over_the_limit(keyed_url, path):
    over = padded(BODY_ROUTES[path], LIMIT + 1)
    for content in (over, chunks(over)):
        response = httpx.post(
            f"{keyed_url}{path}",
            headers=keyed({"Content-Type": "application/json"}),
            content=content,
            timeout=TIMEOUT,
        )
        assert response.status_code == 413, (path, type(content))
        assert "larger than 4096 bytes" in response.text


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_a_body_of_exactly_the_limit_is_read(keyed_url, path):
    exact = padded(BODY_ROUTES[path], LIMIT)
    for content in (exact, chunks(exact)):
        response = httpx.post(
            f"{keyed_url}{path}",
            headers=keyed({"Content-Type": "application/json"}),
            content=content,
            timeout=TIMEOUT,
        )
        assert response.status_code == 200, (path, response.text)


# ------------------------------------------------------------------ origins


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1",  # the host without the server's port
        "http://127.0.0.1:1",
        "http://127.0.0.1:{port}.evil.example",
        "http://evil.example/127.0.0.1:{port}",
        "null",
        "",
    ],
)
def test_an_origin_that_only_looks_like_the_servers_own_is_refused(keyed_url, origin):
    port = keyed_url.rsplit(":", 1)[1]
    response = httpx.get(
        f"{keyed_url}/v1/models",
        headers=keyed({"Origin": origin.format(port=port)}),
        timeout=TIMEOUT,
    )
    assert response.status_code == 403 and response.json()["error"]["code"] == (
        "cross_origin_refused"
    )


def test_the_servers_own_origin_is_served(keyed_url):
    same = httpx.get(f"{keyed_url}/v1/models", headers=keyed({"Origin": keyed_url}), timeout=5)
    assert same.status_code == 200
    upper = keyed_url.replace("http://", "HTTP://")
    assert httpx.get(f"{keyed_url}/v1/models", headers=keyed({"Origin": upper})).status_code == 200


# ------------------------------------------------------------------ context and vocabulary


@pytest.fixture(scope="module")
def open_url(engine) -> Iterator[str]:
    with serve(ScriptedService(ANSWER, max_context=CONTEXT), engine) as url:
        yield url


def test_text_is_refused_from_the_first_length_that_cannot_fit(open_url):
    # The numeric tokenizer: at most 5 bytes a token, so 5 * (CONTEXT - 1) characters may fit
    # and one more cannot.
    fits = 5 * (CONTEXT - 1)
    for characters, status in ((fits, 200), (fits + 1, 400)):
        response = httpx.post(
            f"{open_url}/tokenize", json={"content": "x" * characters}, timeout=TIMEOUT
        )
        assert response.status_code == status, characters
    refused = httpx.post(f"{open_url}/tokenize", json={"content": "x" * (fits + 1)})
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert f"at least {CONTEXT} tokens" in refused.json()["error"]["message"]


def chat_of_tokens(count: int) -> list[dict[str, str]]:
    """A conversation whose prompt is exactly ``count`` tokens in the scripted model."""
    service = ScriptedService()
    for length in range(5 * count):
        messages = [{"role": "user", "content": "x" * length}]
        if len(service.chat_prompt(messages)) == count:
            return messages
    raise AssertionError(f"no conversation of {count} tokens")


def test_a_prompt_of_the_whole_context_is_refused(engine):
    context = 64
    with serve(ScriptedService(ANSWER, max_context=context), engine) as url:
        for tokens, status in ((context - 1, 200), (context, 400)):
            response = httpx.post(
                f"{url}/v1/chat/completions",
                json={"model": MODEL_ID, "messages": chat_of_tokens(tokens), "max_tokens": 1},
                timeout=TIMEOUT,
            )
            assert response.status_code == status, (tokens, response.text)
        assert f"the prompt has {context} tokens" in response.json()["error"]["message"]


@pytest.mark.parametrize(("token_id", "status"), [(VOCAB - 1, 200), (VOCAB, 400)])
def test_token_ids_end_at_the_vocabulary(open_url, token_id, status):
    bias = httpx.post(
        f"{open_url}/v1/chat/completions",
        json={"model": MODEL_ID, "messages": HI, "logit_bias": {str(token_id): 1}},
        timeout=TIMEOUT,
    )
    assert bias.status_code == status
    ids = httpx.post(f"{open_url}/detokenize", json={"tokens": [token_id]}, timeout=TIMEOUT)
    assert ids.status_code == status
    assert NumericTokenizer(VOCAB).vocab_size == VOCAB


@pytest.mark.parametrize(("token_id", "status"), [(0, 200), (-1, 400)])
def test_token_ids_start_at_zero(open_url, token_id, status):
    ids = httpx.post(f"{open_url}/detokenize", json={"tokens": [token_id]}, timeout=TIMEOUT)
    assert ids.status_code == status
