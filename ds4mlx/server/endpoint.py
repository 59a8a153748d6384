"""The shape every API module (chat completions, completions, responses, messages) fills in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ds4mlx.generation import ChatEvent, Finished
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import APIRequest, GenerationCall, GenerationDefaults
from ds4mlx.server.turn import ResponseMeta


class StreamEncoder(Protocol):
    """Turns one request's events into that API's SSE frames."""

    def start(self) -> list[bytes]:
        """Frames sent as soon as the stream opens."""
        ...

    def event(self, event: ChatEvent) -> list[bytes]: ...

    def finish(self, finished: Finished) -> list[bytes]: ...

    def error(self, error: APIError) -> list[bytes]: ...


Request = TypeVar("Request", bound=APIRequest)


class Endpoint(Protocol[Request]):
    path: str
    request_model: type[Request]
    error_body: Callable[[APIError], dict[str, Any]]  # the API's error object

    def call(self, request: Request, defaults: GenerationDefaults) -> GenerationCall:
        """The generation the request asks for; raises APIError for what cannot be served."""
        ...

    def response(
        self, request: Request, events: Sequence[ChatEvent], finished: Finished, meta: ResponseMeta
    ) -> dict[str, Any]: ...

    def stream(self, request: Request, meta: ResponseMeta) -> StreamEncoder: ...
