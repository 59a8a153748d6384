"""The app's routes over a scripted service: each generation path with and without ``/v1``,
the model names a request may use (the served id, an alias, "default") and the served id every
response names, the model list, and stored responses fetched and deleted."""

from __future__ import annotations

import time
from collections.abc import Iterator

from ds4mlx.generation import Finished, TextDelta

import httpx
import pytest

from server.harness import MODEL_ID, TIMEOUT, ScriptedService, config_with, serve

ALIAS = "alias-model"
ANSWER = [TextDelta("ok"), Finished("stop", prompt_tokens=1, completion_tokens=1, cached_tokens=0)]
HI = [{"role": "user", "content": "hi"}]
BODIES = {
    "chat/completions": {"messages": HI},
    "completions": {"prompt": "hi"},
    "responses": {"input": "hi"},
    "messages": {"messages": HI, "max_tokens": 4},
}


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with serve(ScriptedService(ANSWER), engine, config_with(aliases=(ALIAS,))) as base:
        yield base


def post(url: str, path: str, **body) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=TIMEOUT)


@pytest.mark.parametrize("prefix", ["/v1/", "/"])
@pytest.mark.parametrize("route", ["chat/completions", "completions", "responses"])
@pytest.mark.parametrize("asked", [MODEL_ID, ALIAS, "default"])
def test_openai_routes_answer_with_and_without_v1_naming_the_served_model(
    url, prefix, route, asked
):
    reply = post(url, prefix + route, model=asked, **BODIES[route])
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == MODEL_ID


@pytest.mark.parametrize("asked", [ALIAS, "default"])
def test_messages_name_the_served_model_streamed_or_not(url, asked):
    reply = post(url, "/v1/messages", model=asked, **BODIES["messages"])
    assert (reply.status_code, reply.json()["model"]) == (200, MODEL_ID)
    streamed = post(url, "/v1/messages", model=asked, stream=True, **BODIES["messages"])
    assert f'"model":"{MODEL_ID}"' in streamed.text


def test_messages_have_no_route_without_v1(url):
    reply = post(url, "/messages", model=MODEL_ID, **BODIES["messages"])
    assert reply.status_code == 404


@pytest.mark.parametrize("route", ["chat/completions", "completions", "responses", "messages"])
def test_an_unknown_model_is_named_with_what_is_served(url, route):
    reply = post(url, f"/v1/{route}", model="other", **BODIES[route])
    assert reply.status_code == 404
    message = f"the model 'other' does not exist; this server serves '{MODEL_ID}', '{ALIAS}'"
    assert message in reply.text


def test_the_model_list_has_the_id_and_its_aliases(url):
    listed = httpx.get(f"{url}/v1/models", timeout=TIMEOUT).json()
    assert listed["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in listed["data"]] == [
        (MODEL_ID, "model", "ds4mlx"),
        (ALIAS, "model", "ds4mlx"),
    ]
    assert {m["context_length"] for m in listed["data"]} == {4096}
    for name in (ALIAS, "default"):
        assert httpx.get(f"{url}/v1/models/{name}", timeout=TIMEOUT).json()["id"] == name
    unknown = httpx.get(f"{url}/v1/models/other", timeout=TIMEOUT)
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health_on_both_paths(url, path):
    assert httpx.get(f"{url}{path}", timeout=TIMEOUT).json() == {"status": "ok"}


def test_a_stored_response_is_fetched_then_deleted_once(url):
    created = post(url, "/responses", model=MODEL_ID, input="hi").json()
    where = f"{url}/v1/responses/{created['id']}"
    assert httpx.get(where, timeout=TIMEOUT).json() == created
    deleted = httpx.delete(where, timeout=TIMEOUT)
    assert deleted.json() == {"id": created["id"], "object": "response.deleted", "deleted": True}
    for again in (httpx.get(where, timeout=TIMEOUT), httpx.delete(where, timeout=TIMEOUT)):
        assert again.status_code == 404
        assert again.json()["error"]["code"] == "not_found"


def test_a_stream_tells_proxies_neither_to_cache_nor_to_buffer_it(url):
    streamed = post(url, "/v1/chat/completions", model=MODEL_ID, stream=True, messages=HI)
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.headers["cache-control"] == "no-cache"
    assert streamed.headers["x-accel-buffering"] == "no"


def test_models_are_dated_when_the_server_started(url):
    listed = httpx.get(f"{url}/v1/models", timeout=TIMEOUT).json()["data"]
    one = httpx.get(f"{url}/v1/models/{MODEL_ID}", timeout=TIMEOUT).json()
    created = {m["created"] for m in listed} | {one["created"]}
    assert len(created) == 1
    # This module's server started within the hour before now (seconds since the epoch).
    assert time.time() - 3600 <= created.pop() <= time.time()


def test_a_model_name_with_a_slash_is_found(engine):
    """Served names such as "org/model" (a Hugging Face id) hold a slash; the route takes the
    rest of the path as the name."""
    with serve(ScriptedService(ANSWER), engine, config_with(aliases=("org/model",))) as base:
        found = httpx.get(f"{base}/v1/models/org/model", timeout=TIMEOUT)
    assert (found.status_code, found.json()["id"]) == (200, "org/model")


def test_a_wrong_method_names_itself_and_the_allowed_one(url):
    refused = httpx.get(f"{url}/v1/chat/completions", timeout=TIMEOUT)
    assert refused.status_code == 405
    assert refused.headers["allow"] == "POST"
    assert refused.json()["error"]["message"] == ("GET /v1/chat/completions: Method Not Allowed")
