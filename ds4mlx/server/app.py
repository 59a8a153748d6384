"""The ASGI application: routes, body limits, error shapes, streaming and queueing.

Each generation endpoint reads its body (refusing it past the size cap while it arrives),
validates it, turns it into a :class:`GenerationCall` and queues that on the engine worker.
A streamed request commits to a 200 once the first event or keep-alive tick arrives, so a
request the service refuses at once (a prompt over the context) still gets a proper 4xx; after
that, errors travel in the stream in the API's own shape. The response's end, however it comes
(done, failed, client gone), cancels the job so that the engine moves on to the next request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from ds4mlx.engine.chat import ChatEvent
from ds4mlx.server.anthropic_messages import MessagesEndpoint
from ds4mlx.server.endpoint import Endpoint, StreamEncoder
from ds4mlx.server.errors import APIError, anthropic_error_body, openai_error_body
from ds4mlx.server.generation import (
    APIRequest,
    GenerationDefaults,
    GenerationService,
    parse_request,
)
from ds4mlx.server.openai_chat import ChatCompletionsEndpoint
from ds4mlx.server.openai_completions import CompletionsEndpoint
from ds4mlx.server.openai_responses import ResponsesEndpoint
from ds4mlx.server.queue import GenerationQueue, Job, KeepAlive
from ds4mlx.server.sse import KEEP_ALIVE_FRAME
from ds4mlx.server.turn import ResponseMeta
from ds4mlx.speculation import SpeculativeStats
from ds4mlx.speculation.service import Finished

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

log = logging.getLogger("ds4mlx.server")

MAX_BODY_BYTES = 64 * 2**20
# The name a client may use without knowing the served one (ds4-agent's default --api-model).
ANY_MODEL = "default"
ENDPOINTS: tuple[Endpoint[Any], ...] = (ChatCompletionsEndpoint(), CompletionsEndpoint(),
                                        ResponsesEndpoint(), MessagesEndpoint())
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class ServerConfig:
    model_id: str  # the name /v1/models lists and requests must use (or one of ``aliases``)
    defaults: GenerationDefaults
    aliases: tuple[str, ...] = ()
    max_body_bytes: int = MAX_BODY_BYTES
    keepalive_seconds: float = 5.0
    cors: bool = False

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.model_id, *self.aliases)

    def serves(self, name: str) -> bool:
        return name in self.model_names or name == ANY_MODEL


class _JobStreamingResponse(StreamingResponse):
    """An SSE response that cancels its job however it ends, including the client leaving
    (Starlette cancels the body while the client is gone)."""

    def __init__(self, job: Job, content: AsyncIterator[bytes]):
        super().__init__(content, media_type="text/event-stream", headers=_SSE_HEADERS)
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Cancel ``job`` as soon as the client of a non-streamed request leaves. The body has been
    read, so the next ASGI message can only be the disconnect; waiting for it (rather than
    polling between events) notices a client that gives up while tokens flow steadily."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with a 413 as soon as it is known to pass ``limit`` bytes: from
    Content-Length before reading anything, or while a body of undeclared length arrives."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _too_large(limit)
    except ClientDisconnect:
        raise APIError(400, "the client disconnected while sending the body") from None
    return bytes(body)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes",
                    code="request_too_large")


def _error_response(error: APIError, endpoint: Endpoint[Any]) -> JSONResponse:
    return JSONResponse(endpoint.error_body(error), status_code=error.status)


class _Server:
    def __init__(self, service: GenerationService, config: ServerConfig,
                 engine: GenerationQueue):
        self.service = service
        self.config = config
        self.engine = engine
        self.started = int(time.time())

    # ------------------------------------------------------------------ plain routes

    def _model_json(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.started, "owned_by": "ds4mlx"}

    async def list_models(self, _request: Request) -> JSONResponse:
        return JSONResponse({"object": "list",
                             "data": [self._model_json(n) for n in self.config.model_names]})

    async def get_model(self, request: Request) -> JSONResponse:
        name = request.path_params["name"]
        if not self.config.serves(name):
            error = self._unknown_model(name)
            return JSONResponse(openai_error_body(error), status_code=error.status)
        return JSONResponse(self._model_json(name))

    async def stats(self, _request: Request) -> JSONResponse:
        return JSONResponse(asdict(self.engine.stats()))

    async def health(self, _request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    def _unknown_model(self, name: str) -> APIError:
        served = ", ".join(f"'{n}'" for n in self.config.model_names)
        return APIError(404, f"the model '{name}' does not exist; this server serves {served}",
                        param="model", code="model_not_found")

    # ------------------------------------------------------------------ generations

    def route(self, endpoint: Endpoint[Any]) -> Route:
        async def handle(request: Request) -> Response:
            return await self.generate(request, endpoint)

        return Route(endpoint.path, handle, methods=["POST"])

    async def generate(self, request: Request, endpoint: Endpoint[Any]) -> Response:
        try:
            body = await read_body(request, self.config.max_body_bytes)
            parsed: APIRequest = parse_request(endpoint.request_model, body)
            if not self.config.serves(parsed.model):
                raise self._unknown_model(parsed.model)
            try:
                call = endpoint.call(parsed, self.config.defaults)
            except ValueError as exc:  # options the engine refuses, e.g. sampling ranges
                raise APIError(400, str(exc)) from None
            job = self.engine.submit(partial(call.run, self.service))
        except APIError as error:
            return _error_response(error, endpoint)
        meta = ResponseMeta(self.config.model_id)
        events = job.events(self.config.keepalive_seconds)
        if parsed.stream:
            return await self._stream(job, events, endpoint.stream(parsed, meta), endpoint)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            return await self._respond(events, endpoint, parsed, meta)
        finally:
            watcher.cancel()
            job.cancel()

    async def _respond(self, events: AsyncIterator[ChatEvent | Finished | KeepAlive],
                       endpoint: Endpoint[Any], parsed: APIRequest,
                       meta: ResponseMeta) -> Response:
        collected: list[ChatEvent] = []
        finished: Finished | None = None
        try:
            async for item in events:
                if isinstance(item, KeepAlive):
                    continue
                if isinstance(item, Finished):
                    finished = item
                else:
                    collected.append(item)
        except APIError as error:
            return _error_response(error, endpoint)
        if finished is None:
            return _error_response(APIError(503, "the generation was cancelled"), endpoint)
        _log_finished(endpoint.path, finished)
        return JSONResponse(endpoint.response(parsed, collected, finished, meta))

    async def _stream(self, job: Job, events: AsyncIterator[ChatEvent | Finished | KeepAlive],
                      encoder: StreamEncoder, endpoint: Endpoint[Any]) -> Response:
        try:
            first = await anext(events)
        except APIError as error:
            job.cancel()
            return _error_response(error, endpoint)
        except StopAsyncIteration:
            return _error_response(APIError(503, "the generation was cancelled"), endpoint)
        return _JobStreamingResponse(job, _sse_body(first, events, encoder, endpoint.path))


async def _sse_body(first: ChatEvent | Finished | KeepAlive,
                    events: AsyncIterator[ChatEvent | Finished | KeepAlive],
                    encoder: StreamEncoder, path: str) -> AsyncIterator[bytes]:
    def frames(item: ChatEvent | Finished | KeepAlive) -> bytes:
        if isinstance(item, KeepAlive):
            return KEEP_ALIVE_FRAME
        if isinstance(item, Finished):
            _log_finished(path, item)
            return b"".join(encoder.finish(item))
        return b"".join(encoder.event(item))

    yield b"".join(encoder.start())
    try:
        yield frames(first)
        async for item in events:
            yield frames(item)
    except APIError as error:
        yield b"".join(encoder.error(error))


def _log_finished(path: str, finished: Finished) -> None:
    log.info("%s: prompt %d tokens (%d cached), generated %d, %s, %.2fs", path,
             finished.prompt_tokens, finished.cached_tokens, finished.completion_tokens,
             finished.finish_reason, finished.seconds)
    stats = finished.stats
    if isinstance(stats, SpeculativeStats) and stats.drafted_tokens:
        log.info("%s: speculation: %d drafted, %d accepted (%.0f%%), tau %.2f", path,
                 stats.drafted_tokens, stats.accepted_tokens, 100 * stats.acceptance_rate,
                 stats.tau)


def _http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Unknown paths and wrong methods, in the error shape of the API the path belongs to."""
    assert isinstance(exc, HTTPException)
    error = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
    body = (anthropic_error_body(error) if request.url.path.startswith("/v1/messages")
            else openai_error_body(error))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def _internal_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return JSONResponse(openai_error_body(APIError(500, "internal server error")),
                        status_code=500)


def create_app(service: GenerationService, config: ServerConfig,
               engine: GenerationQueue) -> Starlette:
    """The server's ASGI app. ``engine`` runs the generations: the thread the model was loaded
    on, which the caller starts and closes."""
    server = _Server(service, config, engine)
    routes = [
        Route("/v1/models", server.list_models, methods=["GET"]),
        Route("/v1/models/{name:path}", server.get_model, methods=["GET"]),
        Route("/stats", server.stats, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        *(server.route(endpoint) for endpoint in ENDPOINTS),
    ]
    middleware = ([Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"],
                              allow_headers=["*"])] if config.cors else [])
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={HTTPException: _http_error_handler,
                                         Exception: _internal_error_handler})
