"""``POST /v1/messages``: Anthropic's Messages API.

``tool_use`` / ``tool_result`` blocks map to the chat template's tool calls and results;
``thinking: {"type": "enabled"}`` turns on reasoning, returned as ``thinking`` blocks (with an
empty signature: there is nothing to sign). Errors use Anthropic's error shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ds4mlx.generation import ChatEvent, Finished
from ds4mlx.generation import ToolChoice as EngineToolChoice
from ds4mlx.server.errors import APIError, anthropic_error_body
from ds4mlx.server.generation import (
    APIRequest,
    GenerationCall,
    GenerationDefaults,
    RequestModel,
    ThinkingControl,
    joined_text,
    resolve_thinking,
    tool_choice_for,
    unsupported,
    unsupported_content,
)
from ds4mlx.server.sse import event_frame
from ds4mlx.server.turn import Block, BlockStream, ResponseMeta, is_truncated, new_id, track

from pydantic import Field

CALL_ID_PREFIX = "toolu_"


class ContentBlock(RequestModel):
    """Any content block; which fields matter depends on ``type``."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    thinking: str | None = None


class Message(RequestModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(RequestModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False  # at most one tool use in the turn


class MessagesRequest(APIRequest):
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    stop_sequences: list[str] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingControl | None = None


def _user_messages(blocks: Sequence[ContentBlock], param: str) -> list[dict[str, Any]]:
    """One chat message per block, in order: the template merges a user turn's text and tool
    results back together."""
    messages = []
    for index, block in enumerate(blocks):
        if block.type == "tool_result":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id or "",
                    "content": joined_text(block.content, f"{param}[{index}].content"),
                }
            )
        elif block.type == "text" and block.text is not None:
            messages.append({"role": "user", "content": block.text})
        else:
            raise unsupported_content(f"{param}[{index}]", block.type)
    return messages


def _assistant_message(blocks: Sequence[ContentBlock], param: str) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "",
        "tool_calls": [],
    }
    for index, block in enumerate(blocks):
        if block.type == "thinking":
            message["reasoning_content"] += block.thinking or ""
        elif block.type == "tool_use":
            if block.name is None:
                raise APIError(
                    400,
                    f"'{param}[{index}].name' is required for tool_use",
                    param=f"{param}[{index}].name",
                )
            message["tool_calls"].append(
                {"id": block.id, "function": {"name": block.name, "arguments": block.input or {}}}
            )
        elif block.type == "text" and block.text is not None:
            message["content"] += block.text
        elif block.type != "redacted_thinking":  # encrypted elsewhere: nothing to render
            raise unsupported_content(f"{param}[{index}]", block.type)
    return message


def _service_messages(request: MessagesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": joined_text(request.system, "system")})
    for index, message in enumerate(request.messages):
        param = f"messages[{index}].content"
        blocks = (
            [ContentBlock(type="text", text=message.content)]
            if isinstance(message.content, str)
            else message.content
        )
        if message.role == "user":
            messages += _user_messages(blocks, param)
        else:
            messages.append(_assistant_message(blocks, param))
    return messages


def _tools(request: MessagesRequest) -> tuple[list[dict[str, Any]] | None, EngineToolChoice]:
    """The offered tools in the engine's form, and the tool choice."""
    choice = request.tool_choice
    if choice is not None and choice.type == "tool" and choice.name is None:
        raise APIError(
            400,
            "'tool_choice.name' is required for tool_choice of type 'tool'",
            param="tool_choice.name",
        )
    tool_choice = tool_choice_for(
        request.tools,
        {"any": "required"}.get(choice.type, choice.type) if choice else None,
        choice.name if choice is not None and choice.type == "tool" else None,
        [tool.name for tool in request.tools or ()],
    )
    if tool_choice == "none" or not request.tools:
        return None, tool_choice
    tools = []
    for index, tool in enumerate(request.tools):
        if tool.type not in (None, "custom") or tool.input_schema is None:
            raise unsupported(
                f"tools[{index}]",
                f"tool '{tool.name}' of type '{tool.type}' "
                "(only client tools with an input_schema run here)",
            )
        function = {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.input_schema,
        }
        tools.append(
            {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}
        )
    return tools, tool_choice


def _stop_reason(finished: Finished) -> str:
    if is_truncated(finished):
        return "max_tokens"
    if finished.finish_reason == "tool_calls":
        return "tool_use"
    return "end_turn" if finished.stop_sequence is None else "stop_sequence"


def _usage(finished: Finished) -> dict[str, Any]:
    # Anthropic counts cache reads apart from input_tokens.
    return {
        "input_tokens": finished.prompt_tokens - finished.cached_tokens,
        "output_tokens": finished.completion_tokens,
        "cache_read_input_tokens": finished.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _content_block(block: Block) -> dict[str, Any]:
    if block.kind == "tool_call":
        return {
            "type": "tool_use",
            "id": block.call_id,
            "name": block.name,
            "input": block.call.arguments if block.call is not None else {},
        }
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": block.text, "signature": ""}
    return {"type": "text", "text": block.text}


class MessagesEndpoint:
    path = "/v1/messages"
    request_model = MessagesRequest
    error_body = staticmethod(anthropic_error_body)

    def call(self, request: MessagesRequest, defaults: GenerationDefaults) -> GenerationCall:
        tools, tool_choice = _tools(request)
        return GenerationCall(
            messages=_service_messages(request),
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=not (
                request.tool_choice and request.tool_choice.disable_parallel_tool_use
            ),
            max_tokens=request.max_tokens,
            sampling=request.sampling(defaults),
            stop=tuple(request.stop_sequences or ()),
            thinking=resolve_thinking(request.thinking, None, defaults.thinking),
        )

    def response(
        self,
        request: MessagesRequest,
        events: Sequence[ChatEvent],
        finished: Finished,
        meta: ResponseMeta,
    ) -> dict[str, Any]:
        blocks = track(events, CALL_ID_PREFIX).complete_blocks
        return {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": meta.model,
            "content": [_content_block(block) for block in blocks],
            "stop_reason": _stop_reason(finished),
            "stop_sequence": finished.stop_sequence,
            "usage": _usage(finished),
        }

    def stream(self, request: MessagesRequest, meta: ResponseMeta) -> MessagesStream:
        return MessagesStream(meta)


class MessagesStream(BlockStream):
    """message_start, content blocks (start / deltas / stop), message_delta, message_stop."""

    def __init__(self, meta: ResponseMeta):
        super().__init__(CALL_ID_PREFIX)
        self.meta = meta
        self.id = new_id("msg_")

    @staticmethod
    def _frame(event_type: str, **fields: Any) -> bytes:
        return event_frame(event_type, {"type": event_type, **fields})

    def start(self) -> list[bytes]:
        # The prompt was tokenized before it was queued; how much of it the session had cached
        # is known at the end (message_delta carries the final counts).
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.meta.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.meta.prompt_tokens, "output_tokens": 0},
        }
        return [self._frame("message_start", message=message)]

    def _open(self, index: int, block: Block) -> list[bytes]:
        empty = (
            _content_block(block)
            | {"reasoning": {"thinking": ""}, "text": {"text": ""}, "tool_call": {"input": {}}}[
                block.kind
            ]
        )
        return [self._frame("content_block_start", index=index, content_block=empty)]

    def _delta(self, index: int, block: Block, text: str) -> list[bytes]:
        delta = {
            "reasoning": {"type": "thinking_delta", "thinking": text},
            "text": {"type": "text_delta", "text": text},
            "tool_call": {"type": "input_json_delta", "partial_json": text},
        }[block.kind]
        return [self._frame("content_block_delta", index=index, delta=delta)]

    def _close(self, index: int, block: Block) -> list[bytes]:
        return [self._frame("content_block_stop", index=index)]

    def _tool_call(self, index: int, block: Block) -> list[bytes]:
        return [
            *self._open(index, block),
            *self._delta(index, block, block.arguments),
            *self._close(index, block),
        ]

    def finish(self, finished: Finished) -> list[bytes]:
        return [
            *self.close_open_block(),
            self._frame(
                "message_delta",
                delta={
                    "stop_reason": _stop_reason(finished),
                    "stop_sequence": finished.stop_sequence,
                },
                usage=_usage(finished),
            ),
            self._frame("message_stop"),
        ]

    def error(self, error: APIError) -> list[bytes]:
        return [event_frame("error", anthropic_error_body(error))]
