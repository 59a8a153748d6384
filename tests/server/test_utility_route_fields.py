"""The utility routes called directly, over a scripted model and a stand-in engine: the
defaults of /tokenize, the refusals of /detokenize and /v1/messages/count_tokens, every field of
/props, /slots while requests run, and the Prometheus page's content type."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import ds4mlx
from ds4mlx.engine.chat import DEEPSEEK_V4
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.tokenizer import NumericTokenizer
from ds4mlx.server.generation import GenerationDefaults
from ds4mlx.server.limits import RequestLimits
from ds4mlx.server.metrics import ServerMetrics
from ds4mlx.server.queue import QueueStats
from ds4mlx.server.utility_routes import UtilityRoutes

import pytest
from starlette.requests import Request

from server.harness import ScriptedService

MODEL_ID = "served-model"
VOCABULARY = 4096
PARTIAL_UTF8_ID = 7  # its bytes start a two-byte character
# Each default differs from the others and from SamplingOptions' own.
FILTERS = {"temperature": 0.7, "top_p": 0.9, "top_k": 11, "min_p": 0.05}
PENALTIES = {
    "repeat_penalty": 1.1,
    "frequency_penalty": 0.2,
    "presence_penalty": 0.3,
    "repeat_last_n": 77,
}
SAMPLING = SamplingOptions(**FILTERS, **PENALTIES)
DEFAULTS = GenerationDefaults(max_tokens=33, sampling=SAMPLING, thinking=True)


class RecordingTokenizer(NumericTokenizer):
    """The numeric tokenizer, recording how it was asked to encode; token 7 is half of "é"."""

    def __init__(self) -> None:
        super().__init__(VOCABULARY)
        self.encoded: list[tuple[str, bool, bool]] = []

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        self.encoded.append((text, add_special, parse_special))
        return super().encode(text, add_special, parse_special)

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        return b"\xc3" if token_id == PARTIAL_UTF8_ID else super().token_bytes(token_id)


class Model:
    def __init__(self, chat_format: Any = DEEPSEEK_V4, path: Path | None = None):
        self.tokenizer = RecordingTokenizer()
        self.chat_format = chat_format
        if path is not None:
            self.path = path


class Engine:
    """Stands in for the engine thread: its slots and how many requests run and wait."""

    def __init__(self, max_sessions: int = 3, running: int = 0):
        self.max_sessions = max_sessions
        self.running = running

    def stats(self) -> QueueStats:
        return QueueStats(queued=2, running=self.running)


def routes(model: Model | None = None, engine: Engine | None = None) -> UtilityRoutes:
    service = ScriptedService([], model=model or Model(), max_context=512)
    return UtilityRoutes(
        service,
        engine or Engine(),
        ServerMetrics(),
        RequestLimits(service),
        MODEL_ID,
        lambda name: name == MODEL_ID,
        DEFAULTS,
        max_body_bytes=2**20,
    )


def http(body: Any = None, query: str = "") -> Request:
    raw = b"" if body is None else json.dumps(body).encode()
    scope = {
        "type": "http",
        "method": "POST" if body is not None else "GET",
        "path": "/",
        "headers": [(b"content-length", str(len(raw)).encode())],
        "query_string": query.encode(),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    return Request(scope, receive)


def answer(route, body: Any = None, query: str = "") -> tuple[int, Any]:
    response = asyncio.run(route(http(body, query)))
    return response.status_code, json.loads(response.body)


# ------------------------------------------------------------------ tokenize


def test_tokenize_adds_no_special_tokens_and_parses_special_text_by_default():
    utility = routes()
    status, body = answer(utility.tokenize, {"content": "hello"})
    assert status == 200 and body == {"tokens": NumericTokenizer(VOCABULARY).encode("hello")}
    answer(utility.tokenize, {"content": "hi", "add_special": True, "parse_special": False})
    assert utility.tokenizer.encoded == [("hello", False, True), ("hi", True, False)]


def test_tokenize_pieces_are_text_or_the_bytes_of_a_partial_character():
    utility = routes()
    pieces = utility._piece(PARTIAL_UTF8_ID), utility._piece(8)
    assert pieces == ([0xC3], "<8>")


# ------------------------------------------------------------------ detokenize


@pytest.mark.parametrize(("tokens", "index"), [([5, -1], 1), ([VOCABULARY, 0], 0)])
def test_detokenize_refuses_an_id_outside_the_vocabulary_by_its_place(tokens, index):
    status, body = answer(routes().detokenize, {"tokens": tokens})
    assert status == 400
    assert body["error"]["param"] == f"tokens[{index}]"
    assert body["error"]["message"] == (
        f"invalid 'tokens[{index}]': {tokens[index]} is not a token id "
        f"(the vocabulary has {VOCABULARY})"
    )


def test_detokenize_takes_the_first_and_last_ids():
    status, body = answer(routes().detokenize, {"tokens": [0, VOCABULARY - 1]})
    assert (status, body) == (200, {"content": f"<0><{VOCABULARY - 1}>"})


# ------------------------------------------------------------------ count_tokens


def test_count_tokens_needs_no_max_tokens():
    status, body = answer(
        routes().count_tokens,
        {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 200 and body["input_tokens"] > 0


def test_count_tokens_refuses_another_model_in_anthropics_shape():
    status, body = answer(
        routes().count_tokens, {"model": "other", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 404
    assert body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": f"the model 'other' does not exist; this server serves '{MODEL_ID}'",
        },
    }


# ------------------------------------------------------------------ props and slots


def test_props_give_every_default_under_llama_servers_names():
    status, props = answer(routes(Model(path=Path("/models/m.gguf"))).props)
    assert status == 200
    assert props == {
        "default_generation_settings": {
            "n_ctx": 512,
            "params": {
                "n_predict": 33,
                "temperature": 0.7,
                "top_k": 11,
                "top_p": 0.9,
                "min_p": 0.05,
                "seed": -1,
                "repeat_penalty": 1.1,
                "repeat_last_n": 77,
                "frequency_penalty": 0.2,
                "presence_penalty": 0.3,
                "enable_thinking": True,
            },
        },
        "total_slots": 3,
        "model_alias": MODEL_ID,
        "model_path": "/models/m.gguf",
        "chat_template": "deepseek-v4",
        "modalities": {"vision": False, "audio": False},
        "build_info": f"ds4mlx {ds4mlx.__version__}",
    }


def test_props_of_a_model_without_path_or_template_say_none():
    _, props = answer(routes(Model(chat_format=None)).props)
    assert props["model_path"] is None and props["chat_template"] is None


def test_props_give_a_set_seed_as_it_is():
    utility = routes()
    utility.defaults = GenerationDefaults(max_tokens=1, sampling=SamplingOptions(seed=42))
    assert answer(utility.props)[1]["default_generation_settings"]["params"]["seed"] == 42


@pytest.mark.parametrize(("running", "busy"), [(0, []), (1, [0]), (3, [0, 1, 2])])
def test_slots_are_busy_for_the_running_requests_only(running, busy):
    status, slots = answer(routes(engine=Engine(running=running)).slots)
    assert status == 200
    assert [slot["id"] for slot in slots] == [0, 1, 2]
    assert [slot["id"] for slot in slots if slot["is_processing"]] == busy
    assert {slot["n_ctx"] for slot in slots} == {512}


@pytest.mark.parametrize(("running", "status"), [(2, 200), (3, 503)])
def test_slots_fail_on_no_slot_only_when_every_slot_is_busy(running, status):
    utility = routes(engine=Engine(running=running))
    for flag in ("1", "true"):
        assert answer(utility.slots, query=f"fail_on_no_slot={flag}")[0] == status
    assert answer(utility.slots, query="fail_on_no_slot=0")[0] == 200


def test_metrics_page_is_prometheus_text_format():
    response = asyncio.run(routes().prometheus(http()))
    assert response.media_type == "text/plain; version=0.0.4"
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
