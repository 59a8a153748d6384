"""``POST /v1/completions``: OpenAI's legacy text completions (raw prompt, no chat template)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ds4mlx.generation import ChatEvent, Finished, TextDelta, TokenLogprobs
from ds4mlx.server.choices import split_choices, with_choices
from ds4mlx.server.errors import openai_error_body
from ds4mlx.server.generation import (
    APIRequest,
    GenerationCall,
    GenerationDefaults,
    output_format,
    stop_strings,
    token_limit,
    unsupported,
)
from ds4mlx.server.openai_chat import (
    FINISH_REASONS,
    ChoicesStream,
    ChunkStream,
    ResponseFormat,
    StreamOptions,
    chunk_stream,
    with_logprobs,
)
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
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    # Not in OpenAI's legacy API; vLLM and llama.cpp's servers take it here too.
    response_format: ResponseFormat | None = None


def _text(events: Sequence[ChatEvent | TokenLogprobs]) -> str:
    # A raw completion has no parser: every event is text.
    return "".join(event.text for event in events if isinstance(event, TextDelta))


def completion_logprobs(entries: Sequence[TokenLogprobs], offset: int = 0) -> dict[str, Any]:
    """OpenAI's legacy ``logprobs``: parallel lists of the tokens, their log-probabilities,
    the top alternatives (text to log-probability) and where each token starts in the text
    (``offset``: the characters of the completion before ``entries``)."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.text)
    return {
        "tokens": [entry.text for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{text: value for text, _, value in entry.top} for entry in entries],
        "text_offset": offsets,
    }


class CompletionsEndpoint:
    path = "/v1/completions"
    request_model = CompletionRequest
    error_body = staticmethod(openai_error_body)

    def call(self, request: CompletionRequest, defaults: GenerationDefaults) -> GenerationCall:
        if (request.best_of or 1) != 1:
            raise unsupported("best_of", "choices are not ranked")
        if request.echo:
            raise unsupported("echo", "the prompt is not repeated in the output")
        if request.suffix:
            raise unsupported("suffix", "fill-in-the-middle")
        prompt = request.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise unsupported("prompt", "one prompt per request")
            prompt = prompt[0]
        response_format = request.response_format
        call = GenerationCall(
            prompt=prompt,
            max_tokens=token_limit(request.max_tokens, defaults),
            sampling=with_logprobs(request.sampling(defaults), request.logprobs),
            stop=stop_strings(request.stop),
            output_format=output_format(
                response_format.type, response_format.json_schema, "response_format"
            )
            if response_format is not None
            else None,
        )
        return with_choices(call, request.n)

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
                    "logprobs": completion_logprobs(
                        [event for event in own if isinstance(event, TokenLogprobs)]
                    )
                    if request.logprobs is not None
                    else None,
                    "finish_reason": FINISH_REASONS[own_finished.finish_reason],
                }
                for index, (own, own_finished) in enumerate(split_choices(events, finished))
            ],
            "usage": chat_usage(finished),
        }

    def stream(self, request: CompletionRequest, meta: ResponseMeta) -> ChunkStream | ChoicesStream:
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        return chunk_stream(CompletionStream, meta, include_usage, request.n)


class CompletionStream(ChunkStream):
    object_name = "text_completion"
    id_prefix = "cmpl-"

    def _begin(self) -> None:
        self.sent_characters = 0  # of the text, where the next chunk's tokens start

    def _choice(self, content: Any, finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "index": self.index,
            "text": content or "",
            "logprobs": None,
            "finish_reason": finish_reason,
        }

    def _logprobs(self, entries: Sequence[TokenLogprobs]) -> dict[str, Any]:
        found = completion_logprobs(entries, self.sent_characters)
        self.sent_characters += sum(len(entry.text) for entry in entries)
        return found

    def start(self) -> list[bytes]:
        return []

    def event(self, event: ChatEvent | TokenLogprobs) -> list[bytes]:
        if isinstance(event, TokenLogprobs):
            self.pending_logprobs.append(event)
            return []
        return [self._frame([self._with_logprobs(self._choice(_text([event])))])]
