"""Reading request bodies: refused past the size cap while they arrive, then validated."""

from __future__ import annotations

from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import Model, parse_request

from starlette.requests import ClientDisconnect, Request

MAX_BODY_BYTES = 64 * 2**20


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


async def read_parsed(request: Request, model: type[Model], limit: int = MAX_BODY_BYTES) -> Model:
    """The body read and validated as ``model``."""
    return parse_request(model, await read_body(request, limit))


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
