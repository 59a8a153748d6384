"""DeepSeek-V4's output syntax: reasoning, content, and DSML tool-call blocks, parsed while they
stream (sources as in ``ds4mlx.engine.chat``: [enc] DeepSeek's reference encoder, [ds4]
antirez/ds4's parser)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ds4mlx.engine.chat import (
    DSML,
    EOS,
    THINK_END,
    ArgumentStream,
    ChatEvent,
    MarkerStreamParser,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallError,
    _first_marker,
    _marker_prefix_length,
)

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

    def __init__(self, thinking: bool, parse_tools: bool = True,
                 stream_arguments: bool = False):
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
        if self._content_markers == (EOS,) or _first_marker(self._pending,
                                                            self._content_markers):
            return
        held = _marker_prefix_length(self._pending, tuple(_TOOL_BLOCK_STARTS))
        tail = self._pending[len(self._pending) - held:] if held else ""
        if not tail.lstrip("\n").startswith(("<｜", "<D")):
            return
        text, self._pending = self._pending[:len(self._pending) - held], ""
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
        after_block = self._pending[len(block):]
        block_end = f"</{self._dsml}tool_calls>"
        invoke_start = f"<{self._dsml}invoke"
        while True:
            rest = block[_skip_whitespace(block, 0):]
            if rest.startswith(block_end):
                self._pending = rest[len(block_end):] + after_block
                self._state = _CONTENT
                return True
            if rest.startswith(invoke_start):
                invoke = _scan_invoke(rest, self._dsml)
                if invoke is not None:
                    self._report_progress(events, invoke)
                    if invoke.length is not None:
                        events.append(invoke.event(rest))
                        self._arguments.reset()
                        block = rest[invoke.length:]
                        continue
            elif rest and not (invoke_start.startswith(rest) or block_end.startswith(rest)):
                garbage_end = rest.find(block_end)
                if garbage_end >= 0:
                    events.append(ToolCallError(rest[:garbage_end],
                                                "unexpected text in tool_calls block"))
                    block = rest[garbage_end:]
                    continue
            break
        if ended:
            if rest:
                events.append(ToolCallError(rest, "unterminated tool_calls block",
                                            unterminated=True))
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
            return ToolCallError(text[:self.length], "; ".join(self.problems))
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
    invoke = _Invoke((_attributes(text[len(f"<{dsml}invoke"):tag_close]) or {}).get("name"))
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
            problem = _add_parameter(invoke.arguments,
                                     text[position + len(parameter_start):tag_close],
                                     text[tag_close + 1:value_end])
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
            return f"parameter {name!r} is marked string=\"false\" but is not JSON"
    else:
        return f"parameter {name!r} has string={is_string!r}"
    return None
