"""The endpoints scripts use around the generations: llama-server's ``/tokenize``,
``/detokenize``, ``/props``, ``/slots`` and ``/metrics``, and Anthropic's
``/v1/messages/count_tokens``.

Tokenizing runs on a worker thread (the tokenizer releases the GIL while it works), never on
the event loop, and a text too long for the context is refused before it is tokenized.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import ds4mlx
from ds4mlx.server.anthropic_messages import MessagesEndpoint, MessagesRequest
from ds4mlx.server.body import read_parsed
from ds4mlx.server.errors import APIError, anthropic_error_body, openai_error_body
from ds4mlx.server.generation import GenerationDefaults, GenerationService, RequestModel
from ds4mlx.server.limits import RequestLimits
from ds4mlx.server.metrics import ServerMetrics
from ds4mlx.server.queue import GenerationQueue

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response


class TokenizeRequest(RequestModel):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(RequestModel):
    tokens: list[int]


class CountTokensRequest(MessagesRequest):
    max_tokens: int = Field(1, ge=1)  # a count needs no limit


class UtilityRoutes:
    def __init__(
        self,
        service: GenerationService,
        engine: GenerationQueue,
        metrics: ServerMetrics,
        limit: RequestLimits,
        model_id: str,
        serves: Callable[[str], bool],
        defaults: GenerationDefaults,
        max_body_bytes: int,
    ):
        self.service = service
        self.serves = serves
        self.engine = engine
        self.metrics = metrics
        self.limit = limit
        self.model_id = model_id
        self.defaults = defaults
        self.max_body_bytes = max_body_bytes

    @property
    def tokenizer(self) -> Any:
        return self.service.model.tokenizer

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await read_parsed(request, TokenizeRequest, self.max_body_bytes)
            self.limit.check_text(len(body.content), "content")
            ids = await asyncio.to_thread(
                self.tokenizer.encode, body.content, body.add_special, body.parse_special
            )
        except APIError as error:
            return _openai_error(error)
        if not body.with_pieces:
            return JSONResponse({"tokens": ids})
        return JSONResponse(
            {"tokens": [{"id": token_id, "piece": self._piece(token_id)} for token_id in ids]}
        )

    def _piece(self, token_id: int) -> str | list[int]:
        """A token's text, or its bytes where they are not whole UTF-8 (as llama-server)."""
        raw = self.tokenizer.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    async def detokenize(self, request: Request) -> Response:
        try:
            body = await read_parsed(request, DetokenizeRequest, self.max_body_bytes)
            self._check_ids(body.tokens)
        except APIError as error:
            return _openai_error(error)
        return JSONResponse({"content": self.tokenizer.decode(body.tokens)})

    def _check_ids(self, ids: Sequence[int]) -> None:
        size = self.tokenizer.vocab_size
        for index, token_id in enumerate(ids):
            if token_id < 0 or (size is not None and token_id >= size):
                raise APIError(
                    400,
                    f"invalid 'tokens[{index}]': {token_id} is not a token id "
                    f"(the vocabulary has {size})",
                    param=f"tokens[{index}]",
                )

    async def count_tokens(self, request: Request) -> Response:
        try:
            body = await read_parsed(request, CountTokensRequest, self.max_body_bytes)
            if not self.serves(body.model):
                raise APIError(
                    404,
                    f"the model '{body.model}' does not exist; this server "
                    f"serves '{self.model_id}'",
                    param="model",
                    code="model_not_found",
                )
            call = MessagesEndpoint().call(body, self.defaults)
            call = await self.limit.tokenized(call, self.service)
        except APIError as error:
            return JSONResponse(anthropic_error_body(error), status_code=error.status)
        assert call.prompt_tokens is not None
        return JSONResponse({"input_tokens": len(call.prompt_tokens)})

    async def props(self, _request: Request) -> Response:
        model = self.service.model
        chat_format = model.chat_format
        path = getattr(model, "path", None)
        return JSONResponse(
            {
                "default_generation_settings": {
                    "n_ctx": self.service.max_context,
                    "params": self._generation_settings(),
                },
                "total_slots": self.engine.max_sessions,
                "model_alias": self.model_id,
                "model_path": str(path) if path is not None else None,
                "chat_template": chat_format.name if chat_format is not None else None,
                "modalities": {"vision": False, "audio": False},
                "build_info": f"ds4mlx {ds4mlx.__version__}",
            }
        )

    def _generation_settings(self) -> dict[str, Any]:
        """The defaults of requests that set nothing, under llama-server's names."""
        sampling = self.defaults.sampling
        return {
            "n_predict": self.defaults.max_tokens,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "seed": -1 if sampling.seed is None else sampling.seed,
            "repeat_penalty": sampling.repeat_penalty,
            "repeat_last_n": sampling.repeat_last_n,
            "frequency_penalty": sampling.frequency_penalty,
            "presence_penalty": sampling.presence_penalty,
            "enable_thinking": self.defaults.thinking,
        }

    async def slots(self, request: Request) -> Response:
        stats = self.engine.stats()
        slots = [
            {"id": index, "n_ctx": self.service.max_context, "is_processing": index < stats.running}
            for index in range(self.engine.max_sessions)
        ]
        if request.query_params.get("fail_on_no_slot") in ("1", "true") and all(
            slot["is_processing"] for slot in slots
        ):
            return _openai_error(APIError(503, "no slot is free"))
        return JSONResponse(slots)

    async def prometheus(self, _request: Request) -> Response:
        text = self.metrics.prometheus(self.engine.stats(), self.engine.max_sessions)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def _openai_error(error: APIError) -> JSONResponse:
    return JSONResponse(openai_error_body(error), status_code=error.status)
