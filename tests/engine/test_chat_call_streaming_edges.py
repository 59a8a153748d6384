"""Tool calls while they stream, at their edges: several calls in one turn, calls that break
after their name was announced, cut-off calls, and non-ASCII names and values. The common cases
are in ``test_chat_tool_streaming.py``."""

from __future__ import annotations

import json

from ds4mlx.engine.chat import DEEPSEEK_V4, GLM5, AssistantTurn, NamedTool, ToolCall
from ds4mlx.engine.chat.base import tool_call_from_message
from ds4mlx.engine.chat.deepseek4 import DSML
from ds4mlx.engine.chat.events import (
    TextDelta,
    ToolCallArguments,
    ToolCallComplete,
    ToolCallError,
    ToolCallStart,
)

import pytest

D = DSML
EOS_DS = "<｜end▁of▁sentence｜>"


def one_char_at_a_time(parser, text: str) -> list:
    return [event for char in text for event in parser.feed(char)] + parser.finish()


def glm_call(name: str, *arguments: tuple[str, str]) -> str:
    pairs = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in arguments)
    return f"<tool_call>{name}{pairs}</tool_call>"


def streamed(name: str, arguments: dict) -> list:
    """The events of one call streamed argument by argument, then completed."""
    pieces = [
        ToolCallArguments(("{" if i == 0 else ", ") + json.dumps(k) + ": " + json.dumps(v))
        for i, (k, v) in enumerate(arguments.items())
    ]
    return [
        ToolCallStart(name),
        *pieces,
        ToolCallArguments("}" if arguments else "{}"),
        ToolCallComplete(ToolCall(name, arguments)),
    ]


# --------------------------------------------------------------------------- GLM


def test_glm_streams_each_of_two_calls_from_its_own_start():
    text = glm_call("a", ("x", "1")) + glm_call("b", ("y", "2"))
    events = one_char_at_a_time(GLM5.stream_parser(stream_arguments=True), text)
    assert events == streamed("a", {"x": 1}) + streamed("b", {"y": 2})


def test_a_glm_call_without_arguments_arrives_whole_even_when_streaming():
    # Its name is announced only once an argument follows it: none does.
    events = one_char_at_a_time(
        GLM5.stream_parser(stream_arguments=True), "<tool_call>now</tool_call>"
    )
    assert events == [ToolCallComplete(ToolCall("now", {}))]


def test_a_glm_call_fed_whole_is_reported_whole_even_when_streaming():
    events = GLM5.stream_parser(stream_arguments=True).feed(glm_call("a", ("x", "1")))
    assert events == [ToolCallComplete(ToolCall("a", {"x": 1}))]


def test_a_glm_call_broken_after_its_announcement_ends_with_the_error_alone():
    body = (
        "f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value>"
    )
    events = one_char_at_a_time(
        GLM5.stream_parser(stream_arguments=True), f"<tool_call>{body}</tool_call>"
    )
    assert events == [
        ToolCallStart("f"),
        ToolCallArguments('{"a": 1'),
        ToolCallError(f"<tool_call>{body}</tool_call>", "duplicate argument 'a'"),
    ]


def test_a_glm_name_with_markup_in_it_is_never_announced():
    body = "f<x<arg_key>k</arg_key><arg_value>1</arg_value>"
    events = one_char_at_a_time(
        GLM5.stream_parser(stream_arguments=True), f"<tool_call>{body}</tool_call>"
    )
    assert events == [
        ToolCallError(f"<tool_call>{body}</tool_call>", "tool_call without a function name")
    ]


def test_a_glm_call_cut_off_mid_argument_stops_at_its_last_complete_argument():
    text = (
        "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>b</arg_key><arg_value>2"
    )
    events = one_char_at_a_time(GLM5.stream_parser(stream_arguments=True), "Hi" + text)
    assert events == [
        TextDelta("H"),
        TextDelta("i"),
        ToolCallStart("f"),
        ToolCallArguments('{"a": 1'),
        ToolCallError(text, "unterminated tool_call", unterminated=True),
    ]


def test_a_glm_call_cut_off_by_a_role_token_keeps_its_markup_as_the_error():
    text = "<tool_call>f<arg_key>a</arg_key><arg_value>1"
    assert GLM5.parse(f"x{text}<|user|>next") == AssistantTurn(
        content="x", errors=[ToolCallError(text, "unterminated tool_call", unterminated=True)]
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("f<arg_key> q </arg_key><arg_value>1</arg_value>", ToolCall("f", {"q": 1})),
        ("f<arg_key>q<arg_value>1</arg_value>", "arg_key without </arg_key>"),
        ("f<arg_key>q</arg_key><arg_value>1</arg_value><k>2</k>", "unexpected text in tool_call"),
    ],
    ids=["padded key", "unclosed key", "foreign tag"],
)
def test_glm_argument_keys(body, expected):
    turn = GLM5.parse(f"<tool_call>{body}</tool_call>")
    if isinstance(expected, ToolCall):
        assert turn == AssistantTurn(tool_calls=[expected])
    else:
        assert turn == AssistantTurn(
            errors=[ToolCallError(f"<tool_call>{body}</tool_call>", expected)]
        )


# --------------------------------------------------------------------------- DeepSeek


def test_a_cut_off_invoke_streams_no_closing_brace():
    text = (
        f'<{D}tool_calls><{D}invoke name="f"><{D}parameter name="a" string="false">1'
        f'</{D}parameter><{D}parameter name="b">x'
    )
    events = one_char_at_a_time(DEEPSEEK_V4.stream_parser(stream_arguments=True), text)
    assert events == [
        ToolCallStart("f"),
        ToolCallArguments('{"a": 1'),
        ToolCallError(text[len(f"<{D}tool_calls>") :], "unterminated tool_calls block", True),
    ]


def test_parameters_stream_as_soon_as_written_though_the_invoke_close_is_cut():
    head = f'<{D}tool_calls><{D}invoke name="f"><{D}parameter name="a">x</{D}parameter></{D}inv'
    parser = DEEPSEEK_V4.stream_parser(stream_arguments=True)
    assert parser.feed(head) == [ToolCallStart("f"), ToolCallArguments('{"a": "x"')]
    assert parser.feed(f"oke></{D}tool_calls>") == [
        ToolCallArguments("}"),
        ToolCallComplete(ToolCall("f", {"a": "x"})),
    ]


def test_a_forced_call_that_gets_no_output_is_still_reported():
    parser = DEEPSEEK_V4.stream_parser(tool_choice=NamedTool("write"), stream_arguments=True)
    assert parser.finish() == [
        ToolCallStart("write"),
        ToolCallError('<｜DSML｜invoke name="write">\n', "unterminated tool_calls block", True),
    ]


# --------------------------------------------------------------------------- shared


@pytest.mark.parametrize("chat_format", [DEEPSEEK_V4, GLM5], ids=["deepseek4", "glm5"])
def test_streamed_non_ascii_keys_and_values_stay_unescaped(chat_format):
    call = ToolCall("f", {"clé": "ü", "n": 1})
    prompt = chat_format.render([{"role": "assistant", "content": "", "tool_calls": [call]}])
    output = prompt[
        prompt.index("\n\n<｜DSML｜" if chat_format is DEEPSEEK_V4 else "<tool_call>") :
    ]
    events = one_char_at_a_time(chat_format.stream_parser(stream_arguments=True), output)
    pieces = "".join(e.text for e in events if isinstance(e, ToolCallArguments))
    assert pieces == '{"clé": "ü", "n": 1}'
    assert ToolCallComplete(call) in events


def test_a_message_call_with_null_arguments_has_none():
    entry = {"id": "c", "function": {"name": "f", "arguments": None}}
    assert tool_call_from_message(entry) == (ToolCall("f", {}), "c")


def test_a_turn_from_streamed_events_keeps_the_calls_and_errors_only():
    text = glm_call("a", ("x", "1")) + "<tool_call>b<arg_key>y</arg_key><arg_value>2"
    events = one_char_at_a_time(GLM5.stream_parser(stream_arguments=True), text)
    assert (
        AssistantTurn.from_events(events)
        == GLM5.parse(text)
        == AssistantTurn(
            tool_calls=[ToolCall("a", {"x": 1})],
            errors=[
                ToolCallError(
                    text[len(glm_call("a", ("x", "1"))) :], "unterminated tool_call", True
                )
            ],
        )
    )


@pytest.mark.parametrize(
    ("chat_format", "output"),
    [(DEEPSEEK_V4, f"plan</think>answer{EOS_DS}"), (GLM5, "plan</think>answer<|user|>")],
    ids=["deepseek4", "glm5"],
)
def test_a_parser_says_whether_the_output_so_far_ends_inside_the_reasoning(chat_format, output):
    parser = chat_format.stream_parser(thinking=True)
    inside = []
    for char in output:
        parser.feed(char)
        inside.append(parser.reasoning)
    close = output.index("</think>") + len("</think>")
    assert inside == [True] * (close - 1) + [False] * (len(output) - close + 1)
    assert not chat_format.stream_parser().reasoning


@pytest.mark.parametrize("choice", ["required", NamedTool("f")])
def test_a_glm_forced_call_is_parsed_without_reasoning_first(choice):
    parser = GLM5.stream_parser(thinking=True, tool_choice=choice)
    head = "" if isinstance(choice, NamedTool) else "f"
    events = parser.feed(f"{head}<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>ok")
    assert events + parser.finish() == [ToolCallComplete(ToolCall("f", {"a": 1})), TextDelta("ok")]


@pytest.mark.parametrize("chat_format", [DEEPSEEK_V4, GLM5])
def test_a_finished_parser_takes_no_more_text(chat_format):
    """``finish`` ends the answer: text fed after it (a late chunk of a cancelled stream) is
    neither parsed nor reported, and a second ``finish`` reports nothing."""
    parser = chat_format.stream_parser()
    assert parser.feed("Hello") + parser.finish() == [TextDelta("Hello")]
    assert parser.feed(" again") == []
    assert parser.finish() == []
