"""GLM-5.3-Flash's chat template and its XML-style ``<tool_call>`` syntax.

Facts and where they come from:
- [tmpl] The released ``zai-org/GLM-5.3-Flash`` ``chat_template.jinja`` (revision eb9eb208),
  as mirrored by NVIDIA NeMo Automodel's ``glm5_3_flash_training_chat_template.jinja``, which
  renders byte-identically apart from training markers, and the released renderings quoted in
  that repository's tests: ``[gMASK]<sop>``, then always a ``<|system|>Reasoning Effort: Max``
  (or ``High`` / ``Low``) turn; the tools section; turns opened by ``<|user|>``,
  ``<|assistant|>``, ``<|system|>`` and ``<|observation|>`` (one for a run of tool results) with
  no separators; every assistant turn starts ``<think>...</think>`` (``<think></think>`` without
  reasoning; earlier reasoning is kept unless ``clear_thinking``); tool calls
  ``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>`` right after the
  stripped content, string values raw and others as JSON; tool results as
  ``<tool_response>...</tool_response>``, sorted into the order of the calls when every result
  names a distinct call; ``tool_reference`` results expand to the referenced tools' schemas; the
  generation prompt is ``<|assistant|><think>``. An assistant turn ends with the next role token:
  generation stops at ``<|user|>`` or ``<|observation|>`` (both in the model's
  ``eos_token_id``) or ``<|endoftext|>``.
- [llama.cpp] ``common/chat-peg-parser.cpp`` (tagged ``arg_key``/``arg_value`` tools): a value
  whose schema type is ``string`` is literal text, any other value is JSON.
- [harness] ``zai-org/GLM-5`` ``harness.py`` (``parse_tool_calls``): without a schema a value is
  JSON when it parses, else text; the name is the text before the first ``<arg_key>``;
  whitespace between the tags (GLM-4.5/4.6's layout) is tolerated.

One addition of ours: the released template has no thinking switch and always ends the prompt
with ``<|assistant|><think>`` (``thinking=True`` here). ``thinking=False`` (the ChatFormat
default) closes the block, ``<|assistant|><think></think>``, as the template renders an
assistant turn without reasoning.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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

PREFIX = "[gMASK]<sop>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
OBSERVATION = "<|observation|>"
END_OF_TEXT = "<|endoftext|>"
THINK_START = "<think>"
THINK_END = "</think>"
CALL_START, CALL_END = "<tool_call>", "</tool_call>"
KEY_START, KEY_END = "<arg_key>", "</arg_key>"
VALUE_START, VALUE_END = "<arg_value>", "</arg_value>"
REASONING_EFFORTS = ("low", "high", "max")

_TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
)
_TOOLS_FOOTER = (
    "</tools>\n\n"
    "For each function call, output the function name and arguments within the following XML "
    "format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)
_MEDIA = {
    "image": "<|begin_of_image|><|image|><|end_of_image|>",
    "image_url": "<|begin_of_image|><|image|><|end_of_image|>",
    "video": "<|begin_of_video|><|video|><|end_of_video|>",
    "video_url": "<|begin_of_video|><|video|><|end_of_video|>",
    "audio": "<|begin_of_audio|><|end_of_audio|>",
    "audio_url": "<|begin_of_audio|><|end_of_audio|>",
    "input_audio": "<|begin_of_audio|><|end_of_audio|>",
}


# --------------------------------------------------------------------------- rendering


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("function", tool)


def _tool_json(tool: Mapping[str, Any]) -> str:
    """A tool's schema line: its keys in order, without ``defer_loading`` and ``strict``."""
    return json.dumps(
        {k: v for k, v in _function(tool).items() if k not in ("defer_loading", "strict")},
        ensure_ascii=False,
    )


def _visible_text(content: Any) -> str:
    """Text of a message content: a string, or a list of parts (media become placeholders)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        out = []
        for item in content:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, Mapping) and item.get("type") == "text":
                out.append(item.get("text", ""))
            elif isinstance(item, Mapping):
                out.append(_MEDIA.get(item.get("type"), ""))
        return "".join(out)
    return str(content)


def _is_tool_reference(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) > 0
        and isinstance(value[0], Mapping)
        and value[0].get("type") == "tool_reference"
    )


def _tool_response(out: PromptText, value: Any, tools: Sequence[Mapping[str, Any]]) -> None:
    """One result: text, or the schemas of the tools a ``tool_reference`` list names."""
    if _is_tool_reference(value):
        names = [ref.get("name") for ref in value]
        schemas = "".join(
            _tool_json(tool) + "\n"
            for name in names
            for tool in tools
            if _function(tool).get("name") == name
        )
        out.template("<tool_response><tools>\n")
        out.caller(schemas)
        out.template("</tools></tool_response>")
        return
    out.template("<tool_response>")
    _caller_text(out, value)
    out.template("</tool_response>")


def _caller_text(out: PromptText, content: Any) -> None:
    """Message content: the caller's text, with the template's media placeholders."""
    if isinstance(content, Sequence) and not isinstance(content, str):
        for item in content:
            if isinstance(item, Mapping) and item.get("type") in _MEDIA:
                out.template(_MEDIA[item["type"]])
            else:
                out.caller(_visible_text([item]))
    else:
        out.caller(_visible_text(content))


def _result_id(entry: Mapping[str, Any]) -> str:
    return str(entry.get("tool_call_id") or entry.get("id") or "")


def _result_entries(message: Message) -> list[tuple[str, Any]]:
    """(id, value) of each result a tool message holds: itself, or each entry of a list of
    ``{"output": ...}`` results."""
    content = message.get("content")
    if (
        isinstance(content, Sequence)
        and not isinstance(content, str)
        and content
        and isinstance(content[0], Mapping)
        and "output" in content[0]
    ):
        return [(_result_id(entry), entry.get("output")) for entry in content]
    return [(_result_id(message), content)]


def _render_results(
    out: PromptText,
    run: Sequence[Message],
    calls: Sequence[Any],
    tools: Sequence[Mapping[str, Any]],
) -> None:
    """A run of tool messages, in the order of ``calls`` (the assistant's tool_calls before the
    run) when every result names a distinct one of them and the calls' ids are distinct."""
    entries = [entry for message in run for entry in _result_entries(message)]
    ids = [entry_id for entry_id, _ in entries]
    call_ids = [str(call.get("id") or "") if isinstance(call, Mapping) else "" for call in calls]
    sortable = (
        bool(calls)
        and all(ids)
        and len(set(ids)) == len(ids)
        and set(ids) <= set(call_ids)
        and all(call_ids)
        and len(set(call_ids)) == len(call_ids)
    )
    if sortable:
        by_id = dict(entries)
        entries = [(call_id, by_id[call_id]) for call_id in call_ids if call_id in by_id]
    for _, value in entries:
        _tool_response(out, value, tools)


def _render_tool_call(out: PromptText, entry: ToolCall | Mapping[str, Any]) -> None:
    call, _ = tool_call_from_message(entry)
    out.template(CALL_START)
    out.caller(call.name)
    for key, value in call.arguments.items():
        out.template(KEY_START)
        out.caller(key)
        out.template(KEY_END + VALUE_START)
        out.caller(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
        out.template(VALUE_END)
    out.template(CALL_END)


def _split_reasoning(message: Message) -> tuple[str | None, str]:
    """(reasoning or None, answer) of an assistant message; reasoning may also be written
    inline as ``<think>...</think>`` in the content."""
    content = _visible_text(message.get("content"))
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning, content
    if THINK_END in content:
        before, _, after = content.rpartition(THINK_END)
        return before.split(THINK_END)[0].split(THINK_START)[-1], after
    return None, content


class GLM5ChatFormat(ChatFormat):
    """GLM-5.3-Flash's prompt template and ``<tool_call>`` output syntax [tmpl]."""

    name = "glm-5"
    call_marker = CALL_START
    reasoning_efforts = REASONING_EFFORTS

    def prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        thinking: bool = False,
        tool_choice: ToolChoice = "auto",
        reasoning_effort: str | None = None,
        clear_thinking: bool = False,
    ) -> PromptText:
        """Render ``messages`` as the released template does.

        ``reasoning_effort`` "low", "high" or "max" (None: "max") is stated in the system turn
        every prompt starts with. ``clear_thinking`` drops the reasoning of assistant turns
        before the last user message. ``thinking=False`` closes the generation prompt's
        thinking block (see the module notes). ``tool_choice`` as ``ChatFormat.prompt``.
        """
        effort = reasoning_effort or "max"
        if effort not in REASONING_EFFORTS:
            raise ValueError(
                f"reasoning_effort must be one of {REASONING_EFFORTS} or None, "
                f"not {reasoning_effort!r}"
            )
        forced = self.forced_call_prefix(tool_choice)
        thinking = thinking and not forced
        tools = [] if tool_choice == "none" else list(tools or ())
        out = PromptText()
        out.template(PREFIX, f"{SYSTEM}Reasoning Effort: {effort.capitalize()}")
        if tools:
            schemas = "".join(
                _tool_json(tool) + "\n"
                for tool in tools
                if not _function(tool).get("defer_loading")
            )
            out.template(f"{SYSTEM}\n{_TOOLS_HEADER}")
            out.caller(schemas)
            out.template(_TOOLS_FOOTER)
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        index = 0
        while index < len(messages):
            message, role = messages[index], messages[index].get("role")
            if role in ("user", "system", "developer"):
                # GLM's template has no developer role; OpenAI's developer message is the newer
                # name of a system message, so it takes the system marker.
                out.template(USER if role == "user" else SYSTEM)
                _caller_text(out, message.get("content"))
            elif role == "assistant":
                reasoning, content = _split_reasoning(message)
                keep = reasoning is not None and (not clear_thinking or index > last_user)
                out.template(ASSISTANT + THINK_START)
                out.caller(reasoning if keep and reasoning else "")
                out.template(THINK_END)
                out.caller(content.strip())
                for call in message.get("tool_calls") or ():
                    _render_tool_call(out, call)
            elif role == "tool":
                end = index
                while end < len(messages) and messages[end].get("role") == "tool":
                    end += 1
                previous = messages[index - 1] if index else {}
                calls = (
                    (previous.get("tool_calls") or ())
                    if previous.get("role") == "assistant"
                    else ()
                )
                out.template(OBSERVATION)
                _render_results(out, messages[index:end], calls, tools)
                index = end
                continue
            else:
                raise ValueError(f"unsupported message role {role!r}")
            index += 1
        if add_generation_prompt:
            out.template(ASSISTANT + THINK_START + ("" if thinking else THINK_END))
            if forced:
                write_forced_prefix(out, forced, tool_choice)
        return out

    def forced_call_prefix(self, tool_choice: ToolChoice) -> str:
        if isinstance(tool_choice, NamedTool):
            return CALL_START + tool_choice.name
        return CALL_START if tool_choice == "required" else ""

    def stream_parser(
        self,
        *,
        thinking: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = "auto",
        stream_arguments: bool = False,
    ) -> StreamParser:
        """``tools`` (the offered schemas) decide which argument values are literal strings."""
        forced = self.forced_call_prefix(tool_choice)
        parser = _GLMStreamParser(
            thinking and not forced,
            tools or (),
            parse_tools=tool_choice != "none",
            stream_arguments=stream_arguments,
        )
        enter_forced_call(parser, forced)
        return parser

    def parse(
        self, text: str, *, thinking: bool = False, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> AssistantTurn:
        parser = self.stream_parser(thinking=thinking, tools=tools)
        return AssistantTurn.from_events([*parser.feed(text), *parser.finish()])

    def call_syntax(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: ToolChoice = "auto",
        parallel: bool = True,
    ) -> CallSyntax:
        return _glm_call_syntax(tools, tool_choice, parallel)

    def stop_strings(self) -> list[str]:
        return [USER, OBSERVATION, END_OF_TEXT]


# --------------------------------------------------------------------------- the call grammar


def _glm_argument(parameter: Parameter, schema_bound: bool) -> str:
    """One argument: its key, then its value and closing tag: a string-typed value as literal
    text (one of its ``enum`` when held to the schema), any other as JSON, held to its schema
    when ``schema_bound`` (the parser reads it back as ``_string_parameters`` says)."""
    key = literal(KEY_START + parameter.name + KEY_END + VALUE_START)
    return f"{key} {_glm_value(parameter, schema_bound)}"


def _glm_value(parameter: Parameter, schema_bound: bool) -> str:
    if parameter.is_string:
        choices = parameter.schema.get("enum") if schema_bound else None
        if isinstance(choices, list) and all(isinstance(choice, str) for choice in choices):
            options = " | ".join(literal(choice) for choice in choices)
            return f"({options}) {literal(VALUE_END)}"
        return "raw"
    return f"{json_lexeme(parameter.schema if schema_bound else None)} {literal(VALUE_END)}"


def _glm_call_syntax(
    tools: Sequence[Mapping[str, Any]], tool_choice: ToolChoice, parallel: bool = True
) -> CallSyntax:
    """``<tool_call>`` calls (``_render_tool_call``'s layout) of ``tools`` only, one after
    another until the turn ends."""
    tools, forced = callable_tools(tools, tool_choice)
    rules = argument_rules(tools, forced, _glm_argument, "free_argument*")
    for index, tool in enumerate(tools):
        rules.append(f"t{index}: {literal(tool_name(tool))} t{index}_arguments {literal(CALL_END)}")
    more_calls = " more_calls" if parallel else ""
    start = (
        f"t0_arguments {literal(CALL_END)}{more_calls}"
        if isinstance(tool_choice, NamedTool)
        else f"call{more_calls}"
    )
    rules += [
        f"start: {start}",
        "call: " + " | ".join(f"t{index}" for index in range(len(tools))),
        f"more_calls: ({literal(CALL_START)} call)*",
        f"raw[suffix={literal(VALUE_END)}]: /(?s:.*)/",
        f"free_argument: {literal(KEY_START)} ARGUMENT_NAME {literal(KEY_END + VALUE_START)} raw",
        "ARGUMENT_NAME: /[A-Za-z0-9_.-]+/",
    ]
    return CallSyntax(CALL_START, "", "\n".join(rules), forced)


# --------------------------------------------------------------------------- parsing

_REASONING, _CONTENT, _CALL = "reasoning", "content", "call"
_STOPS = (USER, OBSERVATION, END_OF_TEXT)


def _string_parameters(tools: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Per tool name, the parameters its schema types as strings [llama.cpp]."""
    out: dict[str, set[str]] = {}
    for tool in tools:
        function = _function(tool)
        properties = (function.get("parameters") or {}).get("properties") or {}
        out[str(function.get("name"))] = {
            name
            for name, schema in properties.items()
            if isinstance(schema, Mapping) and schema.get("type") == "string"
        }
    return out


class _GLMStreamParser(MarkerStreamParser):
    """Reasoning until ``</think>``, then content and ``<tool_call>`` blocks until a role token.

    A tool call is reported once its ``</tool_call>`` arrives; with ``stream_arguments`` its
    name as soon as an argument follows it, and its arguments one by one.
    """

    def __init__(
        self,
        thinking: bool,
        tools: Sequence[Mapping[str, Any]],
        parse_tools: bool = True,
        stream_arguments: bool = False,
    ):
        super().__init__(_REASONING if thinking else _CONTENT)
        self._strings = _string_parameters(tools)
        self._content_markers = (CALL_START, *_STOPS) if parse_tools else _STOPS
        self._stream_arguments = stream_arguments
        self._arguments = ArgumentStream()  # the open call's, when streamed

    def _step(self, events: list[ChatEvent], final: bool) -> bool:
        if self._state == _CALL:
            return self._scan_call(events, final)
        if self._state == _REASONING:
            marker = self._text_until(events, (THINK_END, *_STOPS), ReasoningDelta, final)
        else:
            if final:
                self._cut_call_start(events)
            marker = self._text_until(events, self._content_markers, TextDelta, final)
        if marker is not None:
            self._state = {THINK_END: _CONTENT, CALL_START: _CALL}.get(marker, self.DONE)
        return marker is not None

    def _cut_call_start(self, events: list[ChatEvent]) -> None:
        """At the end of the output, report a ``<tool_call>`` tag cut off after ``<tool`` as
        an unterminated call, not as text (a shorter start may be ordinary text)."""
        if CALL_START not in self._content_markers or first_marker(
            self._pending, self._content_markers
        ):
            return
        held = marker_prefix_length(self._pending, (CALL_START,))
        if held < len("<tool"):
            return
        text, tail = self._pending[:-held], self._pending[-held:]
        self._pending = ""
        if text:
            events.append(TextDelta(text))
        events.append(ToolCallError(tail, "unterminated tool_call", unterminated=True))

    def _scan_call(self, events: list[ChatEvent], final: bool) -> bool:
        """Report the call once it is closed; a role token or the end cuts it off."""
        hit = first_marker(self._pending, (CALL_END, *_STOPS))
        if hit is None or hit[1] != CALL_END:
            if hit is None and not final:
                self._report_progress(events, self._pending, None)
                return False
            cut = len(self._pending) if hit is None else hit[0]
            events.append(
                ToolCallError(
                    CALL_START + self._pending[:cut], "unterminated tool_call", unterminated=True
                )
            )
            self._state, self._pending = self.DONE, ""
            return False
        body = self._pending[: hit[0]]
        self._pending = self._pending[hit[0] + len(CALL_END) :]
        call = self._decode_call(body)
        self._report_progress(events, body, call)
        events.append(call)
        self._arguments.reset()
        self._state = _CONTENT
        return True

    def _report_progress(
        self, events: list[ChatEvent], body: str, closed: ChatEvent | None
    ) -> None:
        """With ``stream_arguments``: the call's name once an argument follows it, then each
        complete argument as a piece of the JSON object the arguments will be; the rest (and
        the closing brace) with the ``closed`` call. Nothing more once something is wrong."""
        if not self._stream_arguments:
            return
        if closed is not None:
            if not (self._arguments.announced and isinstance(closed, ToolCallComplete)):
                return
            arguments = list(closed.call.arguments.items())
        else:
            name, key_start, rest = body.partition(KEY_START)
            name = name.strip()
            if not key_start or not name or "<" in name:
                return
            arguments = self._complete_arguments(name, KEY_START + rest)
            self._arguments.announce(events, name)
        self._arguments.arguments(events, arguments)
        if closed is not None:
            self._arguments.close(events)

    def _complete_arguments(self, name: str, text: str) -> list[tuple[str, Any]]:
        """The arguments whose ``</arg_value>`` has been written, in order, up to the first
        that is incomplete or wrong."""
        strings = self._strings.get(name, set())
        arguments: list[tuple[str, Any]] = []
        while text.strip():
            key, value, text, problem = _next_argument(text.lstrip())
            if problem or key in dict(arguments):
                break
            arguments.append((key, value if key in strings else _json_or_text(value)))
        return arguments

    def _decode_call(self, body: str) -> ChatEvent:
        raw = CALL_START + body + CALL_END
        name, _, rest = body.partition(KEY_START)
        name = name.strip()
        if not name or "<" in name:
            return ToolCallError(raw, "tool_call without a function name")
        rest = KEY_START + rest if rest else ""
        strings = self._strings.get(name, set())
        arguments: dict[str, Any] = {}
        while rest.strip():
            rest = rest.lstrip()
            key, value, rest, problem = _next_argument(rest)
            if problem:
                return ToolCallError(raw, problem)
            if key in arguments:
                return ToolCallError(raw, f"duplicate argument {key!r}")
            arguments[key] = value if key in strings else _json_or_text(value)
        return ToolCallComplete(ToolCall(name, arguments))


def _next_argument(text: str) -> tuple[str, str, str, str | None]:
    """(key, raw value, the text after, problem) for the ``<arg_key>..<arg_value>..`` pair
    at the start of ``text``."""
    if not text.startswith(KEY_START):
        return "", "", "", "unexpected text in tool_call"
    key_end = text.find(KEY_END)
    if key_end < 0:
        return "", "", "", "arg_key without </arg_key>"
    key = text[len(KEY_START) : key_end].strip()
    after = text[key_end + len(KEY_END) :].lstrip()
    if not after.startswith(VALUE_START):
        return "", "", "", f"argument {key!r} has no <arg_value>"
    value_end = after.find(VALUE_END)
    if value_end < 0:
        return "", "", "", f"argument {key!r} has no </arg_value>"
    if not key:
        return "", "", "", "empty arg_key"
    return key, after[len(VALUE_START) : value_end], after[value_end + len(VALUE_END) :], None


def _json_or_text(value: str) -> Any:
    """A value without a string schema: JSON when it parses, else the text [harness]."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


GLM5 = GLM5ChatFormat()
