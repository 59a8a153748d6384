"""Who may call the server: API keys, and browsers from other origins.

With API keys (``--api-key``) every request but the health check must carry one, as OpenAI's
clients send it (``Authorization: Bearer KEY``) or Anthropic's (``x-api-key: KEY``).

A browser page from any site can POST to a server on localhost: a "simple" request (a
``text/plain`` body, no custom headers) is sent without a CORS preflight, so refusing only the
preflight would still let the page start a generation. Without ``--cors`` a request whose
``Origin`` is not the server's own is refused before it runs; clients that are not browsers send
no ``Origin`` and are not affected.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from ds4mlx.server.errors import APIError, anthropic_error_body, openai_error_body

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

# Paths anyone may call: load balancers and supervisors probe these without credentials.
OPEN_PATHS = frozenset({"/health", "/v1/health"})


def error_body_for(path: str, error: APIError) -> dict[str, Any]:
    """``error`` in the shape of the API that ``path`` belongs to."""
    if path.startswith("/v1/messages"):
        return anthropic_error_body(error)
    return openai_error_body(error)


class AccessControl:
    """ASGI middleware: refuses requests without a valid API key (when keys are set) and, unless
    ``cross_origin`` is allowed, requests from another origin."""

    def __init__(self, app: ASGIApp, api_keys: Sequence[str] = (), cross_origin: bool = False):
        self.app = app
        self.api_keys = [key.encode() for key in api_keys]
        self.cross_origin = cross_origin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._refusal(scope)
            if error is not None:
                response = JSONResponse(
                    error_body_for(scope["path"], error),
                    status_code=error.status,
                    headers={"WWW-Authenticate": "Bearer"} if error.status == 401 else None,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> APIError | None:
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is not None and not self.cross_origin and not _same_origin(origin, headers):
            return APIError(
                403,
                f"requests from the web origin '{origin}' are refused; start "
                "ds4-server with --cors to let browser pages call it",
                code="cross_origin_refused",
            )
        # No exception for OPTIONS: with --cors, CORSMiddleware (outermost) answers every
        # browser preflight before this check; without it, a preflight's origin is refused.
        if not self.api_keys or scope["path"] in OPEN_PATHS:
            return None
        given = _presented_key(headers)
        if given is None:
            return APIError(
                401,
                "this server needs an API key: send 'Authorization: Bearer "
                "KEY' or 'x-api-key: KEY'",
                code="invalid_api_key",
            )
        if not any(secrets.compare_digest(given.encode(), key) for key in self.api_keys):
            return APIError(401, "the API key is not valid for this server", code="invalid_api_key")
        return None


def _presented_key(headers: Headers) -> str | None:
    authorization = headers.get("authorization")
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return headers.get("x-api-key")


def _same_origin(origin: str, headers: Headers) -> bool:
    """Whether ``origin`` is the server's own (a page it served itself)."""
    host = headers.get("host")
    return host is not None and urlsplit(origin).netloc.lower() == host.lower()
