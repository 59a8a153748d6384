"""Chat formats: OpenAI-style messages to the exact prompt a model was trained on, and the model's
output back to reasoning, content and tool calls, whole or while it streams.

- ``events``: what a parser reports (``TextDelta``, ``ToolCallComplete``, ...): all a face needs.
- ``prompt``: prompt text that keeps the template's pieces apart from the caller's, and its
  tokenization (special tokens only where the template wrote them).
- ``base``: the ``ChatFormat`` interface and the marker-driven stream parser.
- ``deepseek4``: DeepSeek-V4's template and DSML tool calls; ``glm5``: GLM-5.3-Flash's template
  and ``<tool_call>`` syntax.
"""

from __future__ import annotations

from ds4mlx.engine.chat.base import ChatFormat, Message, StreamParser
from ds4mlx.engine.chat.deepseek4 import DEEPSEEK_V4
from ds4mlx.engine.chat.events import (
    AssistantTurn,
    ChatEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallComplete,
    ToolCallError,
    ToolCallStart,
)
from ds4mlx.engine.chat.glm5 import GLM5
from ds4mlx.engine.chat.prompt import NamedTool, PromptText, ToolChoice

# general.architecture values (llama.cpp names) whose chat format is implemented.
_FORMATS_BY_ARCH: dict[str, ChatFormat] = {"deepseek4": DEEPSEEK_V4, "glm5-next": GLM5}


def chat_format_for_arch(arch: str) -> ChatFormat | None:
    """The chat format for a GGUF ``general.architecture``, or None when none is implemented."""
    return _FORMATS_BY_ARCH.get(arch)


__all__ = [
    "DEEPSEEK_V4",
    "GLM5",
    "AssistantTurn",
    "ChatEvent",
    "ChatFormat",
    "Message",
    "NamedTool",
    "PromptText",
    "ReasoningDelta",
    "StreamParser",
    "TextDelta",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallComplete",
    "ToolCallError",
    "ToolCallStart",
    "ToolChoice",
    "chat_format_for_arch",
]
