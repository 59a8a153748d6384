"""DeepSeek-V4's chat format: OpenAI-style messages to the exact prompt the model was trained on,
and its output (reasoning, content, DSML tool-call blocks) parsed back, whole or while it streams.

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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ds4mlx.engine.chat.base import (
    ArgumentStream,
    ChatFormat,
    MarkerStreamParser,
    Message,
    StreamParser,
    enter_forced_call,
    first_marker,
    marker_prefix_length,
    tool_call_from_message,
    write_forced_prefix,
)
from ds4mlx.engine.chat.call_grammar import (
    NEWLINE,
    CallSyntax,
    Parameter,
    argument_rules,
    callable_tools,
    json_lexeme,
    literal,
    tool_name,
)
from ds4mlx.engine.chat.events import (
    AssistantTurn,
    ChatEvent,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallError,
)
from ds4mlx.engine.chat.prompt import NamedTool, PromptText, ToolChoice

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


def _preprocess(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None
) -> list[_Turn]:
    turns: list[_Turn] = []
    for message in messages:
        role = message.get("role")
        content = _text(message, "content")
        if role in ("user", "tool"):
            # Consecutive user/tool messages form one user turn [enc merge_tool_messages].
            block = (
                ("text", content, "")
                if role == "user"
                else ("tool_result", content, _text(message, "tool_call_id"))
            )
            if turns and turns[-1].role == "user":
                turns[-1].blocks.append(block)
            else:
                turns.append(_Turn("user", blocks=[block]))
        elif role == "assistant":
            calls = [tool_call_from_message(entry) for entry in message.get("tool_calls") or ()]
            turns.append(
                _Turn(
                    "assistant",
                    content,
                    reasoning=_text(message, "reasoning_content"),
                    tool_calls=[call for call, _ in calls],
                    call_ids=[call_id for _, call_id in calls],
                )
            )
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
                turn.blocks = [
                    next(ordered) if block[0] == "tool_result" else block for block in turn.blocks
                ]


def _render_tools_section(out: PromptText, tools: Sequence[Mapping[str, Any]]) -> None:
    schemas = "\n".join(
        json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools
    )
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


# --------------------------------------------------------------------------- the format


class DeepSeekV4ChatFormat(ChatFormat):
    """DeepSeek-V4's prompt encoding and DSML tool calls [enc]."""

    name = "deepseek-v4"
    call_marker = DSML
    reasoning_efforts = ("high", "max")

    def prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        thinking: bool = False,
        tool_choice: ToolChoice = "auto",
        reasoning_effort: str | None = None,
        drop_thinking: bool = True,
    ) -> PromptText:
        """Render ``messages`` the way DeepSeek's ``encode_messages`` does.

        ``thinking`` ends the prompt with ``<think>`` (else ``</think>``).  ``reasoning_effort``
        "max" prepends the maximum-effort instructions in thinking mode ("high" and None add
        nothing).  ``drop_thinking`` leaves out the reasoning of turns before the last user
        message; it has no effect when tools are offered.  ``add_generation_prompt=False`` omits
        the assistant prefix after a final user or tool message.  ``tool_choice`` as
        ``ChatFormat.prompt``.
        """
        if reasoning_effort not in (None, "high", "max"):
            raise ValueError(
                f"reasoning_effort must be None, 'high' or 'max', not {reasoning_effort!r}"
            )
        forced = self.forced_call_prefix(tool_choice)
        if tool_choice == "none":
            tools = None
        thinking = thinking and not forced
        turns = _preprocess(messages, tools)
        keep_all_reasoning = not drop_thinking or bool(tools)
        if thinking and not keep_all_reasoning:
            # Developer messages before the last user message are dropped as well [enc].
            last_user = _last_user_index(turns)
            turns = [
                turn
                for index, turn in enumerate(turns)
                if turn.role != "developer" or index >= last_user
            ]
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
                next_is_assistant or (is_last and add_generation_prompt)
            ):
                opens_thinking = thinking and (keep_all_reasoning or index >= last_user)
                out.template(ASSISTANT + (THINK_START if opens_thinking else THINK_END))
        if forced and add_generation_prompt:
            write_forced_prefix(out, forced, tool_choice)
        return out

    def forced_call_prefix(self, tool_choice: ToolChoice) -> str:
        if isinstance(tool_choice, NamedTool):
            return f'{_FORCED_BLOCK}{tool_choice.name}">\n'
        return _FORCED_BLOCK if tool_choice == "required" else ""

    def stream_parser(
        self,
        *,
        thinking: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = "auto",
        stream_arguments: bool = False,
    ) -> StreamParser:
        forced = self.forced_call_prefix(tool_choice)
        parser = DSMLStreamParser(
            thinking and not forced,
            parse_tools=tool_choice != "none",
            stream_arguments=stream_arguments,
        )
        enter_forced_call(parser, forced)
        return parser

    def call_syntax(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: ToolChoice = "auto",
        parallel: bool = True,
    ) -> CallSyntax:
        return _dsml_call_syntax(tools, tool_choice, parallel)

    def stop_strings(self) -> list[str]:
        return [EOS]


# How a forced call starts: the tool_calls block as an assistant turn without text has it.
_FORCED_BLOCK = f'\n\n<{DSML}tool_calls>\n<{DSML}invoke name="'


# --------------------------------------------------------------------------- the call grammar

_PARAMETER_END = f"</{DSML}parameter>"
_INVOKE_END = f"</{DSML}invoke>"
_PARAMETER_OPEN = f'<{DSML}parameter name="'
_RAW_VALUE, _JSON_VALUE = '" string="true">', '" string="false">'


def _dsml_parameter(parameter: Parameter, schema_bound: bool) -> str:
    """One parameter, laid out as ``_render_tool_calls`` writes it (a newline after each): a
    plain string as raw text; a string narrowed by its schema (enum, pattern, ...) as JSON
    (``string="false"``), which the parser decodes to the same string; anything else as JSON,
    held to its schema when ``schema_bound``."""
    head = _PARAMETER_OPEN + parameter.name
    if parameter.plain_string or (parameter.is_string and not schema_bound):
        return f"{literal(head + _RAW_VALUE)} raw {literal(NEWLINE)}"
    value = json_lexeme(parameter.schema if schema_bound else None)
    return f"{literal(head + _JSON_VALUE)} {value} {literal(_PARAMETER_END + NEWLINE)}"


def _dsml_call_syntax(
    tools: Sequence[Mapping[str, Any]], tool_choice: ToolChoice, parallel: bool = True
) -> CallSyntax:
    """DSML tool_calls blocks (``_render_tool_calls``'s layout) calling only ``tools``."""
    tools, forced = callable_tools(tools, tool_choice)
    rules = argument_rules(tools, forced, _dsml_parameter, "free_parameter*")
    for index, tool in enumerate(tools):
        opening = literal(tool_name(tool) + '">' + NEWLINE)
        rules.append(f"t{index}: {opening} t{index}_arguments {literal(_INVOKE_END)}")
    # Each invoke after the first starts with its newline, in one literal with the tag: two
    # literals where one starts like the other ("\n" and "\n</...") would leave the lexer
    # unable to tell where the first ends.
    invoke_open = f'<{DSML}invoke name="'
    if isinstance(tool_choice, NamedTool):
        start = f"t0_arguments {literal(_INVOKE_END)} calls_rest"
    elif forced:
        start = "invoke_named calls_rest"
    else:
        start = f"{literal('tool_calls>' + NEWLINE + invoke_open)} invoke_named calls_rest"
    more_invokes = f"({literal(NEWLINE + invoke_open)} invoke_named)* " if parallel else ""
    rules += [
        f"start: {start}",
        "invoke_named: " + " | ".join(f"t{index}" for index in range(len(tools))),
        f"calls_rest: {more_invokes}{literal(f'{NEWLINE}</{DSML}tool_calls>')}",
        f"raw[suffix={literal(_PARAMETER_END)}]: /(?s:.*)/",
        f"free_parameter: {literal(_PARAMETER_OPEN)} PARAMETER_NAME ({literal(_RAW_VALUE)} raw "
        f"{literal(NEWLINE)} | {literal(_JSON_VALUE)} {json_lexeme(None)} "
        f"{literal(_PARAMETER_END + NEWLINE)})",
        "PARAMETER_NAME: /[A-Za-z0-9_.-]+/",
    ]
    return CallSyntax(DSML, "<", NEWLINE.join(rules), forced)


def _last_user_index(turns: Sequence[_Turn]) -> int:
    return max(
        (i for i, turn in enumerate(turns) if turn.role in ("user", "developer")), default=-1
    )


DEEPSEEK_V4 = DeepSeekV4ChatFormat()


def render_chat(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    thinking: bool = False,
    **options: Any,
) -> str:
    """DeepSeek-V4 prompt text for ``messages``; ``options`` as DeepSeekV4ChatFormat.render."""
    return DEEPSEEK_V4.render(
        messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking, **options
    )


def parse_assistant(text: str, thinking: bool = False) -> AssistantTurn:
    """Split DeepSeek-V4 output into reasoning, content and tool calls; never raises on bad
    markup (see ``AssistantTurn.errors``)."""
    return DEEPSEEK_V4.parse(text, thinking=thinking)


# --------------------------------------------------------------------------- parsing DSML

_REASONING, _CONTENT, _TOOL_BLOCK, _DONE = "reasoning", "content", "tool_block", "done"
# DSML spellings accepted in output: the real one, and the first-bar-dropped drift [ds4].
_DSML_SPELLINGS = (DSML, DSML[1:])
_TOOL_BLOCK_STARTS = {
    start: dsml
    for dsml in _DSML_SPELLINGS
    # The block is separated from the content by a blank line [enc]; accept it without one.
    for start in (f"\n\n<{dsml}tool_calls>", f"<{dsml}tool_calls>")
}
_ATTRIBUTES = re.compile(r'(?:\s+[\w-]+="[^"]*")*\s*')
_ATTRIBUTE = re.compile(r'([\w-]+)="([^"]*)"')


def _attributes(tag_body: str) -> dict[str, str] | None:
    if not _ATTRIBUTES.fullmatch(tag_body):
        return None
    return dict(_ATTRIBUTE.findall(tag_body))


def _skip_whitespace(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


class DSMLStreamParser(MarkerStreamParser):
    """Reasoning until ``</think>``, then content until a DSML tool_calls block or EOS.

    A tool_calls block is buffered one invoke at a time and each invoke is reported once it is
    closed; with ``stream_arguments`` its name is reported as soon as its tag is written and
    its arguments parameter by parameter. Without ``parse_tools`` DSML markup is content like
    any other text.
    """

    def __init__(self, thinking: bool, parse_tools: bool = True, stream_arguments: bool = False):
        super().__init__(_REASONING if thinking else _CONTENT)
        self._dsml = DSML  # spelling used by the open tool_calls block
        self._content_markers = (*_TOOL_BLOCK_STARTS, EOS) if parse_tools else (EOS,)
        self._stream_arguments = stream_arguments
        self._arguments = ArgumentStream()  # the open invoke's, when streamed

    def _step(self, events: list[ChatEvent], final: bool) -> bool:
        if self._state == _TOOL_BLOCK:
            return self._scan_tool_block(events, final)
        if self._state == _REASONING:
            marker = self._text_until(events, (THINK_END, EOS), ReasoningDelta, final)
        else:
            if final:
                self._cut_block_start(events)
            marker = self._text_until(events, self._content_markers, TextDelta, final)
        if marker is None:
            return False
        if marker == EOS:
            self._state = _DONE
        elif marker == THINK_END:
            self._state = _CONTENT
        else:
            self._state, self._dsml = _TOOL_BLOCK, _TOOL_BLOCK_STARTS[marker]
        return True

    def _cut_block_start(self, events: list[ChatEvent]) -> None:
        """At the end of the output, report a tool_calls opening tag that was cut off (its
        ``<｜`` or more written) as an unterminated call, not as text."""
        if self._content_markers == (EOS,) or first_marker(self._pending, self._content_markers):
            return
        held = marker_prefix_length(self._pending, tuple(_TOOL_BLOCK_STARTS))
        tail = self._pending[len(self._pending) - held :] if held else ""
        if not tail.lstrip("\n").startswith(("<｜", "<D")):
            return
        text, self._pending = self._pending[: len(self._pending) - held], ""
        if text:
            events.append(TextDelta(text))
        events.append(ToolCallError(tail, "unterminated tool_calls block", unterminated=True))

    def _report_progress(self, events: list[ChatEvent], invoke: _Invoke) -> None:
        """With ``stream_arguments``: the invoke's name once, then each parameter not yet
        reported, as pieces of the JSON object its call's arguments will be (closed with the
        invoke). Nothing more once something is wrong with it."""
        if not self._stream_arguments or invoke.problems or invoke.name is None:
            return
        self._arguments.announce(events, invoke.name)
        self._arguments.arguments(events, list(invoke.arguments.items()))
        if invoke.length is not None:
            self._arguments.close(events)

    def _scan_tool_block(self, events: list[ChatEvent], final: bool) -> bool:
        """Report the block's complete invokes; True once the block is closed."""
        # EOS cannot occur inside a block: everything before it is all the block will get.
        eos = self._pending.find(EOS)
        ended = final or eos >= 0
        block = self._pending if eos < 0 else self._pending[:eos]
        after_block = self._pending[len(block) :]
        block_end = f"</{self._dsml}tool_calls>"
        invoke_start = f"<{self._dsml}invoke"
        while True:
            rest = block[_skip_whitespace(block, 0) :]
            if rest.startswith(block_end):
                self._pending = rest[len(block_end) :] + after_block
                self._state = _CONTENT
                return True
            if rest.startswith(invoke_start):
                invoke = _scan_invoke(rest, self._dsml)
                if invoke is not None:
                    self._report_progress(events, invoke)
                    if invoke.length is not None:
                        events.append(invoke.event(rest))
                        self._arguments.reset()
                        block = rest[invoke.length :]
                        continue
            elif rest and not (invoke_start.startswith(rest) or block_end.startswith(rest)):
                garbage_end = rest.find(block_end)
                if garbage_end >= 0:
                    events.append(
                        ToolCallError(rest[:garbage_end], "unexpected text in tool_calls block")
                    )
                    block = rest[garbage_end:]
                    continue
            break
        if ended:
            if rest:
                events.append(
                    ToolCallError(rest, "unterminated tool_calls block", unterminated=True)
                )
            self._state, self._pending = _DONE, ""
        else:
            self._pending = block
        return False


@dataclass
class _Invoke:
    """What of an invoke has been written: its name, its complete parameters in order, what is
    wrong with it; ``length`` once it is closed."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    length: int | None = None

    def event(self, text: str) -> ChatEvent:
        """The closed invoke (``text`` starts with it): the call, or an error."""
        if self.problems or self.name is None:
            return ToolCallError(text[: self.length], "; ".join(self.problems))
        return ToolCallComplete(ToolCall(self.name, self.arguments))


def _scan_invoke(text: str, dsml: str) -> _Invoke | None:
    """Parse the invoke at the start of ``text`` as far as it is written; None while its tag
    is incomplete."""
    invoke_end = f"</{dsml}invoke>"
    parameter_start = f"<{dsml}parameter"
    parameter_end = f"</{dsml}parameter>"

    tag_close = text.find(">")
    if tag_close < 0:
        return None
    invoke = _Invoke((_attributes(text[len(f"<{dsml}invoke") : tag_close]) or {}).get("name"))
    if invoke.name is None:
        invoke.problems.append("invoke tag without a name")
    position = tag_close + 1
    while True:
        position = _skip_whitespace(text, position)
        rest = text[position:]
        if rest.startswith(invoke_end):
            invoke.length = position + len(invoke_end)
            return invoke
        if rest.startswith(parameter_start):
            tag_close = text.find(">", position)
            value_end = text.find(parameter_end, tag_close + 1) if tag_close >= 0 else -1
            if value_end < 0:
                return invoke
            problem = _add_parameter(
                invoke.arguments,
                text[position + len(parameter_start) : tag_close],
                text[tag_close + 1 : value_end],
            )
            if problem:
                invoke.problems.append(problem)
            position = value_end + len(parameter_end)
        elif invoke_end.startswith(rest) or parameter_start.startswith(rest):
            return invoke
        else:
            invoke.problems.append("unexpected text in invoke")
            skip_to = text.find(invoke_end, position)
            if skip_to >= 0:
                invoke.length = skip_to + len(invoke_end)
            return invoke


def _add_parameter(arguments: dict[str, Any], tag_body: str, raw_value: str) -> str | None:
    """Decode one parameter into ``arguments``; returns what is wrong with it, if anything."""
    attributes = _attributes(tag_body)
    if attributes is None or "name" not in attributes:
        return "parameter tag without a name"
    name = attributes["name"]
    if name in arguments:
        return f"duplicate parameter {name!r}"
    is_string = attributes.get("string", "true")  # a missing flag means a string [ds4]
    if is_string == "true":
        arguments[name] = raw_value
    elif is_string == "false":
        try:
            arguments[name] = json.loads(raw_value)
        except json.JSONDecodeError:
            return f'parameter {name!r} is marked string="false" but is not JSON'
    else:
        return f"parameter {name!r} has string={is_string!r}"
    return None
