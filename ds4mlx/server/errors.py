"""API errors and their two wire shapes: OpenAI's and Anthropic's."""

from __future__ import annotations

from typing import Any

# Anthropic names its error types by status; OpenAI uses one type for every client error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
}


class APIError(Exception):
    """A request the server answers with an error status instead of a generation."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def is_server_fault(self) -> bool:
        return self.status >= 500


def openai_error_body(error: APIError) -> dict[str, Any]:
    error_type = "server_error" if error.is_server_fault else "invalid_request_error"
    return {
        "error": {
            "message": error.message,
            "type": error_type,
            "param": error.param,
            "code": error.code,
        }
    }


def anthropic_error_body(error: APIError) -> dict[str, Any]:
    error_type = (
        "api_error"
        if error.is_server_fault
        else _ANTHROPIC_TYPES.get(error.status, "invalid_request_error")
    )
    return {"type": "error", "error": {"type": error_type, "message": error.message}}
