"""Fixtures: the random-weight chat model, its service, and a shared server over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ds4mlx
from ds4mlx.generation import ChatService
from ds4mlx.server import GenerationQueue

import pytest

from server.harness import serve

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"


@pytest.fixture(scope="session")
def engine() -> Iterator[GenerationQueue]:
    """The engine thread every test server shares: MLX arrays belong to the thread that
    made them, so the model is loaded, and every generation runs, on this one."""
    engine = GenerationQueue()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def chat_model(chat_model_path, engine):
    return engine.run(lambda: ds4mlx.load_model(chat_model_path))


@pytest.fixture(scope="session")
def service(chat_model) -> ChatService:
    return ChatService(chat_model, max_context=1024)


@pytest.fixture(scope="session")
def tiny_service(engine) -> ChatService:
    """The trained tiny model: it answers questions with DSML tool calls, offered or not."""
    if not TINY_MODEL.is_file():
        pytest.skip(f"{TINY_MODEL} is not built")
    return ChatService(engine.run(lambda: ds4mlx.load_model(TINY_MODEL)), max_context=1024)


@pytest.fixture(scope="session")
def tiny_url(tiny_service, engine) -> Iterator[str]:
    with serve(tiny_service, engine) as url:
        yield url


@pytest.fixture(scope="session")
def base_url(service, engine) -> Iterator[str]:
    """The shared server over the chat model."""
    with serve(service, engine) as url:
        yield url


@pytest.fixture
def prompt_tokens(chat_model):
    """The tokenizer's count of the prompt the chat template renders."""

    def count(
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        thinking: bool = False,
    ) -> int:
        prompt = chat_model.chat_format.render(messages, tools, thinking=thinking)
        return len(chat_model.tokenizer.encode(prompt, add_special=False))

    return count
