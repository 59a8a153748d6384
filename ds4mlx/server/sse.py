"""Server-sent event frames."""

from __future__ import annotations

import json
from typing import Any

# A comment line: every SSE client ignores it, and it keeps proxies and client idle timeouts
# from closing the connection while a request waits in the queue or prefills.
KEEP_ALIVE_FRAME = b": keep-alive\n\n"
DONE_FRAME = b"data: [DONE]\n\n"


def data_frame(payload: Any) -> bytes:
    """An unnamed event (OpenAI chat and completions streams)."""
    return f"data: {_json(payload)}\n\n".encode()


def event_frame(name: str, payload: Any) -> bytes:
    """A named event (Responses and Anthropic streams)."""
    return f"event: {name}\ndata: {_json(payload)}\n\n".encode()


def _json(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
