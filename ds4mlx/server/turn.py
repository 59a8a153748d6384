"""The assistant's turn as the response builders see it: ordered blocks of reasoning, text and
tool calls, grouped from the service's event stream."""

from __future__ import annotations

import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ds4mlx.engine.chat import (
    ChatEvent,
    ReasoningDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallError,
)
from ds4mlx.speculation.service import Finished


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
    kind: Literal["reasoning", "text", "tool_call"]
    text: str = ""
    call: ToolCall | None = None
    call_id: str = ""


class BlockTracker:
    """Groups events into blocks: a run of reasoning, a run of text, or one tool call.

    Tool-call markup the model got wrong is shown as text, so nothing the model wrote is lost.
    """

    def __init__(self, call_id_prefix: str):
        self.call_id_prefix = call_id_prefix
        self.blocks: list[Block] = []

    def add(self, event: ChatEvent) -> tuple[Block, str, bool]:
        """The block ``event`` belongs to, the text it adds, and whether it opened the block."""
        if isinstance(event, ToolCallComplete):
            block = Block("tool_call", call=event.call, call_id=new_id(self.call_id_prefix))
            self.blocks.append(block)
            return block, "", True
        kind, text = (("reasoning", event.text) if isinstance(event, ReasoningDelta) else
                      ("text", event.raw if isinstance(event, ToolCallError) else event.text))
        opens = not self.blocks or self.blocks[-1].kind != kind
        if opens:
            self.blocks.append(Block(kind))
        block = self.blocks[-1]
        block.text += text
        return block, text, opens

    def joined(self, kind: Literal["reasoning", "text"]) -> str:
        return "".join(block.text for block in self.blocks if block.kind == kind)

    @property
    def tool_calls(self) -> list[Block]:
        return [block for block in self.blocks if block.kind == "tool_call"]


def track(events: Iterable[ChatEvent], call_id_prefix: str) -> BlockTracker:
    tracker = BlockTracker(call_id_prefix)
    for event in events:
        tracker.add(event)
    return tracker


def chat_usage(finished: Finished) -> dict[str, Any]:
    """OpenAI chat and completions ``usage``."""
    return {"prompt_tokens": finished.prompt_tokens,
            "completion_tokens": finished.completion_tokens,
            "total_tokens": finished.prompt_tokens + finished.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": finished.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": finished.reasoning_tokens}}


def is_truncated(finished: Finished) -> bool:
    """Generation ended at the token limit or the end of the context."""
    return finished.finish_reason in ("length", "context")


class BlockStream(ABC):
    """Streams a turn as blocks that open, take deltas and close: Responses output items and
    Anthropic content blocks. A tool call arrives whole, so it opens and closes at once."""

    def __init__(self, call_id_prefix: str):
        self.turn = BlockTracker(call_id_prefix)
        self.open_index: int | None = None  # the text or reasoning block taking deltas

    def event(self, event: ChatEvent) -> list[bytes]:
        block, text, opens = self.turn.add(event)
        index = len(self.turn.blocks) - 1
        if not opens:
            return self._delta(index, block, text)
        frames = self.close_open_block()
        if block.kind == "tool_call":
            return [*frames, *self._tool_call(index, block)]
        self.open_index = index
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
