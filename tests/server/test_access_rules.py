"""AccessControl alone, on a bare app: which keys, headers and origins pass (no model, fast)."""

from __future__ import annotations

from ds4mlx.server.access import AccessControl

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

KEY = "sk-local-test"


async def ok(request):
    return PlainTextResponse("ran")


ROUTES = [
    Route(path, ok, methods=["GET", "POST"])
    for path in ("/health", "/v1/health", "/v1/models", "/v1/messages", "/v1/chat/completions")
]


def client(api_keys=(KEY,), cross_origin=False) -> TestClient:
    app = AccessControl(Starlette(routes=ROUTES), api_keys=api_keys, cross_origin=cross_origin)
    return TestClient(app, base_url="http://127.0.0.1:8000")


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEY}"},
        {"Authorization": f"bearer {KEY}"},  # the scheme is case-insensitive
        {"Authorization": f"BEARER {KEY}"},
        {"Authorization": f"Bearer  {KEY} "},
        {"x-api-key": KEY},
        {"Authorization": "Basic abc", "x-api-key": KEY},  # not a bearer: the other header
        {"Authorization": "Bearer ", "x-api-key": KEY},
    ],
)
def test_a_valid_key_passes(headers):
    response = client().get("/v1/models", headers=headers)
    assert response.status_code == 200 and response.text == "ran"


def test_any_of_several_keys_passes():
    several = client(api_keys=("first", KEY))
    for key in ("first", KEY):
        assert several.get("/v1/models", headers={"x-api-key": key}).status_code == 200
    assert several.get("/v1/models", headers={"x-api-key": "second"}).status_code == 401


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer   "},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": f"Bearer {KEY[:-1]}"},
        {"Authorization": f"Bearer {KEY}x"},
        {"x-api-key": KEY.upper()},
        {"x-api-key": ""},
    ],
)
def test_a_missing_or_wrong_key_is_refused(headers):
    response = client().post("/v1/chat/completions", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_the_refusal_names_how_to_send_a_key_only_when_none_was_sent():
    missing = client().get("/v1/models").json()["error"]["message"]
    wrong = client().get("/v1/models", headers={"x-api-key": "nope"}).json()["error"]["message"]
    assert "x-api-key" in missing and "not valid" in wrong


def test_anthropic_routes_refuse_in_anthropic_shape():
    body = client().post("/v1/messages").json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert "type" not in client().post("/v1/chat/completions").json()


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health_needs_no_key(path):
    assert client().get(path).status_code == 200


def test_without_keys_everything_passes():
    assert client(api_keys=()).post("/v1/chat/completions").status_code == 200


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://127.0.0.1:8000", 200),
        ("HTTP://127.0.0.1:8000", 200),
        ("http://127.0.0.1:8000".upper(), 200),  # host names are case-insensitive
        ("http://127.0.0.1:8001", 403),
        ("http://evil.example", 403),
        ("null", 403),
        ("", 403),
    ],
)
def test_only_the_servers_own_origin_passes(origin, status):
    response = client(api_keys=()).post("/v1/chat/completions", headers={"Origin": origin})
    assert response.status_code == status
    if status == 403:
        assert response.json()["error"]["code"] == "cross_origin_refused"
        assert "www-authenticate" not in response.headers


def test_cors_lets_other_origins_through_but_still_needs_the_key():
    open_cors = client(cross_origin=True)
    headers = {"Origin": "http://app.example"}
    assert open_cors.get("/v1/models", headers=headers).status_code == 401
    assert open_cors.get("/v1/models", headers={**headers, "x-api-key": KEY}).status_code == 200


def test_a_foreign_origin_is_refused_even_on_health():
    assert client().get("/health", headers={"Origin": "http://evil.example"}).status_code == 403
