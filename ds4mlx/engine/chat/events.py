"""What a chat format's parser reports while the model writes: text, reasoning, tool calls.

The faces (agent, server) consume these; they know nothing of any model's markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class TextDelta:
    """Visible answer text."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Text inside the thinking block."""

    text: str


@dataclass(frozen=True)
class ToolCallComplete:
    call: ToolCall


@dataclass(frozen=True)
class ToolCallError:
    """Tool-call markup that could not be understood; ``raw`` is the model's text for it.
    ``unterminated``: the output ended inside the call (a token limit or stop string cut it)."""

    raw: str
    reason: str
    unterminated: bool = False


@dataclass(frozen=True)
class ToolCallStart:
    """A tool call whose name has been written, from a parser asked to stream arguments:
    ToolCallArguments follow, then ToolCallComplete (or ToolCallError) ends the call."""

    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """More of the open tool call's arguments as JSON text; the pieces of a call that completes
    join to ``json.dumps(call.arguments, ensure_ascii=False)``."""

    text: str


ChatEvent = (
    TextDelta
    | ReasoningDelta
    | ToolCallComplete
    | ToolCallError
    | ToolCallStart
    | ToolCallArguments
)


@dataclass
class AssistantTurn:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)

    @classmethod
    def from_events(cls, events: Sequence[ChatEvent]) -> AssistantTurn:
        turn = cls()
        for event in events:
            if isinstance(event, TextDelta):
                turn.content += event.text
            elif isinstance(event, ReasoningDelta):
                turn.reasoning += event.text
            elif isinstance(event, ToolCallComplete):
                turn.tool_calls.append(event.call)
            elif isinstance(event, ToolCallError):
                turn.errors.append(event)
        return turn
