"""The assistant's turn as the response builders see it: ordered blocks of reasoning, text and
tool calls, grouped from the service's event stream."""

from __future__ import annotations

import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ds4mlx.generation import (
    ChatEvent,
    Finished,
    ReasoningDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallComplete,
    ToolCallError,
    ToolCallStart,
)
from ds4mlx.server.generation import json_arguments


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


@dataclass(frozen=True)
class ResponseMeta:
    """What every response object repeats: the served model's name and the creation time; and
    the prompt's length, known before the first token (0 for a raw completion)."""

    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: int = 0


@dataclass
class Block:
    """A run of reasoning or text, or one tool call. A call streamed while it was written has
    its arguments' JSON text so far in ``text`` and ``call`` None until it completes (None for
    good if the output ended inside it)."""

    kind: Literal["reasoning", "text", "tool_call"]
    text: str = ""
    call: ToolCall | None = None
    call_id: str = ""
    name: str = ""  # a tool call's function

    @property
    def arguments(self) -> str:
        """A tool call's arguments as JSON text (as far as they were written)."""
        return self.text if self.call is None else json_arguments(self.call.arguments)


# How an event changed the turn: a text or reasoning block opened (with text), text added to
# the open block (a streamed call's arguments too), a call arrived whole, a streamed call
# started, or it completed.
Change = Literal["opens", "delta", "call", "call_opens", "call_ends"]


class BlockTracker:
    """Groups events into blocks: a run of reasoning, a run of text, or one tool call.

    Tool-call markup the model got wrong is shown as text, so nothing the model wrote is lost.
    """

    def __init__(self, call_id_prefix: str):
        self.call_id_prefix = call_id_prefix
        self.blocks: list[Block] = []

    def add(self, event: ChatEvent) -> tuple[Block, str, Change]:
        """The block ``event`` belongs to, the text it adds, and how it changed the turn."""
        streamed = self._open_call()
        if isinstance(event, ToolCallStart):
            return self._new_call(event.name), "", "call_opens"
        if isinstance(event, ToolCallArguments) and streamed is not None:
            streamed.text += event.text
            return streamed, event.text, "delta"
        if isinstance(event, ToolCallComplete):
            if streamed is not None and streamed.name == event.call.name:
                streamed.call = event.call
                return streamed, "", "call_ends"
            block = self._new_call(event.call.name)
            block.call = event.call
            return block, "", "call"
        kind, text = (
            ("reasoning", event.text)
            if isinstance(event, ReasoningDelta)
            else ("text", event.raw if isinstance(event, ToolCallError) else event.text)
        )
        opens = not self.blocks or self.blocks[-1].kind != kind
        if opens:
            self.blocks.append(Block(kind))
        block = self.blocks[-1]
        block.text += text
        return block, text, "opens" if opens else "delta"

    def _new_call(self, name: str) -> Block:
        block = Block("tool_call", name=name, call_id=new_id(self.call_id_prefix))
        self.blocks.append(block)
        return block

    def _open_call(self) -> Block | None:
        """The streamed call still being written, if the last block is one."""
        last = self.blocks[-1] if self.blocks else None
        return last if last is not None and last.kind == "tool_call" and last.call is None else None

    def joined(self, kind: Literal["reasoning", "text"]) -> str:
        return "".join(block.text for block in self.blocks if block.kind == kind)

    @property
    def tool_calls(self) -> list[Block]:
        """The complete tool calls (a call the output ended inside is left out)."""
        return [block for block in self.blocks if block.kind == "tool_call" and block.call]

    @property
    def complete_blocks(self) -> list[Block]:
        return [block for block in self.blocks if block.kind != "tool_call" or block.call]


def track(events: Iterable[ChatEvent], call_id_prefix: str) -> BlockTracker:
    tracker = BlockTracker(call_id_prefix)
    for event in events:
        tracker.add(event)
    return tracker


def chat_usage(finished: Finished) -> dict[str, Any]:
    """OpenAI chat and completions ``usage``."""
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finished.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": finished.reasoning_tokens},
    }


def is_truncated(finished: Finished) -> bool:
    """Generation ended at the token limit or the end of the context."""
    return finished.finish_reason in ("length", "context")


class BlockStream(ABC):
    """Streams a turn as blocks that open, take deltas and close: Responses output items and
    Anthropic content blocks. A tool call streamed while it is written opens, takes its
    arguments as deltas and closes like text; one that arrives whole opens and closes at
    once."""

    def __init__(self, call_id_prefix: str):
        self.turn = BlockTracker(call_id_prefix)
        self.open_index: int | None = None  # the block taking deltas

    def event(self, event: ChatEvent) -> list[bytes]:
        block, text, change = self.turn.add(event)
        index = self.turn.blocks.index(block)
        if change == "delta":
            return self._delta(index, block, text)
        frames = self.close_open_block()
        if change == "call_ends":
            return frames
        if change == "call":
            return [*frames, *self._tool_call(index, block)]
        self.open_index = index
        if change == "call_opens":
            return [*frames, *self._open(index, block)]
        return [*frames, *self._open(index, block), *self._delta(index, block, text)]

    def close_open_block(self) -> list[bytes]:
        if self.open_index is None:
            return []
        index, self.open_index = self.open_index, None
        return self._close(index, self.turn.blocks[index])

    @abstractmethod
    def _open(self, index: int, block: Block) -> list[bytes]: ...

    @abstractmethod
    def _delta(self, index: int, block: Block, text: str) -> list[bytes]: ...

    @abstractmethod
    def _close(self, index: int, block: Block) -> list[bytes]: ...

    @abstractmethod
    def _tool_call(self, index: int, block: Block) -> list[bytes]: ...
