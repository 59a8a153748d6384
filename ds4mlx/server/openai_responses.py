"""``POST /v1/responses``: OpenAI's Responses API.

The conversation travels in ``input`` (messages, ``function_call`` and ``function_call_output``
items, ``reasoning`` items), or continues a stored response (``previous_response_id``): with
``store`` (the default, as OpenAI's) each response and the conversation that led to it are kept
in memory, the oldest forgotten past a bound, and ``GET /v1/responses/{id}`` returns one. The
output is reasoning items (``reasoning_text`` content), assistant messages and ``function_call``
items, in the order the model wrote them. A stream always ends with ``response.completed`` (the
event the official client's stream helper waits for), whose response says ``incomplete`` when
the token limit cut the output.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from ds4mlx.generation import ChatEvent, Finished, ToolChoice
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
    unsupported,
)
from ds4mlx.server.sse import event_frame
from ds4mlx.server.turn import (
    Block,
    BlockStream,
    ResponseMeta,
    is_truncated,
    new_id,
    track,
)

from pydantic import Field, PrivateAttr

# How many stored responses (with their conversations) are kept; the oldest go first.
STORED_RESPONSES = 256

CALL_ID_PREFIX = "call_"
_TEXT_PART_TYPES = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class ContentPart(RequestModel):
    type: str
    text: str | None = None


class InputItem(RequestModel):
    """Any input item; which fields matter depends on ``type`` (a message when absent)."""

    type: str = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    summary: list[ContentPart] | None = None


class Tool(RequestModel):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # arguments held to ``parameters`` by constrained decoding


class ReasoningOptions(RequestModel):
    effort: ReasoningEffort | None = None


class TextFormat(JsonSchemaFormat):
    """``text.format``: "text", "json_object", or "json_schema" with the schema's fields."""

    type: str


class TextOptions(RequestModel):
    format: TextFormat | None = None


class ResponsesRequest(APIRequest):
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    tools: list[Tool] | None = None
    # A mode, or {"type": "function", "name": ...} for a call of that function.
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    reasoning: ReasoningOptions | None = None
    previous_response_id: str | None = None
    store: bool = True
    text: TextOptions | None = None
    thinking: bool | ThinkingControl | None = None
    stop: str | list[str] | None = None
    # The conversation this request continues, without its instructions: what is stored with
    # the response (set by ResponsesEndpoint.call).
    _conversation: list[dict[str, Any]] = PrivateAttr(default_factory=list)


class ResponseStore:
    """Stored responses and their conversations, in memory, the newest ``capacity`` of them;
    the event loop and the engine's callbacks may use it from different threads."""

    def __init__(self, capacity: int = STORED_RESPONSES):
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[response["id"]] = (response, conversation)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def response(self, response_id: str) -> dict[str, Any] | None:
        with self._lock:
            item = self._items.get(response_id)
        return None if item is None else item[0]

    def conversation(self, response_id: str) -> list[dict[str, Any]] | None:
        """The messages up to and including that response's assistant turn."""
        with self._lock:
            item = self._items.get(response_id)
        return None if item is None else item[1]

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None


def _text(parts: str | Sequence[ContentPart] | None, param: str) -> str:
    return joined_text(parts, param, _TEXT_PART_TYPES)


def _input_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's ``input`` as chat messages."""
    messages: list[dict[str, Any]] = []
    if isinstance(request.input, str):
        return [{"role": "user", "content": request.input}]
    # Reasoning, assistant text and function calls in a row are one assistant turn.
    assistant: dict[str, Any] | None = None
    for index, item in enumerate(request.input):
        param = f"input[{index}]"
        is_assistant_side = item.type in ("reasoning", "function_call") or (
            item.type == "message" and item.role == "assistant"
        )
        if is_assistant_side and assistant is None:
            assistant = {
                "role": "assistant",
                "content": "",
                "reasoning_content": "",
                "tool_calls": [],
            }
            messages.append(assistant)
        elif not is_assistant_side:
            assistant = None
        if item.type == "message":
            if item.role is None:
                raise APIError(
                    400, f"'{param}.role' is required for a message", param=f"{param}.role"
                )
            text = _text(item.content, f"{param}.content")
            if assistant is not None:
                assistant["content"] += text
            else:
                messages.append({"role": item.role, "content": text})
        elif item.type == "reasoning" and assistant is not None:
            assistant["reasoning_content"] += _text(
                item.content or item.summary, f"{param}.content"
            )
        elif item.type == "function_call" and assistant is not None:
            if item.name is None:
                raise APIError(
                    400, f"'{param}.name' is required for a function_call", param=f"{param}.name"
                )
            assistant["tool_calls"].append(
                {
                    "id": item.call_id,
                    "function": {"name": item.name, "arguments": item.arguments or "{}"},
                }
            )
        elif item.type == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.call_id or "",
                    "content": _text(item.output, f"{param}.output"),
                }
            )
        else:
            raise unsupported(f"{param}.type", f"input items of type '{item.type}'")
    return messages


def _tools(request: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, ToolChoice]:
    """The offered tools in the engine's form, and the tool choice."""
    choice = request.tool_choice
    named = None
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise unsupported("tool_choice", "only a mode or {'type': 'function', 'name': ...}")
        named, choice = choice["name"], None
    tool_choice = tool_choice_for(
        request.tools, choice, named, [tool.name for tool in request.tools or () if tool.name]
    )
    if tool_choice == "none" or not request.tools:
        return None, tool_choice
    tools = []
    for index, tool in enumerate(request.tools):
        if tool.type != "function" or tool.name is None:
            raise unsupported(
                f"tools[{index}]",
                f"tools of type '{tool.type}' (only named function tools run here)",
            )
        tools.append(
            {
                "type": "function",
                "function": tool.model_dump(
                    include={"name", "description", "parameters", "strict"}, exclude_none=True
                ),
            }
        )
    return tools, tool_choice


def _assistant_message(blocks: Sequence[Block]) -> dict[str, Any]:
    """The response's turn as the chat message a later request continues from."""
    return {
        "role": "assistant",
        "content": "".join(b.text for b in blocks if b.kind == "text"),
        "reasoning_content": "".join(b.text for b in blocks if b.kind == "reasoning"),
        "tool_calls": [
            {"id": b.call_id, "function": {"name": b.call.name, "arguments": b.call.arguments}}
            for b in blocks
            if b.kind == "tool_call" and b.call is not None
        ],
    }


def _output_item(block: Block, item_id: str, status: str | None = None) -> dict[str, Any]:
    """``block`` as an output item; its status by default: completed, or incomplete for a call
    the output ended inside."""
    if status is None:
        status = "incomplete" if block.kind == "tool_call" and block.call is None else "completed"
    if block.kind == "tool_call":
        return {
            "id": item_id,
            "type": "function_call",
            "call_id": block.call_id,
            "name": block.name,
            "arguments": block.arguments,
            "status": status,
        }
    if block.kind == "reasoning":
        return {
            "id": item_id,
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": block.text}],
            "status": status,
        }
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [_output_text(block.text)],
    }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _item_id(block: Block) -> str:
    return new_id({"tool_call": "fc_", "reasoning": "rs_", "text": "msg_"}[block.kind])


def _response_object(
    request: ResponsesRequest,
    meta: ResponseMeta,
    response_id: str,
    output: list[dict[str, Any]],
    finished: Finished | None,
) -> dict[str, Any]:
    """The response; ``finished`` None means still in progress."""
    status, incomplete, usage = "in_progress", None, None
    if finished is not None:
        truncated = is_truncated(finished)
        status = "incomplete" if truncated else "completed"
        incomplete = {"reason": "max_output_tokens"} if truncated else None
        usage = {
            "input_tokens": finished.prompt_tokens,
            "input_tokens_details": {"cached_tokens": finished.cached_tokens},
            "output_tokens": finished.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": finished.reasoning_tokens},
            "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        }
    return {
        "id": response_id,
        "object": "response",
        "created_at": meta.created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": meta.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "tool_choice": request.tool_choice or "auto",
        "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or ()],
        "text": {
            "format": request.text.format.model_dump(by_alias=True, exclude_none=True)
            if request.text and request.text.format
            else {"type": "text"}
        },
        "store": request.store,
        "previous_response_id": request.previous_response_id,
        "truncation": "disabled",
        "metadata": {},
        "usage": usage,
    }


class ResponsesEndpoint:
    path = "/v1/responses"
    request_model = ResponsesRequest
    error_body = staticmethod(openai_error_body)

    def __init__(self, store: ResponseStore | None = None):
        self.store = store or ResponseStore()

    def call(self, request: ResponsesRequest, defaults: GenerationDefaults) -> GenerationCall:
        previous: list[dict[str, Any]] = []
        if request.previous_response_id is not None:
            stored = self.store.conversation(request.previous_response_id)
            if stored is None:
                raise APIError(
                    400,
                    f"invalid 'previous_response_id': no stored response "
                    f"'{request.previous_response_id}' (responses are kept in "
                    f"memory, the latest {self.store.capacity}, and only with "
                    "'store' true)",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            previous = stored
        request._conversation = [*previous, *_input_messages(request)]
        instructions = (
            [{"role": "system", "content": request.instructions}] if request.instructions else []
        )
        text_format = request.text.format if request.text else None
        effort = request.reasoning.effort if request.reasoning else None
        tools, tool_choice = _tools(request)
        return GenerationCall(
            messages=[*instructions, *request._conversation],
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            max_tokens=token_limit(request.max_output_tokens, defaults),
            sampling=request.sampling(defaults),
            stop=stop_strings(request.stop),
            thinking=resolve_thinking(request.thinking, effort, defaults.thinking),
            reasoning_effort=template_effort(effort),
            output_format=output_format(text_format.type, text_format, "text.format")
            if text_format is not None
            else None,
        )

    def response(
        self,
        request: ResponsesRequest,
        events: Sequence[ChatEvent],
        finished: Finished,
        meta: ResponseMeta,
    ) -> dict[str, Any]:
        blocks = track(events, CALL_ID_PREFIX).complete_blocks
        output = [_output_item(block, _item_id(block)) for block in blocks]
        response = _response_object(request, meta, new_id("resp_"), output, finished)
        self._keep(request, response, blocks)
        return response

    def stream(self, request: ResponsesRequest, meta: ResponseMeta) -> ResponsesStream:
        return ResponsesStream(request, meta, self._keep)

    def _keep(
        self, request: ResponsesRequest, response: dict[str, Any], blocks: Sequence[Block]
    ) -> None:
        if request.store:
            self.store.put(response, [*request._conversation, _assistant_message(blocks)])


class ResponsesStream(BlockStream):
    """The Responses event sequence: created, then per output item added / deltas / done, then
    completed (or incomplete)."""

    def __init__(
        self,
        request: ResponsesRequest,
        meta: ResponseMeta,
        keep: Callable[[ResponsesRequest, dict[str, Any], Sequence[Block]], None],
    ):
        super().__init__(CALL_ID_PREFIX)
        self.request = request
        self.keep = keep
        self.meta = meta
        self.id = new_id("resp_")
        self.item_ids: list[str] = []
        self.sequence = 0

    def _frame(self, event_type: str, **fields: Any) -> bytes:
        frame = event_frame(
            event_type, {"type": event_type, "sequence_number": self.sequence, **fields}
        )
        self.sequence += 1
        return frame

    def _response(self, finished: Finished | None) -> dict[str, Any]:
        if finished is None:
            output = []
        else:
            output = [
                _output_item(block, item_id)
                for block, item_id in zip(self.turn.blocks, self.item_ids, strict=True)
            ]
        return _response_object(self.request, self.meta, self.id, output, finished)

    def start(self) -> list[bytes]:
        return [
            self._frame("response.created", response=self._response(None)),
            self._frame("response.in_progress", response=self._response(None)),
        ]

    def _added(self, index: int, block: Block) -> tuple[str, dict[str, Any], bytes]:
        """A new output item's id, its final form and its output_item.added frame (the item
        as it starts out: no text, no arguments)."""
        item_id = _item_id(block)
        self.item_ids.append(item_id)
        item = _output_item(block, item_id, status="in_progress")
        empty = {"arguments": ""} if block.kind == "tool_call" else {"content": []}
        added = self._frame("response.output_item.added", output_index=index, item=item | empty)
        return item_id, item, added

    def _open(self, index: int, block: Block) -> list[bytes]:
        item_id, item, added = self._added(index, block)
        if block.kind == "tool_call":
            return [added]
        empty_part = item["content"][0] | {"text": ""}
        return [
            added,
            self._frame(
                "response.content_part.added",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=empty_part,
            ),
        ]

    def _delta(self, index: int, block: Block, text: str) -> list[bytes]:
        item_id = self.item_ids[index]
        if block.kind == "tool_call":
            return [
                self._frame(
                    "response.function_call_arguments.delta",
                    item_id=item_id,
                    output_index=index,
                    delta=text,
                )
            ]
        if block.kind == "reasoning":
            return [
                self._frame(
                    "response.reasoning_text.delta",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    delta=text,
                )
            ]
        return [
            self._frame(
                "response.output_text.delta",
                item_id=item_id,
                output_index=index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        ]

    def _close(self, index: int, block: Block) -> list[bytes]:
        item_id = self.item_ids[index]
        item = _output_item(block, item_id)
        if block.kind == "tool_call":
            return [
                self._frame(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    name=block.name,
                    arguments=block.arguments,
                ),
                self._frame("response.output_item.done", output_index=index, item=item),
            ]
        if block.kind == "reasoning":
            done = self._frame(
                "response.reasoning_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=block.text,
            )
        else:
            done = self._frame(
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=block.text,
                logprobs=[],
            )
        return [
            done,
            self._frame(
                "response.content_part.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=item["content"][0],
            ),
            self._frame("response.output_item.done", output_index=index, item=item),
        ]

    def _tool_call(self, index: int, block: Block) -> list[bytes]:
        return [
            *self._open(index, block),
            *self._delta(index, block, block.arguments),
            *self._close(index, block),
        ]

    def finish(self, finished: Finished) -> list[bytes]:
        closing = self.close_open_block()
        response = self._response(finished)
        self.keep(self.request, response, self.turn.blocks)
        return [*closing, self._frame("response.completed", response=response)]

    def error(self, error: APIError) -> list[bytes]:
        return [self._frame("error", code=error.code, message=error.message, param=error.param)]
