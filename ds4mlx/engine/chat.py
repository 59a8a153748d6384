"""Chat templates: messages to prompt text, and model output back to reasoning, content and tools.

A :class:`ChatFormat` renders OpenAI-style messages (dicts with ``role``, ``content``, and for
assistants ``reasoning_content`` and ``tool_calls``; for tools ``tool_call_id``) into the exact
prompt a model was trained on, and parses what the model writes, whole or while streaming.
DeepSeek-V4 is implemented here; GLM-5.3-Flash's XML-style ``<tool_call>`` format is the
subclass in ``ds4mlx.engine.chat_glm``.

DeepSeek-V4 facts and where they come from:
- [enc] DeepSeek's reference encoder ``encoding/encoding_dsv4.py`` in the DeepSeek-V4-Flash model
  repository (the README beside it documents the format): special tokens, the tools section text,
  DSML tool-call layout, ``<tool_result>`` wrapping, tool messages merged into user turns and
  sorted by call order, when reasoning is kept (``drop_thinking``), the reasoning-effort prefix.
- [vllm] vLLM's DeepSeek-V4 tokenizer wrapper: request-level ``tools`` are attached to the first
  system message, or to an empty system message inserted at the front.
- [ds4] antirez/ds4 ``ds4_server.c`` (parse_generated_message_ex): DSML inside unfinished
  reasoning is reasoning text; models sometimes drop the first bar (``<DSML｜tool_calls>``);
  whitespace between tags is tolerated; a parameter without ``string=`` is a string.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ds4mlx.engine.chat_prompt import NamedTool, PromptText, ToolChoice, encode_prompt
from ds4mlx.engine.tokenizer import TextTokenizer

# Special tokens [enc].
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"

# Written before the first message in thinking mode with reasoning_effort="max" [enc].
REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

# Appended to the system message when tools are offered [enc TOOLS_TEMPLATE].
_TOOLS_SECTION = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by \
writing a "<{DSML}tool_calls>" block like the following:

<{DSML}tool_calls>
<{DSML}invoke name="$TOOL_NAME">
<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{DSML}parameter>
...
</{DSML}invoke>
<{DSML}invoke name="$TOOL_NAME2">
...
</{DSML}invoke>
</{DSML}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types \
(numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {THINK_START}), you MUST output your complete reasoning \
inside {THINK_START}...{THINK_END} BEFORE any tool calls or final response.

Otherwise, output directly after {THINK_END} with tool calls or final response.

### Available Tool Schemas

{{schemas}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""

Message = Mapping[str, Any]


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


ChatEvent = (TextDelta | ReasoningDelta | ToolCallComplete | ToolCallError | ToolCallStart
             | ToolCallArguments)


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
        for key, value in arguments[self.sent:]:
            separator = ", " if self.sent else "{"
            events.append(ToolCallArguments(f"{separator}{json.dumps(key, ensure_ascii=False)}: "
                                            f"{json.dumps(value, ensure_ascii=False)}"))
            self.sent += 1

    def close(self, events: list[ChatEvent]) -> None:
        events.append(ToolCallArguments("}" if self.sent else "{}"))


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
    #: The ``reasoning_effort`` values ``render`` accepts, weakest first.
    reasoning_efforts: tuple[str, ...] = ()

    def template_effort(self, effort: str) -> str | None:
        """The template's effort for a requested one (a REASONING_EFFORT_ORDER name): the
        strongest it has that is not stronger, else its weakest; None for a template that takes
        none. "max" must be one of its own: without a maximum mode it raises ValueError."""
        if effort not in REASONING_EFFORT_ORDER:
            raise ValueError(f"reasoning effort must be one of {REASONING_EFFORT_ORDER}, "
                             f"got {effort!r}")
        if effort == "max" and "max" not in self.reasoning_efforts:
            raise ValueError(f"the {self.name} chat template has no 'max' reasoning effort")
        if not self.reasoning_efforts:
            return None
        rank = REASONING_EFFORT_ORDER.index
        weaker = [e for e in self.reasoning_efforts if rank(e) <= rank(effort)]
        return weaker[-1] if weaker else self.reasoning_efforts[0]

    @abstractmethod
    def prompt(self, messages: Sequence[Message],
               tools: Sequence[Mapping[str, Any]] | None = None, *,
               add_generation_prompt: bool = True, thinking: bool = False,
               tool_choice: ToolChoice = "auto", **options: Any) -> PromptText:
        """The prompt for ``messages``, the template's pieces apart from the caller's.
        ``tool_choice`` "none" renders no tools; a forced choice ("required", a NamedTool)
        renders without reasoning and ends with the opening of a call."""

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
               *, add_generation_prompt: bool = True, thinking: bool = False,
               **options: Any) -> str:
        """The prompt text for ``messages`` (special tokens written as text); ``options`` as
        the format's ``prompt``."""
        return str(self.prompt(messages, tools, add_generation_prompt=add_generation_prompt,
                               thinking=thinking, **options))

    def tokenize(self, tokenizer: TextTokenizer, messages: Sequence[Message],
                 tools: Sequence[Mapping[str, Any]] | None = None, *, thinking: bool = False,
                 **options: Any) -> list[int]:
        """The prompt's token ids: special tokens only where the template wrote them, so text
        in the messages and tools is never read as a turn boundary."""
        return encode_prompt(tokenizer, self.prompt(messages, tools, thinking=thinking,
                                                    **options))

    @abstractmethod
    def forced_call_prefix(self, tool_choice: ToolChoice) -> str:
        """What a forced ``tool_choice`` puts at the end of the prompt: the opening of a call
        (of the named function, for a NamedTool); "" for "auto" and "none"."""

    @abstractmethod
    def stream_parser(self, *, thinking: bool = False,
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      tool_choice: ToolChoice = "auto",
                      stream_arguments: bool = False) -> StreamParser:
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


# --------------------------------------------------------------------------- rendering


@dataclass
class _Turn:
    """A message after DeepSeek's preprocessing: tool results live in user turns as blocks."""

    role: str
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    call_ids: list[str | None] = field(default_factory=list)
    # User turns: ("text", text, "") or ("tool_result", text, tool_call_id).
    blocks: list[tuple[str, str, str]] = field(default_factory=list)
    tools: Sequence[Mapping[str, Any]] = ()


def _text(message: Message, key: str) -> str:
    value = message.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"message {key} must be a string, got {type(value).__name__}")
    return value


def _tool_call_from_message(entry: ToolCall | Mapping[str, Any]) -> tuple[ToolCall, str | None]:
    """A ToolCall and its id from a ToolCall or an OpenAI ``{"id", "function": {...}}`` entry."""
    if isinstance(entry, ToolCall):
        return entry, None
    function = entry.get("function", entry)
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        # Unparseable argument strings are kept whole under "arguments" [enc].
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = {"arguments": arguments}
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    return ToolCall(function["name"], arguments), entry.get("id")


def _preprocess(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None
                ) -> list[_Turn]:
    turns: list[_Turn] = []
    for message in messages:
        role = message.get("role")
        content = _text(message, "content")
        if role in ("user", "tool"):
            # Consecutive user/tool messages form one user turn [enc merge_tool_messages].
            block = (("text", content, "") if role == "user"
                     else ("tool_result", content, _text(message, "tool_call_id")))
            if turns and turns[-1].role == "user":
                turns[-1].blocks.append(block)
            else:
                turns.append(_Turn("user", blocks=[block]))
        elif role == "assistant":
            calls = [_tool_call_from_message(entry) for entry in message.get("tool_calls") or ()]
            turns.append(_Turn("assistant", content,
                               reasoning=_text(message, "reasoning_content"),
                               tool_calls=[call for call, _ in calls],
                               call_ids=[call_id for _, call_id in calls]))
        elif role in ("system", "developer"):
            turns.append(_Turn(role, content))
        else:
            raise ValueError(f"unsupported message role {role!r}")
    if tools:
        # Request-level tools go on the first system message, or a new empty one [vllm].
        if not turns or turns[0].role != "system":
            turns.insert(0, _Turn("system"))
        turns[0].tools = tools
    _sort_tool_results_by_call_order(turns)
    return turns


def _sort_tool_results_by_call_order(turns: list[_Turn]) -> None:
    """Tool results follow the order of the calls that produced them [enc]."""
    call_order: dict[str, int] = {}
    for turn in turns:
        if turn.role == "assistant" and turn.tool_calls:
            call_order = {call_id: i for i, call_id in enumerate(turn.call_ids) if call_id}
        elif turn.role == "user" and call_order:
            results = [block for block in turn.blocks if block[0] == "tool_result"]
            if len(results) > 1:
                ordered = iter(sorted(results, key=lambda block: call_order.get(block[2], 0)))
                turn.blocks = [next(ordered) if block[0] == "tool_result" else block
                               for block in turn.blocks]


def _render_tools_section(out: PromptText, tools: Sequence[Mapping[str, Any]]) -> None:
    schemas = "\n".join(json.dumps(tool.get("function", tool), ensure_ascii=False)
                        for tool in tools)
    before, _, after = _TOOLS_SECTION.partition("{schemas}")
    out.template(before)
    out.caller(schemas)
    out.template(after)


def _render_tool_calls(out: PromptText, calls: Sequence[ToolCall]) -> None:
    out.template(f"\n\n<{DSML}tool_calls>\n")
    for index, call in enumerate(calls):
        out.template("\n" if index else "", f'<{DSML}invoke name="')
        out.caller(call.name)
        out.template('">\n')
        for position, (key, value) in enumerate(call.arguments.items()):
            is_string = isinstance(value, str)
            out.template("\n" if position else "", f'<{DSML}parameter name="')
            out.caller(key)
            out.template(f'" string="{"true" if is_string else "false"}">')
            out.caller(value if is_string else json.dumps(value, ensure_ascii=False))
            out.template(f"</{DSML}parameter>")
        out.template(f"\n</{DSML}invoke>")
    out.template(f"\n</{DSML}tool_calls>")


def _render_user_blocks(out: PromptText, blocks: Sequence[tuple[str, str, str]]) -> None:
    for index, (kind, text, _) in enumerate(blocks):
        out.template("\n\n" if index else "")
        if kind == "text":
            out.caller(text)
        else:
            out.template("<tool_result>")
            out.caller(text)
            out.template("</tool_result>")


# --------------------------------------------------------------------------- parsing

_REASONING, _CONTENT, _DONE = "reasoning", "content", "done"
def _first_marker(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    """The earliest complete marker in ``text`` (the longest one when several start there)."""
    best: tuple[int, str] | None = None
    for marker in markers:
        position = text.find(marker)
        if position >= 0 and (best is None or position < best[0]
                              or (position == best[0] and len(marker) > len(best[1]))):
            best = (position, marker)
    return best


def _marker_prefix_length(text: str, markers: Sequence[str]) -> int:
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

    def _text_until(self, events: list[ChatEvent], markers: Sequence[str],
                    delta: type[TextDelta] | type[ReasoningDelta], final: bool) -> str | None:
        """Emit the text before the earliest marker and drop the marker, which is returned;
        None while no marker is complete (all text that cannot begin one is emitted)."""
        hit = _first_marker(self._pending, markers)
        if hit is None:
            keep = 0 if final else _marker_prefix_length(self._pending, markers)
            ready, self._pending = (self._pending[:len(self._pending) - keep],
                                    self._pending[len(self._pending) - keep:])
            if ready:
                events.append(delta(ready))
            return None
        position, marker = hit
        if position:
            events.append(delta(self._pending[:position]))
        self._pending = self._pending[position + len(marker):]
        return marker


# --------------------------------------------------------------------------- the format


class DeepSeekV4ChatFormat(ChatFormat):
    """DeepSeek-V4's prompt encoding and DSML tool calls [enc]."""

    name = "deepseek-v4"
    reasoning_efforts = ("high", "max")

    def prompt(self, messages: Sequence[Message],
               tools: Sequence[Mapping[str, Any]] | None = None, *,
               add_generation_prompt: bool = True, thinking: bool = False,
               tool_choice: ToolChoice = "auto", reasoning_effort: str | None = None,
               drop_thinking: bool = True) -> PromptText:
        """Render ``messages`` the way DeepSeek's ``encode_messages`` does.

        ``thinking`` ends the prompt with ``<think>`` (else ``</think>``).  ``reasoning_effort``
        "max" prepends the maximum-effort instructions in thinking mode ("high" and None add
        nothing).  ``drop_thinking`` leaves out the reasoning of turns before the last user
        message; it has no effect when tools are offered.  ``add_generation_prompt=False`` omits
        the assistant prefix after a final user or tool message.  ``tool_choice`` as
        ``ChatFormat.prompt``.
        """
        if reasoning_effort not in (None, "high", "max"):
            raise ValueError(f"reasoning_effort must be None, 'high' or 'max', "
                             f"not {reasoning_effort!r}")
        forced = self.forced_call_prefix(tool_choice)
        if tool_choice == "none":
            tools = None
        thinking = thinking and not forced
        turns = _preprocess(messages, tools)
        keep_all_reasoning = not drop_thinking or bool(tools)
        if thinking and not keep_all_reasoning:
            # Developer messages before the last user message are dropped as well [enc].
            last_user = _last_user_index(turns)
            turns = [turn for index, turn in enumerate(turns)
                     if turn.role != "developer" or index >= last_user]
        last_user = _last_user_index(turns)

        out = PromptText()
        out.template(BOS)
        if turns and thinking and reasoning_effort == "max":
            out.template(REASONING_EFFORT_MAX)
        for index, turn in enumerate(turns):
            if turn.role == "system":
                out.caller(turn.content)
                if turn.tools:
                    out.template("\n\n")
                    _render_tools_section(out, turn.tools)
            elif turn.role == "developer":
                out.template(USER)
                out.caller(turn.content)
            elif turn.role == "user":
                out.template(USER)
                _render_user_blocks(out, turn.blocks)
            else:
                if thinking and (keep_all_reasoning or index > last_user):
                    out.caller(turn.reasoning)
                    out.template(THINK_END)
                out.caller(turn.content)
                if turn.tool_calls:
                    _render_tool_calls(out, turn.tool_calls)
                out.template(EOS)

            # The assistant prefix belongs to the user turn before it [enc render_message].
            is_last = index + 1 == len(turns)
            next_is_assistant = not is_last and turns[index + 1].role == "assistant"
            if turn.role in ("user", "developer") and (
                    next_is_assistant or (is_last and add_generation_prompt)):
                opens_thinking = thinking and (keep_all_reasoning or index >= last_user)
                out.template(ASSISTANT + (THINK_START if opens_thinking else THINK_END))
        if forced and add_generation_prompt:
            _write_forced_prefix(out, forced, tool_choice)
        return out

    def forced_call_prefix(self, tool_choice: ToolChoice) -> str:
        if isinstance(tool_choice, NamedTool):
            return f'{_FORCED_BLOCK}{tool_choice.name}">\n'
        return _FORCED_BLOCK if tool_choice == "required" else ""

    def stream_parser(self, *, thinking: bool = False,
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      tool_choice: ToolChoice = "auto",
                      stream_arguments: bool = False) -> StreamParser:
        from ds4mlx.engine.chat_dsml import DSMLStreamParser  # it imports this module

        forced = self.forced_call_prefix(tool_choice)
        parser = DSMLStreamParser(thinking and not forced, parse_tools=tool_choice != "none",
                                  stream_arguments=stream_arguments)
        _enter_forced_call(parser, forced)
        return parser

    def stop_strings(self) -> list[str]:
        return [EOS]


# How a forced call starts: the tool_calls block as an assistant turn without text has it.
_FORCED_BLOCK = f'\n\n<{DSML}tool_calls>\n<{DSML}invoke name="'


def _write_forced_prefix(out: PromptText, prefix: str, tool_choice: ToolChoice) -> None:
    """``prefix`` into the prompt, a named function's name as the caller's text."""
    if isinstance(tool_choice, NamedTool):
        head, name, tail = prefix.partition(tool_choice.name)
        out.template(head)
        out.caller(name)
        out.template(tail)
    else:
        out.template(prefix)


def _enter_forced_call(parser: MarkerStreamParser, prefix: str) -> None:
    """Bring ``parser`` to where the prompt's forced call prefix left the model."""
    if prefix:
        parser.enter(prefix)


def _last_user_index(turns: Sequence[_Turn]) -> int:
    return max((i for i, turn in enumerate(turns) if turn.role in ("user", "developer")),
               default=-1)


DEEPSEEK_V4 = DeepSeekV4ChatFormat()

# general.architecture values (llama.cpp names) whose chat format is implemented.
_FORMATS_BY_ARCH: dict[str, ChatFormat] = {"deepseek4": DEEPSEEK_V4}


def chat_format_for_arch(arch: str) -> ChatFormat | None:
    """The chat format for a GGUF ``general.architecture``, or None when none is implemented."""
    if arch == "glm5-next":
        from ds4mlx.engine.chat_glm import GLM5  # imported here: chat_glm imports this module

        return GLM5
    return _FORMATS_BY_ARCH.get(arch)


def render_chat(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
                add_generation_prompt: bool = True, thinking: bool = False, **options: Any) -> str:
    """DeepSeek-V4 prompt text for ``messages``; ``options`` as DeepSeekV4ChatFormat.render."""
    return DEEPSEEK_V4.render(messages, tools, add_generation_prompt=add_generation_prompt,
                              thinking=thinking, **options)


def parse_assistant(text: str, thinking: bool = False) -> AssistantTurn:
    """Split DeepSeek-V4 output into reasoning, content and tool calls; never raises on bad
    markup (see ``AssistantTurn.errors``)."""
    return DEEPSEEK_V4.parse(text, thinking=thinking)
