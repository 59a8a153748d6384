"""Running the real server in process (uvicorn on a free loopback port, in a thread) and the
services tests put behind it: the chat model, slowed down, or scripted."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ds4mlx.engine.chat import DEEPSEEK_V4
from ds4mlx.engine.tokenizer import NumericTokenizer
from ds4mlx.generation import ChatService, GenerationCancelled, ServiceEvent
from ds4mlx.server import GenerationDefaults, GenerationQueue, ServerConfig, create_app
from ds4mlx.server.generation import GenerationService, ServedModel

import httpx
import uvicorn

MODEL_ID = "chat-model"
TIMEOUT = 30.0  # seconds: the bound on every network wait in these tests
DEFAULT_CONFIG = ServerConfig(
    model_id=MODEL_ID, defaults=GenerationDefaults(max_tokens=16), keepalive_seconds=0.2
)


@contextmanager
def serve(
    service: GenerationService, engine: GenerationQueue, config: ServerConfig = DEFAULT_CONFIG
) -> Iterator[str]:
    """Run the server until the block ends; yields its base URL. ``engine`` is the thread the
    service's model was loaded on."""
    app = create_app(service, config, engine)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the server did not stop"


@contextmanager
def serve_sessions(service: ChatService, engine: GenerationQueue) -> Iterator[str]:
    """``serve`` with the engine thread admitting as many requests at once as ``service`` has
    sessions (the engine outlives the test's server: it admits one again afterwards)."""
    engine.max_sessions = service.sessions
    try:
        with serve(service, engine) as url:
            yield url
    finally:
        engine.max_sessions = 1


def stats(base_url: str) -> dict[str, int]:
    return httpx.get(f"{base_url}/stats", timeout=TIMEOUT).json()


def wait_for_stats(base_url: str, since: dict[str, int], **expected: int) -> None:
    """Wait until the engine's counters have grown by ``expected`` since the ``since`` stats
    (the engine outlives each test's server) and its ``queued`` and ``running`` levels equal
    ``expected``."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        current = stats(base_url)
        seen = {
            key: current[key] - (0 if key in ("queued", "running") else since[key])
            for key in expected
        }
        if seen == expected:
            return
        assert time.monotonic() < deadline, f"saw {seen}, expected {expected}"
        time.sleep(0.02)


class DelayedService:
    """A service whose generations wait before their first event (a slow prefill) and between
    events (slow decoding): the delay hook for keep-alive and disconnect tests."""

    def __init__(
        self, inner: GenerationService, first_event_delay: float = 0.0, event_delay: float = 0.0
    ):
        self.inner = inner
        self.first_event_delay = first_event_delay
        self.event_delay = event_delay
        self.model = inner.model
        self.max_context = inner.max_context

    def chat_prompt(self, *args: Any, **kwargs: Any) -> list[int]:
        return self.inner.chat_prompt(*args, **kwargs)

    def chat(self, *args: Any, **kwargs: Any) -> Generator[ServiceEvent, None, None]:
        return self._delayed(self.inner.chat(*args, **kwargs))

    def complete(self, *args: Any, **kwargs: Any) -> Generator[ServiceEvent, None, None]:
        return self._delayed(self.inner.complete(*args, **kwargs))

    def _delayed(
        self, events: Generator[ServiceEvent, None, None]
    ) -> Generator[ServiceEvent, None, None]:
        time.sleep(self.first_event_delay)
        try:
            for event in events:
                try:
                    yield event
                except GenerationCancelled as stop:
                    # The engine stops a generation whose client left this way, and counts
                    # what it had generated from the Finished it answers with.
                    yield events.throw(stop)
                    return
                time.sleep(self.event_delay)
        finally:
            events.close()


class _ScriptedModel:
    """Stands in for a model: the DeepSeek-V4 template over the numeric test tokenizer."""

    tokenizer = NumericTokenizer(4096)
    chat_format = DEEPSEEK_V4


_SCRIPTED_MODEL = _ScriptedModel()


class ScriptedService:
    """Answers request k with ``scripts[k]`` (the last script once they run out): how tests get
    tool calls and reasoning out of a server whose model cannot write them. Records what each
    request asked for."""

    def __init__(
        self,
        *scripts: list[ServiceEvent],
        model: ServedModel = _SCRIPTED_MODEL,
        max_context: int = 4096,
    ):
        self.scripts = scripts
        self.requests: list[dict[str, Any]] = []
        self.model = model
        self.max_context = max_context

    def chat_prompt(
        self,
        messages: Any,
        tools: Any = None,
        *,
        thinking: bool = False,
        reasoning_effort: str | None = None,
        tool_choice: Any = "auto",
    ) -> list[int]:
        return self.model.chat_format.tokenize(
            self.model.tokenizer, messages, tools, thinking=thinking, tool_choice=tool_choice
        )

    def chat(
        self, messages: Any, tools: Any = None, **options: Any
    ) -> Generator[ServiceEvent, None, None]:
        return self._answer({"messages": messages, "tools": tools, **options})

    def complete(self, prompt: str, **options: Any) -> Generator[ServiceEvent, None, None]:
        return self._answer({"prompt": prompt, **options})

    def _answer(self, request: dict[str, Any]) -> Generator[ServiceEvent, None, None]:
        self.requests.append(request)
        yield from self.scripts[min(len(self.requests), len(self.scripts)) - 1]


class FailingService(ScriptedService):
    """Every generation yields ``first`` (none: it fails before any output, as a refused prompt
    or a broken model does), then raises ``error``."""

    def __init__(self, error: Exception, first: list[ServiceEvent] | None = None):
        super().__init__()
        self.error, self.first = error, first or []

    def _answer(self, request: dict[str, Any]) -> Generator[ServiceEvent, None, None]:
        self.requests.append(request)
        yield from self.first
        raise self.error


def config_with(**changes: Any) -> ServerConfig:
    return replace(DEFAULT_CONFIG, **changes)


def encoded_stream(stream: Any, *events: Any) -> list[bytes]:
    """The frames an endpoint's stream encoder sends for ``events``, the last a ``Finished``."""
    frames = list(stream.start())
    for event in events[:-1]:
        frames += stream.event(event)
    return frames + list(stream.finish(events[-1]))


def named_events(frames: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    """Each named SSE frame (Responses and Anthropic streams) as (event name, payload)."""
    parsed = []
    for frame in frames:
        name_line, data_line = frame.decode().removesuffix("\n\n").split("\n")
        parsed.append(
            (name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: ")))
        )
    return parsed
