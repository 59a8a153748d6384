"""``POST /v1/completions``: OpenAI's legacy text completions (raw prompt, no chat template)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ds4mlx.generation import ChatEvent, Finished, TextDelta
from ds4mlx.server.choices import split_choices, with_choices
from ds4mlx.server.errors import openai_error_body
from ds4mlx.server.generation import (
    APIRequest,
    GenerationCall,
    GenerationDefaults,
    stop_strings,
    token_limit,
    unsupported,
)
from ds4mlx.server.openai_chat import FINISH_REASONS, ChunkStream, StreamOptions
from ds4mlx.server.turn import ResponseMeta, chat_usage, new_id

from pydantic import Field


class CompletionRequest(APIRequest):
    prompt: str | list[str]
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    best_of: int | None = Field(None, ge=1)
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None


def _text(events: Sequence[ChatEvent]) -> str:
    # A raw completion has no parser: every event is text.
    return "".join(event.text for event in events if isinstance(event, TextDelta))


class CompletionsEndpoint:
    path = "/v1/completions"
    request_model = CompletionRequest
    error_body = staticmethod(openai_error_body)

    def call(self, request: CompletionRequest, defaults: GenerationDefaults) -> GenerationCall:
        if (request.best_of or 1) != 1:
            raise unsupported("best_of", "choices are not ranked")
        if request.echo:
            raise unsupported("echo", "the prompt is not repeated in the output")
        if request.logprobs is not None:
            raise unsupported("logprobs", "log-probabilities are not returned")
        if request.suffix:
            raise unsupported("suffix", "fill-in-the-middle")
        prompt = request.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise unsupported("prompt", "one prompt per request")
            prompt = prompt[0]
        call = GenerationCall(
            prompt=prompt,
            max_tokens=token_limit(request.max_tokens, defaults),
            sampling=request.sampling(defaults),
            stop=stop_strings(request.stop),
        )
        return with_choices(call, request.n, request.stream)

    def response(
        self,
        request: CompletionRequest,
        events: Sequence[ChatEvent],
        finished: Finished,
        meta: ResponseMeta,
    ) -> dict[str, Any]:
        return {
            "id": new_id("cmpl-"),
            "object": "text_completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [
                {
                    "index": index,
                    "text": _text(own),
                    "logprobs": None,
                    "finish_reason": FINISH_REASONS[own_finished.finish_reason],
                }
                for index, (own, own_finished) in enumerate(split_choices(events, finished))
            ],
            "usage": chat_usage(finished),
        }

    def stream(self, request: CompletionRequest, meta: ResponseMeta) -> CompletionStream:
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        return CompletionStream(meta, include_usage)


class CompletionStream(ChunkStream):
    object_name = "text_completion"
    id_prefix = "cmpl-"

    def _choice(self, content: Any, finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish_reason}

    def start(self) -> list[bytes]:
        return []

    def event(self, event: ChatEvent) -> list[bytes]:
        return [self._frame([self._choice(_text([event]))])]
