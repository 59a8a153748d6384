"""``POST /v1/chat/completions``: OpenAI chat completions, with DeepSeek's ``reasoning_content``.

Tools are OpenAI function tools; the model's tool calls come back as ``tool_calls`` with JSON
string arguments. Thinking is switched on by ``thinking`` (true/false or DeepSeek's
``{"type": "enabled"}``), ``reasoning_effort``, or llama.cpp's
``chat_template_kwargs.enable_thinking``; the reasoning is returned in ``reasoning_content`` as
DeepSeek's API and llama.cpp do.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal

from ds4mlx.generation import ChatEvent, Finished, SamplingOptions, TokenLogprobs
from ds4mlx.server.choices import ChoiceEvent, split_choices, with_choices
from ds4mlx.server.errors import APIError, openai_error_body
from ds4mlx.server.generation import (
    APIRequest,
    GenerationCall,
    GenerationDefaults,
    JsonSchemaFormat,
    ReasoningEffort,
    RequestModel,
    ThinkingControl,
    joined_text,
    output_format,
    resolve_thinking,
    stop_strings,
    template_effort,
    token_limit,
    tool_choice_for,
)
from ds4mlx.server.sse import DONE_FRAME, data_frame
from ds4mlx.server.turn import Block, BlockTracker, ResponseMeta, chat_usage, new_id, track

from pydantic import Field

FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "context": "length",
    "tool_calls": "tool_calls",
}
CALL_ID_PREFIX = "call_"


class ContentPart(RequestModel):
    type: str
    text: str | None = None


class FunctionCall(RequestModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class MessageToolCall(RequestModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(RequestModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # arguments held to ``parameters`` by constrained decoding


class FunctionTool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(RequestModel):
    include_usage: bool = False


class ResponseFormat(RequestModel):
    type: str
    json_schema: JsonSchemaFormat | None = None


class ChatTemplateKwargs(RequestModel):
    enable_thinking: bool | None = None


class ChatCompletionRequest(APIRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    thinking: bool | ThinkingControl | None = None
    reasoning_effort: ReasoningEffort | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None


def _service_message(message: ChatMessage, index: int) -> dict[str, Any]:
    converted: dict[str, Any] = {
        "role": message.role,
        "content": joined_text(message.content, f"messages[{index}].content"),
    }
    if message.tool_calls:
        converted["tool_calls"] = [
            {
                "id": call.id,
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        converted["tool_call_id"] = message.tool_call_id
    if message.reasoning_content:
        converted["reasoning_content"] = message.reasoning_content
    return converted


def tool_call_json(block: Block) -> dict[str, Any]:
    return {
        "id": block.call_id,
        "type": "function",
        "function": {"name": block.name, "arguments": block.arguments},
    }


def _choice_json(
    index: int, events: Sequence[ChatEvent], finished: Finished, with_logprobs: bool
) -> dict[str, Any]:
    logprobs = [event for event in events if isinstance(event, TokenLogprobs)]
    turn = track([e for e in events if not isinstance(e, TokenLogprobs)], CALL_ID_PREFIX)
    calls = [tool_call_json(block) for block in turn.tool_calls]
    text = turn.joined("text")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if text or not calls else None,
    }
    reasoning = turn.joined("reasoning")
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(logprobs) if with_logprobs else None,
        "finish_reason": FINISH_REASONS[finished.finish_reason],
    }


class ChatCompletionsEndpoint:
    path = "/v1/chat/completions"
    request_model = ChatCompletionRequest
    error_body = staticmethod(openai_error_body)

    def call(self, request: ChatCompletionRequest, defaults: GenerationDefaults) -> GenerationCall:
        if request.top_logprobs is not None and not request.logprobs:
            raise APIError(400, "'top_logprobs' needs 'logprobs' set to true", param="top_logprobs")
        response_format = request.response_format
        choice = request.tool_choice
        tool_choice = tool_choice_for(
            request.tools,
            None if isinstance(choice, NamedToolChoice) else choice,
            choice.function.name if isinstance(choice, NamedToolChoice) else None,
            [tool.function.name for tool in request.tools or ()],
        )
        template_thinking = (
            request.chat_template_kwargs.enable_thinking if request.chat_template_kwargs else None
        )
        call = GenerationCall(
            messages=[_service_message(m, i) for i, m in enumerate(request.messages)],
            tools=[tool.model_dump(exclude_none=True) for tool in request.tools or ()]
            if tool_choice != "none"
            else None,
            tool_choice=tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            max_tokens=token_limit(request.max_completion_tokens or request.max_tokens, defaults),
            sampling=with_logprobs(
                request.sampling(defaults),
                (request.top_logprobs or 0) if request.logprobs else None,
            ),
            stop=stop_strings(request.stop),
            thinking=resolve_thinking(
                request.thinking if request.thinking is not None else template_thinking,
                request.reasoning_effort,
                defaults.thinking,
            ),
            reasoning_effort=template_effort(request.reasoning_effort),
            output_format=output_format(
                response_format.type, response_format.json_schema, "response_format"
            )
            if response_format is not None
            else None,
        )
        return with_choices(call, request.n)

    def response(
        self,
        request: ChatCompletionRequest,
        events: Sequence[ChatEvent],
        finished: Finished,
        meta: ResponseMeta,
    ) -> dict[str, Any]:
        return {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [
                _choice_json(index, own, own_finished, bool(request.logprobs))
                for index, (own, own_finished) in enumerate(split_choices(events, finished))
            ],
            "usage": chat_usage(finished),
        }

    def stream(
        self, request: ChatCompletionRequest, meta: ResponseMeta
    ) -> ChunkStream | ChoicesStream:
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        return chunk_stream(ChatCompletionStream, meta, include_usage, request.n)


def with_logprobs(sampling: SamplingOptions, top: int | None) -> SamplingOptions:
    """``sampling`` asking for each token's log-probability and ``top`` alternatives (None:
    none asked for)."""
    return sampling if top is None else dataclasses.replace(sampling, logprobs=top)


def _logprob_entry(text: str, piece: bytes, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(piece)}


def chat_logprobs(entries: Sequence[TokenLogprobs]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs``: per token its log-probability and the top alternatives."""
    return {
        "content": [
            {
                **_logprob_entry(entry.text, entry.token_bytes, entry.logprob),
                "top_logprobs": [_logprob_entry(*alternative) for alternative in entry.top],
            }
            for entry in entries
        ],
        "refusal": None,
    }


class ChunkStream(ABC):
    """OpenAI's chunked streams (chat and legacy completions) of choice ``index``: one object
    a frame, the finish reason in a last choice, usage in a chunk without choices when asked
    for, then [DONE]. Log-probabilities go with the next chunk after their tokens (with one of
    their own before the finish when no text followed them). The choices of one request share
    its ``stream_id`` (``ChoicesStream``)."""

    object_name: str
    id_prefix: str

    def __init__(
        self,
        meta: ResponseMeta,
        include_usage: bool,
        index: int = 0,
        stream_id: str | None = None,
    ):
        self.meta = meta
        self.include_usage = include_usage
        self.index = index
        self.id = stream_id or new_id(self.id_prefix)
        self.pending_logprobs: list[TokenLogprobs] = []
        self._begin()

    @abstractmethod
    def _begin(self) -> None:
        """Set up what one choice's stream keeps while it is written."""

    @abstractmethod
    def _choice(self, content: Any, finish_reason: str | None = None) -> dict[str, Any]:
        """One choice carrying ``content`` (a chat delta or completion text; None for none)."""

    @abstractmethod
    def _logprobs(self, entries: Sequence[TokenLogprobs]) -> dict[str, Any]:
        """The ``logprobs`` of a choice carrying ``entries``."""

    def _with_logprobs(self, choice: dict[str, Any]) -> dict[str, Any]:
        if self.pending_logprobs:
            choice["logprobs"] = self._logprobs(self.pending_logprobs)
            self.pending_logprobs = []
        return choice

    def _frame(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return data_frame(
            {
                "id": self.id,
                "object": self.object_name,
                "created": self.meta.created,
                "model": self.meta.model,
                "choices": choices,
                **extra,
            }
        )

    def finish(self, finished: Finished) -> list[bytes]:
        return self.finish_choice(finished) + self.close(finished)

    def finish_choice(self, finished: Finished) -> list[bytes]:
        """The choice's last frames: log-probabilities still held, then its finish reason."""
        frames = []
        if self.pending_logprobs:
            frames.append(self._frame([self._with_logprobs(self._choice(None))]))
        frames.append(self._frame([self._choice(None, FINISH_REASONS[finished.finish_reason])]))
        return frames

    def close(self, finished: Finished) -> list[bytes]:
        """The request's last frames: its usage when asked for, then [DONE]."""
        usage = [self._frame([], usage=chat_usage(finished))] if self.include_usage else []
        return [*usage, DONE_FRAME]

    def error(self, error: APIError) -> list[bytes]:
        return [data_frame(openai_error_body(error))]


class ChoicesStream:
    """A streamed request of several choices (``n > 1``): each choice's events, as
    ``server.choices.merged`` tags them, go to that choice's own stream, and the request's
    ``Finished`` (all choices counted) closes it."""

    def __init__(self, choices: Sequence[ChunkStream]):
        self.choices = choices

    def start(self) -> list[bytes]:
        return [frame for choice in self.choices for frame in choice.start()]

    def event(self, event: ChoiceEvent) -> list[bytes]:
        choice = self.choices[event.index]
        if isinstance(event.event, Finished):
            return choice.finish_choice(event.event)
        return choice.event(event.event)

    def finish(self, finished: Finished) -> list[bytes]:
        return self.choices[0].close(finished)

    def error(self, error: APIError) -> list[bytes]:
        return self.choices[0].error(error)


def chunk_stream(
    stream_class: type[ChunkStream], meta: ResponseMeta, include_usage: bool, n: int
) -> ChunkStream | ChoicesStream:
    """The stream of a request for ``n`` choices, one ``stream_class`` stream per choice."""
    if n == 1:
        return stream_class(meta, include_usage)
    shared = new_id(stream_class.id_prefix)
    return ChoicesStream([stream_class(meta, include_usage, i, shared) for i in range(n)])


class ChatCompletionStream(ChunkStream):
    """``chat.completion.chunk`` frames: content, reasoning_content and tool_calls deltas."""

    object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def _begin(self) -> None:
        self.turn = BlockTracker(CALL_ID_PREFIX)

    def _choice(self, content: Any, finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "index": self.index,
            "delta": content or {},
            "logprobs": None,
            "finish_reason": finish_reason,
        }

    def _logprobs(self, entries: Sequence[TokenLogprobs]) -> dict[str, Any]:
        return chat_logprobs(entries)

    def start(self) -> list[bytes]:
        return [self._frame([self._choice({"role": "assistant", "content": ""})])]

    def event(self, event: ChatEvent | TokenLogprobs) -> list[bytes]:
        """Text and reasoning as they come; a tool call whole, or streamed as it is written:
        its id and name first, then pieces of its arguments (what clients accumulate)."""
        if isinstance(event, TokenLogprobs):
            self.pending_logprobs.append(event)
            return []
        block, text, change = self.turn.add(event)
        if block.kind != "tool_call":
            delta = {"reasoning_content" if block.kind == "reasoning" else "content": text}
            return [self._frame([self._with_logprobs(self._choice(delta))])]
        index = [b for b in self.turn.blocks if b.kind == "tool_call"].index(block)
        if change == "call":
            piece = {"index": index, **tool_call_json(block)}
        elif change == "call_opens":
            piece = {"index": index, **tool_call_json(block)}
            piece["function"]["arguments"] = ""
        elif change == "delta":
            piece = {"index": index, "function": {"arguments": text}}
        else:  # the end of a streamed call: all of it has been sent
            return []
        return [self._frame([self._with_logprobs(self._choice({"tool_calls": [piece]}))])]
