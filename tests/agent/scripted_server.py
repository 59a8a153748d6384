"""A scripted OpenAI-compatible server for the agent's tests: each POST to
``/v1/chat/completions`` is answered with the next scripted list of chunks, streamed as
server-sent events, so that tests (and ``ds4-agent --api-base`` run as a separate process)
can make the model say and call exactly what they need."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chunk(delta: dict, finish: str | None = None) -> dict:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE = {
    "id": "c",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "m",
    "choices": [],
    "usage": {
        "prompt_tokens": 42,
        "completion_tokens": 7,
        "total_tokens": 49,
        "prompt_tokens_details": {"cached_tokens": 40},
    },
}


def tool_call_chunks(arguments: list[str], name: str = "read") -> list[dict]:
    first = {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
        ]
    }
    pieces = [{"tool_calls": [{"index": 0, "function": {"arguments": part}}]} for part in arguments]
    return [chunk(first), *map(chunk, pieces), chunk({}, "tool_calls"), USAGE]


class Server:
    """Answers each POST with the next scripted list of chunks, as server-sent events."""

    def __init__(
        self,
        responses: list[list[dict]],
        models: dict | None = None,
        stall: threading.Event | None = None,
    ):
        self.responses = list(responses)
        self.requests: list[dict] = []
        self.models = models  # what GET /v1/models/<name> answers (404 when None)
        self.stall = stall  # when given, a chat request hangs until it is set
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                length = int(self.headers["Content-Length"])
                server.requests.append(json.loads(self.rfile.read(length)))
                if server.stall is not None:
                    server.stall.wait(60)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                # Past the script, every turn answers "done".
                turn = server.responses.pop(0) if server.responses else text_chunks("done")
                for item in turn:
                    self.wfile.write(f"data: {json.dumps(item)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def do_GET(self):  # noqa: N802
                if server.models is None or not self.path.startswith("/v1/models"):
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps(server.models).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def text_chunks(text: str) -> list[dict]:
    """A turn that answers ``text``."""
    return [chunk({"role": "assistant", "content": text}), chunk({}, "stop"), USAGE]
