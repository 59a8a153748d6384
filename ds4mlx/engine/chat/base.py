"""What every chat format shares: the ``ChatFormat`` interface, the marker-driven streaming
parser the formats' output parsers build on, and helpers for tool calls."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ds4mlx.engine.chat.call_grammar import CallSyntax
from ds4mlx.engine.chat.events import (
    AssistantTurn,
    ChatEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
)
from ds4mlx.engine.chat.prompt import NamedTool, PromptText, ToolChoice, encode_prompt
from ds4mlx.engine.tokenizer import TextTokenizer

Message = Mapping[str, Any]


class StreamParser(Protocol):
    """Turns model output, fed in any chunking, into events; markup is never shown as text."""

    def feed(self, text: str) -> list[ChatEvent]: ...

    def finish(self) -> list[ChatEvent]:
        """End of output: flush held-back text and report anything left unterminated."""
        ...

    @property
    def reasoning(self) -> bool:
        """Whether the output fed so far ends inside the reasoning block."""
        ...


# OpenAI's reasoning efforts, weakest first, and "max" where a template has a maximum mode.
REASONING_EFFORT_ORDER = ("minimal", "low", "medium", "high", "xhigh", "max")


class ChatFormat(ABC):
    """One model family's chat template and output syntax."""

    name: str
    #: The text of the token that opens a tool call (``CallSyntax.marker``).
    call_marker: str
    #: What ends the reasoning block.
    reasoning_end: str = "</think>"
    #: The ``reasoning_effort`` values ``render`` accepts, weakest first.
    reasoning_efforts: tuple[str, ...] = ()

    def template_effort(self, effort: str) -> str | None:
        """The template's effort for a requested one (a REASONING_EFFORT_ORDER name): the
        strongest it has that is not stronger, else its weakest; None for a template that takes
        none. "max" must be one of its own: without a maximum mode it raises ValueError."""
        if effort not in REASONING_EFFORT_ORDER:
            raise ValueError(
                f"reasoning effort must be one of {REASONING_EFFORT_ORDER}, got {effort!r}"
            )
        if effort == "max" and "max" not in self.reasoning_efforts:
            raise ValueError(f"the {self.name} chat template has no 'max' reasoning effort")
        if not self.reasoning_efforts:
            return None
        rank = REASONING_EFFORT_ORDER.index
        weaker = [e for e in self.reasoning_efforts if rank(e) <= rank(effort)]
        return weaker[-1] if weaker else self.reasoning_efforts[0]

    @abstractmethod
    def prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        thinking: bool = False,
        tool_choice: ToolChoice = "auto",
        **options: Any,
    ) -> PromptText:
        """The prompt for ``messages``, the template's pieces apart from the caller's.
        ``tool_choice`` "none" renders no tools; a forced choice ("required", a NamedTool)
        renders without reasoning and ends with the opening of a call."""

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        thinking: bool = False,
        **options: Any,
    ) -> str:
        """The prompt text for ``messages`` (special tokens written as text); ``options`` as
        the format's ``prompt``."""
        return str(
            self.prompt(
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                thinking=thinking,
                **options,
            )
        )

    def tokenize(
        self,
        tokenizer: TextTokenizer,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        thinking: bool = False,
        **options: Any,
    ) -> list[int]:
        """The prompt's token ids: special tokens only where the template wrote them, so text
        in the messages and tools is never read as a turn boundary."""
        return encode_prompt(tokenizer, self.prompt(messages, tools, thinking=thinking, **options))

    @abstractmethod
    def forced_call_prefix(self, tool_choice: ToolChoice) -> str:
        """What a forced ``tool_choice`` puts at the end of the prompt: the opening of a call
        (of the named function, for a NamedTool); "" for "auto" and "none"."""

    @abstractmethod
    def call_syntax(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: ToolChoice = "auto",
        parallel: bool = True,
    ) -> CallSyntax:
        """How this format's tool calls are held to its syntax for a request offering
        ``tools`` (at least one) with ``tool_choice`` (not "none"): names restricted to the
        tools (to the named one for a NamedTool), arguments to their schemas for strict tools
        and forced choices; one call per turn unless ``parallel``."""

    @abstractmethod
    def stream_parser(
        self,
        *,
        thinking: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = "auto",
        stream_arguments: bool = False,
    ) -> StreamParser:
        """A parser for output generated after a prompt rendered with the same ``thinking``
        and ``tool_choice``: "none" parses no tool calls (markup is text), a forced choice
        starts inside the call the prompt opened. ``stream_arguments``: report each call's
        name and arguments as they are written (ToolCallStart, ToolCallArguments) before the
        call itself, where the format allows."""

    @abstractmethod
    def stop_strings(self) -> list[str]:
        """Text that ends the assistant's turn."""

    def parse(self, text: str, *, thinking: bool = False) -> AssistantTurn:
        parser = self.stream_parser(thinking=thinking)
        return AssistantTurn.from_events([*parser.feed(text), *parser.finish()])


def tool_call_from_message(entry: ToolCall | Mapping[str, Any]) -> tuple[ToolCall, str | None]:
    """A ToolCall and its id from a ToolCall or an OpenAI ``{"id", "function": {...}}`` entry."""
    if isinstance(entry, ToolCall):
        return entry, None
    function = entry.get("function", entry)
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        # Unparseable argument strings are kept whole under "arguments" (as DeepSeek-V4's
        # reference encoder does).
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = {"arguments": arguments}
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    return ToolCall(function["name"], arguments), entry.get("id")


def write_forced_prefix(out: PromptText, prefix: str, tool_choice: ToolChoice) -> None:
    """``prefix`` into the prompt, a named function's name as the caller's text."""
    if isinstance(tool_choice, NamedTool):
        # The name ends the prefix but for markup without name characters (DeepSeek's '">'),
        # while it may also occur inside the markup before it (a tool named "tool" in GLM's
        # "<tool_call>"): its last occurrence is the caller's.
        head, name, tail = prefix.rpartition(tool_choice.name)
        out.template(head)
        out.caller(name)
        out.template(tail)
    else:
        out.template(prefix)


def enter_forced_call(parser: MarkerStreamParser, prefix: str) -> None:
    """Bring ``parser`` to where the prompt's forced call prefix left the model."""
    if prefix:
        parser.enter(prefix)


class ArgumentStream:
    """The streamed form of one open tool call, whatever its markup: its name once
    (``ToolCallStart``), each argument not yet reported as a piece of the JSON object the
    arguments will be (``ToolCallArguments``), then the closing brace. A parser keeps one and
    ``reset``s it when the call ends."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.announced = False  # the call's ToolCallStart has been reported
        self.sent = 0  # its arguments reported so far

    def announce(self, events: list[ChatEvent], name: str) -> None:
        if not self.announced:
            events.append(ToolCallStart(name))
            self.announced = True

    def arguments(self, events: list[ChatEvent], arguments: Sequence[tuple[str, Any]]) -> None:
        for key, value in arguments[self.sent :]:
            separator = ", " if self.sent else "{"
            events.append(
                ToolCallArguments(
                    f"{separator}{json.dumps(key, ensure_ascii=False)}: "
                    f"{json.dumps(value, ensure_ascii=False)}"
                )
            )
            self.sent += 1

    def close(self, events: list[ChatEvent]) -> None:
        events.append(ToolCallArguments("}" if self.sent else "{}"))


_REASONING, _DONE = "reasoning", "done"


def first_marker(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    """The earliest complete marker in ``text`` (the longest one when several start there)."""
    best: tuple[int, str] | None = None
    for marker in markers:
        position = text.find(marker)
        if position >= 0 and (
            best is None
            or position < best[0]
            or (position == best[0] and len(marker) > len(best[1]))
        ):
            best = (position, marker)
    return best


def marker_prefix_length(text: str, markers: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that could be the start of a marker."""
    for length in range(min(len(text), max(len(m) for m in markers) - 1), 0, -1):
        tail = text[-length:]
        if any(marker.startswith(tail) for marker in markers):
            return length
    return 0


class MarkerStreamParser(ABC):
    """A streaming parser that moves between states on markers.

    ``feed`` appends to the pending text and lets ``_step`` consume it until it needs more;
    ``_text_until`` emits the text before a marker, holding back an end that might still become
    one. The state ``DONE`` ignores all further input.
    """

    DONE = _DONE

    def __init__(self, state: str):
        self._state = state
        self._pending = ""
        self._carried: list[ChatEvent] = []  # events of the prompt's prefix, not yet reported

    def enter(self, prefix: str) -> None:
        """Take ``prefix``, which the prompt ends with (a forced call's opening), as output
        already written; what it produces is reported with the first output."""
        self._carried = self.feed(prefix)

    def feed(self, text: str) -> list[ChatEvent]:
        events, self._carried = self._carried, []
        if self._state != _DONE:
            self._pending += text
            self._advance(events, final=False)
        return events

    def finish(self) -> list[ChatEvent]:
        events, self._carried = self._carried, []
        if self._state != _DONE:
            self._advance(events, final=True)
        self._state, self._pending = _DONE, ""
        return events

    @property
    def reasoning(self) -> bool:
        # Subclasses name their reasoning state "reasoning" too.
        return self._state == _REASONING

    def _advance(self, events: list[ChatEvent], final: bool) -> None:
        while self._state != _DONE and self._step(events, final):
            pass

    @abstractmethod
    def _step(self, events: list[ChatEvent], final: bool) -> bool:
        """Consume pending text in the current state; False when more input is needed."""

    def _text_until(
        self,
        events: list[ChatEvent],
        markers: Sequence[str],
        delta: type[TextDelta] | type[ReasoningDelta],
        final: bool,
    ) -> str | None:
        """Emit the text before the earliest marker and drop the marker, which is returned;
        None while no marker is complete (all text that cannot begin one is emitted)."""
        hit = first_marker(self._pending, markers)
        if hit is None:
            keep = 0 if final else marker_prefix_length(self._pending, markers)
            ready, self._pending = (
                self._pending[: len(self._pending) - keep],
                self._pending[len(self._pending) - keep :],
            )
            if ready:
                events.append(delta(ready))
            return None
        position, marker = hit
        if position:
            events.append(delta(self._pending[:position]))
        self._pending = self._pending[position + len(marker) :]
        return marker
