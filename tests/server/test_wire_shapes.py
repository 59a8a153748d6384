"""What goes on the wire whatever the route: the two error shapes (OpenAI's and Anthropic's, by
status), the exact bytes of server-sent event frames, and how a body is read (in pieces,
declared or not, or cut off by the client); the request limits of a model whose tokens have no
known longest byte length, and a conversation the template cannot render."""

from __future__ import annotations

import asyncio
from typing import Any

from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.tokenizer import TokenizerError
from ds4mlx.server.body import MAX_BODY_BYTES, read_body
from ds4mlx.server.errors import APIError, anthropic_error_body, openai_error_body
from ds4mlx.server.generation import GenerationCall
from ds4mlx.server.limits import RequestLimits
from ds4mlx.server.sse import DONE_FRAME, KEEP_ALIVE_FRAME, data_frame, event_frame

import pytest
from starlette.requests import Request

from server.harness import ScriptedService

# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),  # a client error Anthropic has no name for
        (499, "invalid_request_error"),
        (500, "api_error"),
        (503, "api_error"),
    ],
)
def test_anthropic_errors_are_typed_by_status(status, kind):
    error = APIError(status, "went wrong", param="messages", code="some_code")
    assert anthropic_error_body(error) == {
        "type": "error",
        "error": {"type": kind, "message": "went wrong"},
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (499, "invalid_request_error"), (500, "server_error")],
)
def test_openai_errors_carry_message_type_param_and_code(status, kind):
    error = APIError(status, "went wrong", param="messages[0]", code="some_code")
    assert openai_error_body(error) == {
        "error": {
            "message": "went wrong",
            "type": kind,
            "param": "messages[0]",
            "code": "some_code",
        }
    }


def test_an_api_error_reads_as_its_message():
    error = APIError(400, "bad 'n'", param="n")
    assert str(error) == "bad 'n'" and (error.status, error.param, error.code) == (400, "n", None)


# ------------------------------------------------------------------ frames


def test_frames_are_compact_utf8_json():
    payload = {"text": "héllo ✓", "n": [1, 2]}
    assert data_frame(payload) == 'data: {"text":"héllo ✓","n":[1,2]}\n\n'.encode()
    assert event_frame("message_start", payload) == (
        'event: message_start\ndata: {"text":"héllo ✓","n":[1,2]}\n\n'.encode()
    )


def test_the_done_and_keep_alive_frames():
    assert DONE_FRAME == b"data: [DONE]\n\n"
    assert KEEP_ALIVE_FRAME == b": keep-alive\n\n"


# ------------------------------------------------------------------ bodies


def arriving(*messages: dict[str, Any], content_length: str | None = None) -> Request:
    """A request whose body arrives as ``messages`` (ASGI receive events)."""
    headers = [] if content_length is None else [(b"content-length", content_length.encode())]
    pending = list(messages)

    async def receive() -> dict[str, Any]:
        return pending.pop(0)

    return Request({"type": "http", "method": "POST", "headers": headers}, receive)


def piece(data: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.request", "body": data, "more_body": more}


def test_a_body_in_pieces_is_read_whole_up_to_the_limit():
    request = arriving(piece(b"abc"), piece(b"de"), piece(b"f", more=False))
    assert asyncio.run(read_body(request, limit=6)) == b"abcdef"
    with pytest.raises(APIError) as refused:
        asyncio.run(read_body(arriving(piece(b"abc"), piece(b"defg", more=False)), limit=6))
    assert refused.value.status == 413 and refused.value.code == "request_too_large"


def test_the_default_cap_is_64_mib():
    """By its declared length: exactly 64 MiB is read, one byte more refused unread."""
    request = arriving(piece(b"{}", more=False), content_length=str(64 * 2**20))
    assert asyncio.run(read_body(request, MAX_BODY_BYTES)) == b"{}"
    with pytest.raises(APIError) as refused:
        too_long = arriving(piece(b"{}", more=False), content_length=str(64 * 2**20 + 1))
        asyncio.run(read_body(too_long, MAX_BODY_BYTES))
    assert refused.value.message == "the request body is larger than 67108864 bytes"


def test_a_length_that_is_not_a_number_is_not_trusted():
    request = arriving(piece(b"abc", more=False), content_length="12x")
    assert asyncio.run(read_body(request, limit=6)) == b"abc"


def test_a_client_gone_while_sending_is_a_400():
    request = arriving(piece(b"ab"), {"type": "http.disconnect"})
    with pytest.raises(APIError) as refused:
        asyncio.run(read_body(request, limit=100))
    assert refused.value.status == 400
    assert refused.value.message == "the client disconnected while sending the body"


# ------------------------------------------------------------------ limits


class OpaqueTokenizer:
    """A tokenizer the server cannot bound: no longest token length is known for it."""

    vocab_size = 100


class OpaqueModel:
    tokenizer = OpaqueTokenizer()
    chat_format = None


def test_text_of_any_length_passes_when_no_token_length_is_known():
    limits = RequestLimits(ScriptedService([], model=OpaqueModel(), max_context=8))
    assert limits.bytes_per_token is None
    limits.check_text(10_000, "prompt")  # no refusal: only the tokens can tell
    with pytest.raises(APIError):
        limits.check_tokens(8, "prompt")


def test_a_prompt_reaching_the_context_is_refused_with_its_count():
    limits = RequestLimits(ScriptedService([], model=OpaqueModel(), max_context=8))
    limits.check_tokens(7, "messages")
    with pytest.raises(APIError) as refused:
        limits.check_tokens(8, "messages")
    error = refused.value
    assert (error.status, error.param, error.code) == (400, "messages", "context_length_exceeded")
    assert error.message == "the prompt has 8 tokens; the context is 8 tokens"


def test_a_logit_bias_past_the_vocabulary_names_its_range():
    service = ScriptedService([], model=OpaqueModel(), max_context=8)

    def checked(token_id: int) -> GenerationCall:
        sampling = SamplingOptions(logit_bias=((token_id, 1.0),))
        call = GenerationCall(prompt="a", max_tokens=1, sampling=sampling)
        return asyncio.run(RequestLimits(service).tokenized(call, service))

    assert checked(99).sampling.logit_bias == ((99, 1.0),)
    with pytest.raises(APIError) as refused:
        checked(100)
    assert (refused.value.status, refused.value.param) == (400, "logit_bias")
    assert refused.value.message == (
        "invalid 'logit_bias': token id 100 is outside the vocabulary (0..99)"
    )


class Unrenderable(ScriptedService):
    def __init__(self, error: Exception):
        super().__init__([])
        self.error = error

    def chat_prompt(self, *args: Any, **kwargs: Any) -> list[int]:
        raise self.error


@pytest.mark.parametrize(
    "error", [ValueError("no user turn"), TypeError("no user turn"), TokenizerError("no user turn")]
)
def test_a_conversation_the_template_refuses_is_a_400(error):
    service = Unrenderable(error)
    call = GenerationCall(
        messages=[{"role": "user", "content": "hi"}], max_tokens=4, sampling=SamplingOptions()
    )
    with pytest.raises(APIError) as refused:
        asyncio.run(RequestLimits(service).tokenized(call, service))
    assert refused.value.status == 400 and refused.value.param == "messages"
    assert refused.value.message == "the conversation cannot be rendered: no user turn"
