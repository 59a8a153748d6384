"""The ASGI application: routes, body limits, error shapes, streaming and queueing.

Each generation endpoint reads its body (refusing it past the size cap while it arrives),
validates it, turns it into a :class:`GenerationCall`, refuses a prompt surely longer than the
context by its length alone, tokenizes it on a worker thread (never on the event loop), checks
its token count, and queues it on the engine worker; requests are queued, and run, in the order
they arrived.
A streamed request commits to a 200 once the first event or keep-alive tick arrives, so a
request the service refuses at once (a prompt over the context) still gets a proper 4xx; after
that, errors travel in the stream in the API's own shape. The response's end, however it comes
(done, failed, client gone), cancels the job so that the engine moves on to the next request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from ds4mlx.generation import ChatEvent, Finished, ToolCallError
from ds4mlx.server.access import AccessControl, error_body_for
from ds4mlx.server.anthropic_messages import MessagesEndpoint
from ds4mlx.server.body import MAX_BODY_BYTES, read_body
from ds4mlx.server.choices import choice_calls, merged
from ds4mlx.server.endpoint import Endpoint, StreamEncoder
from ds4mlx.server.errors import APIError, openai_error_body
from ds4mlx.server.generation import (
    APIRequest,
    GenerationDefaults,
    GenerationService,
    parse_request,
)
from ds4mlx.server.limits import RequestLimits
from ds4mlx.server.metrics import ServerMetrics
from ds4mlx.server.openai_chat import ChatCompletionsEndpoint
from ds4mlx.server.openai_completions import CompletionsEndpoint
from ds4mlx.server.openai_responses import ResponsesEndpoint
from ds4mlx.server.queue import GenerationQueue, Job, KeepAlive
from ds4mlx.server.sse import KEEP_ALIVE_FRAME
from ds4mlx.server.turn import ResponseMeta
from ds4mlx.server.utility_routes import UtilityRoutes

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

log = logging.getLogger("ds4mlx.server")

# The name a client may use without knowing the served one (ds4-agent's default --api-model).
ANY_MODEL = "default"
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class ServerConfig:
    model_id: str  # the name /v1/models lists and requests must use (or one of ``aliases``)
    defaults: GenerationDefaults
    aliases: tuple[str, ...] = ()
    max_body_bytes: int = MAX_BODY_BYTES
    keepalive_seconds: float = 5.0
    cors: bool = False  # allow browser pages from any origin
    api_keys: tuple[str, ...] = ()  # when set, every request but /health must bring one
    # ``--verbose``: a line of engine details (the routed-expert cache's counters) logged after
    # each finished request, read on the engine's side so the server needs no model internals.
    details: Callable[[], str | None] | None = None

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.model_id, *self.aliases)

    def serves(self, name: str) -> bool:
        return name in self.model_names or name == ANY_MODEL


class _JobStreamingResponse(StreamingResponse):
    """An SSE response that cancels its jobs (one per choice) however it ends, including the
    client leaving (Starlette cancels the body while the client is gone)."""

    def __init__(self, jobs: Sequence[Job], content: AsyncIterator[bytes]):
        super().__init__(content, media_type="text/event-stream", headers=_SSE_HEADERS)
        self.jobs = jobs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for job in self.jobs:
                job.cancel()


async def _cancel_on_disconnect(request: Request, *jobs: Job) -> None:
    """Cancel ``jobs`` (a request's, one per choice) as soon as the client of a non-streamed
    request leaves. The body has been read, so the next ASGI message can only be the
    disconnect; waiting for it (rather than polling between events) notices a client that
    gives up while tokens flow steadily."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for job in jobs:
        job.cancel()


def _error_response(error: APIError, endpoint: Endpoint[Any]) -> JSONResponse:
    return JSONResponse(endpoint.error_body(error), status_code=error.status)


class _Server:
    def __init__(self, service: GenerationService, config: ServerConfig, engine: GenerationQueue):
        self.service = service
        self.config = config
        self.engine = engine
        self.started = int(time.time())
        self.metrics = ServerMetrics()
        self.limit = RequestLimits(service)
        self.responses = ResponsesEndpoint()
        self.endpoints: tuple[Endpoint[Any], ...] = (
            ChatCompletionsEndpoint(),
            CompletionsEndpoint(),
            self.responses,
            MessagesEndpoint(),
        )
        # Requests are tokenized and queued one at a time, in the order they arrived (an
        # asyncio lock wakes its waiters first come, first served), so a long prompt being
        # tokenized is not overtaken by a short one that came after it.
        self._admission = asyncio.Lock()

    # ------------------------------------------------------------------ plain routes

    def _model_json(self, name: str) -> dict[str, Any]:
        # context_length as vLLM's max_model_len and LM Studio report it: clients (ds4-agent
        # with --api-base) size their context from it.
        return {
            "id": name,
            "object": "model",
            "created": self.started,
            "owned_by": "ds4mlx",
            "context_length": self.service.max_context,
        }

    async def list_models(self, _request: Request) -> JSONResponse:
        return JSONResponse(
            {"object": "list", "data": [self._model_json(n) for n in self.config.model_names]}
        )

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
        return APIError(
            404,
            f"the model '{name}' does not exist; this server serves {served}",
            param="model",
            code="model_not_found",
        )

    # ------------------------------------------------------------------ generations

    def routes(self, endpoint: Endpoint[Any]) -> list[Route]:
        """The endpoint's path, and without ``/v1`` where llama-server and mlx_lm.server also
        serve it so."""

        async def handle(request: Request) -> Response:
            return await self.generate(request, endpoint)

        paths = [endpoint.path]
        if endpoint.path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
            paths.append(endpoint.path.removeprefix("/v1"))
        return [Route(path, handle, methods=["POST"]) for path in paths]

    async def get_response(self, request: Request) -> JSONResponse:
        response_id = request.path_params["response_id"]
        stored = self.responses.store.response(response_id)
        if stored is None:
            return self._no_stored_response(response_id)
        if request.method == "DELETE":
            self.responses.store.delete(response_id)
            return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
        return JSONResponse(stored)

    @staticmethod
    def _no_stored_response(response_id: str) -> JSONResponse:
        error = APIError(
            404, f"no stored response '{response_id}'", param="response_id", code="not_found"
        )
        return JSONResponse(openai_error_body(error), status_code=404)

    async def generate(self, request: Request, endpoint: Endpoint[Any]) -> Response:
        arrived = time.perf_counter()
        try:
            body = await read_body(request, self.config.max_body_bytes)
            parsed: APIRequest = parse_request(endpoint.request_model, body)
            del body  # a large body's memory goes back before the prompt is tokenized
            if not self.config.serves(parsed.model):
                raise self._unknown_model(parsed.model)
            try:
                call = endpoint.call(parsed, self.config.defaults)
            except ValueError as exc:  # options the engine refuses, e.g. sampling ranges
                raise APIError(400, str(exc)) from None
            async with self._admission:
                call = await self.limit.tokenized(call, self.service)
                # One job per choice (n > 1: server.choices), queued in order.
                jobs = [
                    self.engine.submit(
                        partial(c.run, self.service), on_cancelled=self.metrics.finished
                    )
                    for c in choice_calls(call)
                ]
        except APIError as error:
            self.metrics.refuse()
            return _error_response(error, endpoint)
        meta = ResponseMeta(self.config.model_id, prompt_tokens=len(call.prompt_tokens or ()))
        streams = [
            self._measured(job.events(self.config.keepalive_seconds), arrived, endpoint.path)
            for job in jobs
        ]
        events = streams[0] if len(streams) == 1 else merged(streams)
        if parsed.stream:
            return await self._stream(jobs, events, endpoint.stream(parsed, meta), endpoint)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, *jobs))
        try:
            return await self._respond(events, endpoint, parsed, meta)
        finally:
            watcher.cancel()
            for job in jobs:
                job.cancel()

    async def _respond(
        self,
        events: AsyncIterator[ChatEvent | Finished | KeepAlive],
        endpoint: Endpoint[Any],
        parsed: APIRequest,
        meta: ResponseMeta,
    ) -> Response:
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
        return JSONResponse(endpoint.response(parsed, collected, finished, meta))

    async def _measured(
        self, events: AsyncIterator[ChatEvent | Finished | KeepAlive], arrived: float, path: str
    ) -> AsyncIterator[ChatEvent | Finished | KeepAlive]:
        """The job's events less cut-off tool calls (dropped: their markup is not text), with
        the time to first output and the finished request counted."""
        first_output: float | None = None
        async for item in events:
            if isinstance(item, ToolCallError) and item.unterminated:
                log.warning(
                    "%s: dropped a tool call the output ended inside: %r", path, item.raw[:200]
                )
                continue
            if first_output is None and not isinstance(item, KeepAlive):
                first_output = time.perf_counter() - arrived
                self.metrics.first_token(first_output)
            if isinstance(item, Finished):
                self.metrics.finished(item)
                _log_finished(path, item, first_output or 0.0)
                if self.config.details is not None and (line := self.config.details()):
                    log.info("%s: %s", path, line)
            yield item

    async def _stream(
        self,
        jobs: Sequence[Job],
        events: AsyncIterator[ChatEvent | Finished | KeepAlive],
        encoder: StreamEncoder,
        endpoint: Endpoint[Any],
    ) -> Response:
        try:
            first = await anext(events)
        except APIError as error:
            for job in jobs:
                job.cancel()
            return _error_response(error, endpoint)
        except StopAsyncIteration:
            return _error_response(APIError(503, "the generation was cancelled"), endpoint)
        return _JobStreamingResponse(jobs, _sse_body(first, events, encoder))


async def _sse_body(
    first: ChatEvent | Finished | KeepAlive,
    events: AsyncIterator[ChatEvent | Finished | KeepAlive],
    encoder: StreamEncoder,
) -> AsyncIterator[bytes]:
    def frames(item: ChatEvent | Finished | KeepAlive) -> bytes:
        if isinstance(item, KeepAlive):
            return KEEP_ALIVE_FRAME
        if isinstance(item, Finished):
            return b"".join(encoder.finish(item))
        return b"".join(encoder.event(item))

    yield b"".join(encoder.start())
    try:
        yield frames(first)
        async for item in events:
            yield frames(item)
    except APIError as error:
        yield b"".join(encoder.error(error))


def _log_finished(path: str, finished: Finished, first_output: float) -> None:
    log.info(
        "%s: prompt %d tokens (%d cached), generated %d, %s, %.2fs; first output %.2fs "
        "after arrival",
        path,
        finished.prompt_tokens,
        finished.cached_tokens,
        finished.completion_tokens,
        finished.finish_reason,
        finished.seconds,
        first_output,
    )
    acceptance = finished.acceptance
    if acceptance is not None and acceptance.drafted_tokens:
        log.info(
            "%s: speculation: %d drafted, %d accepted (%.0f%%), tau %.2f",
            path,
            acceptance.drafted_tokens,
            acceptance.accepted_tokens,
            100 * acceptance.acceptance_rate,
            acceptance.tau,
        )


def _http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Unknown paths and wrong methods, in the error shape of the API the path belongs to."""
    assert isinstance(exc, HTTPException)
    error = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
    return JSONResponse(
        error_body_for(request.url.path, error), status_code=exc.status_code, headers=exc.headers
    )


def _internal_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return JSONResponse(openai_error_body(APIError(500, "internal server error")), status_code=500)


def create_app(
    service: GenerationService, config: ServerConfig, engine: GenerationQueue
) -> Starlette:
    """The server's ASGI app. ``engine`` runs the generations: the thread the model was loaded
    on, which the caller starts and closes."""
    server = _Server(service, config, engine)
    utility = UtilityRoutes(
        service,
        engine,
        server.metrics,
        server.limit,
        config.model_id,
        config.serves,
        config.defaults,
        config.max_body_bytes,
    )
    routes = [
        Route("/v1/models", server.list_models, methods=["GET"]),
        Route("/v1/models/{name:path}", server.get_model, methods=["GET"]),
        Route("/stats", server.stats, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/health", server.health, methods=["GET"]),
        Route("/v1/messages/count_tokens", utility.count_tokens, methods=["POST"]),
        Route("/v1/responses/{response_id}", server.get_response, methods=["GET", "DELETE"]),
        Route("/tokenize", utility.tokenize, methods=["POST"]),
        Route("/detokenize", utility.detokenize, methods=["POST"]),
        Route("/props", utility.props, methods=["GET"]),
        Route("/slots", utility.slots, methods=["GET"]),
        Route("/metrics", utility.prometheus, methods=["GET"]),
        *(route for endpoint in server.endpoints for route in server.routes(endpoint)),
    ]
    # CORS outermost: it answers preflights and labels every response, refusals included.
    middleware = [Middleware(AccessControl, api_keys=config.api_keys, cross_origin=config.cors)]
    if config.cors:
        middleware.insert(
            0,
            Middleware(
                CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"]
            ),
        )
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: _http_error_handler, Exception: _internal_error_handler},
    )
