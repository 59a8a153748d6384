"""DeepSeek-V4 chat template: golden prompts, parse round trips, streaming, malformed markup.

Golden strings follow DeepSeek's reference encoder (encoding/encoding_dsv4.py and its README in
the DeepSeek-V4-Flash repository).
"""

from __future__ import annotations

from ds4mlx.engine.chat import (
    DEEPSEEK_V4,
    AssistantTurn,
    ChatFormat,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallError,
    chat_format_for_arch,
)
from ds4mlx.engine.chat.deepseek4 import parse_assistant, render_chat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
D = "｜DSML｜"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

TOOLS_SECTION = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    f'by writing a "<{D}tool_calls>" block like the following:\n\n'
    f"<{D}tool_calls>\n"
    f'<{D}invoke name="$TOOL_NAME">\n'
    f'<{D}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{D}parameter>\n'
    "...\n"
    f"</{D}invoke>\n"
    f'<{D}invoke name="$TOOL_NAME2">\n'
    "...\n"
    f"</{D}invoke>\n"
    f"</{D}tool_calls>\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types '
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    '`string="false"`.\n\n'
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    '{"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", '
    '"properties": {"city": {"type": "string"}}, "required": ["city"]}}\n\n'
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
    "calls.\n"
)

MAX_EFFORT = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

SYSTEM_USER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
MULTI_TURN = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
    {"role": "user", "content": "2+2?"},
]


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def invoke(name: str, *parameters: str) -> str:
    body = "\n".join(parameters)
    return f'<{D}invoke name="{name}">\n{body}\n</{D}invoke>'


def param(name: str, value: str, is_string: bool = True) -> str:
    flag = "true" if is_string else "false"
    return f'<{D}parameter name="{name}" string="{flag}">{value}</{D}parameter>'


def block(*invokes: str) -> str:
    body = "\n".join(invokes)
    return f"\n\n<{D}tool_calls>\n{body}\n</{D}tool_calls>"


# ------------------------------------------------------------------------ golden prompts


@pytest.mark.parametrize("thinking, ending", [(False, "</think>"), (True, "<think>")])
def test_system_and_user(thinking, ending):
    assert render_chat(SYSTEM_USER, thinking=thinking) == (
        f"{BOS}You are terse.<｜User｜>Hi<｜Assistant｜>{ending}"
    )


def test_user_only_without_generation_prompt():
    messages = [{"role": "user", "content": "Hi"}]
    assert render_chat(messages, add_generation_prompt=False) == f"{BOS}<｜User｜>Hi"


def test_multi_turn_chat_mode():
    assert render_chat(MULTI_TURN) == (
        f"{BOS}S<｜User｜>Hi<｜Assistant｜></think>Hello!{EOS}<｜User｜>2+2?<｜Assistant｜></think>"
    )


def test_multi_turn_thinking_drops_earlier_reasoning():
    assert render_chat(MULTI_TURN, thinking=True) == (
        f"{BOS}S<｜User｜>Hi<｜Assistant｜></think>Hello!{EOS}<｜User｜>2+2?<｜Assistant｜><think>"
    )


def test_multi_turn_thinking_can_keep_earlier_reasoning():
    assert render_chat(MULTI_TURN, thinking=True, drop_thinking=False) == (
        f"{BOS}S<｜User｜>Hi<｜Assistant｜><think>greet</think>Hello!{EOS}"
        "<｜User｜>2+2?<｜Assistant｜><think>"
    )


def test_reasoning_after_the_last_user_message_is_kept():
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A", "reasoning_content": "R"},
    ]
    assert render_chat(messages, thinking=True) == (
        f"{BOS}<｜User｜>Q<｜Assistant｜><think>R</think>A{EOS}"
    )
    assert render_chat(messages) == f"{BOS}<｜User｜>Q<｜Assistant｜></think>A{EOS}"


def test_max_reasoning_effort_prefix_only_in_thinking_mode():
    assert render_chat(SYSTEM_USER, thinking=True, reasoning_effort="max") == (
        f"{BOS}{MAX_EFFORT}You are terse.<｜User｜>Hi<｜Assistant｜><think>"
    )
    assert render_chat(SYSTEM_USER, reasoning_effort="max") == render_chat(SYSTEM_USER)
    assert render_chat(SYSTEM_USER, thinking=True, reasoning_effort="high") == (
        render_chat(SYSTEM_USER, thinking=True)
    )


def test_consecutive_user_messages_share_one_turn():
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert render_chat(messages) == f"{BOS}<｜User｜>a\n\nb<｜Assistant｜></think>"


def test_tools_tool_calls_and_results_in_call_order():
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Rome and Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Two cities.",
            "tool_calls": [
                call("c1", "get_weather", '{"city": "Rome"}'),
                call("c2", "get_weather", '{"city": "Oslo", "days": 2}'),
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "Oslo: snow"},
        {"role": "tool", "tool_call_id": "c1", "content": "Rome: sun"},
    ]
    expected = (
        f"{BOS}You are helpful.\n\n{TOOLS_SECTION}"
        "<｜User｜>Weather in Rome and Oslo?<｜Assistant｜><think>Two cities.</think>"
        + block(
            invoke("get_weather", param("city", "Rome")),
            invoke("get_weather", param("city", "Oslo"), param("days", "2", False)),
        )
        + f"{EOS}<｜User｜><tool_result>Rome: sun</tool_result>\n\n"
        "<tool_result>Oslo: snow</tool_result><｜Assistant｜><think>"
    )
    assert render_chat(messages, [WEATHER_TOOL], thinking=True) == expected


def test_tools_without_a_system_message_get_an_empty_one():
    messages = [{"role": "user", "content": "Hi"}]
    assert render_chat(messages, [WEATHER_TOOL]) == (
        f"{BOS}\n\n{TOOLS_SECTION}<｜User｜>Hi<｜Assistant｜></think>"
    )


def test_chat_mode_tool_call_with_content_and_no_arguments():
    messages = [
        {"role": "user", "content": "Time?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [{"type": "function", "function": {"name": "now", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "12:00"},
    ]
    assert render_chat(messages) == (
        f"{BOS}<｜User｜>Time?<｜Assistant｜></think>Let me check."
        + block(invoke("now", ""))
        + f"{EOS}<｜User｜><tool_result>12:00</tool_result>"
        "<｜Assistant｜></think>"
    )


def test_without_tools_tool_call_reasoning_is_dropped_like_deepseek():
    # DeepSeek's encoder keeps all reasoning only when tools are offered; pass tools to keep it.
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "reasoning_content": "R", "tool_calls": [ToolCall("f", {})]},
        {"role": "tool", "content": "r"},
    ]
    assert render_chat(messages, thinking=True) == (
        f"{BOS}<｜User｜>Q<｜Assistant｜></think>"
        + block(invoke("f", ""))
        + f"{EOS}<｜User｜><tool_result>r</tool_result><｜Assistant｜><think>"
    )


def test_invalid_input_is_refused():
    with pytest.raises(ValueError, match="role"):
        render_chat([{"role": "narrator", "content": "x"}])
    with pytest.raises(ValueError, match="reasoning_effort"):
        render_chat(SYSTEM_USER, reasoning_effort="extreme")


# ------------------------------------------------------------------------ parse round trips

ARGUMENTS = {
    "path": "/tmp/a b.txt",
    "content": 'line1\nline2 <tag> & "quoted" ü 🦙\n',
    "digits": "123",
    "blank": " ",
    "count": 3,
    "ratio": 0.5,
    "force": True,
    "nothing": None,
    "items": [1, "two", {"three": 3}],
    "nested": {"k": [True, False]},
}


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("content", ["", "Let me look.", "Ends with a newline\n"])
def test_render_then_parse_round_trip(thinking, content):
    calls = [ToolCall("write_file", ARGUMENTS), ToolCall("list_files", {})]
    assistant = {
        "role": "assistant",
        "content": content,
        "reasoning_content": "Plan: write.",
        "tool_calls": calls,
    }
    prompt = render_chat([{"role": "user", "content": "go"}, assistant], thinking=thinking)
    opener = "<｜Assistant｜>" + ("<think>" if thinking else "</think>")
    output = prompt.split(opener, 1)[1]
    assert output.endswith(EOS)
    assert parse_assistant(output, thinking=thinking) == AssistantTurn(
        reasoning="Plan: write." if thinking else "", content=content, tool_calls=calls
    )


def test_parse_plain_answers():
    assert parse_assistant(f"Simple.</think>2 + 2 = 4.{EOS}", thinking=True) == AssistantTurn(
        reasoning="Simple.", content="2 + 2 = 4."
    )
    assert parse_assistant("No EOS yet") == AssistantTurn(content="No EOS yet")
    assert parse_assistant(f"Hi{EOS}ignored after the end") == AssistantTurn(content="Hi")
    assert parse_assistant("cut off while thinking", thinking=True) == AssistantTurn(
        reasoning="cut off while thinking"
    )


def test_dsml_inside_reasoning_is_reasoning_text():
    text = f"Maybe <{D}tool_calls> is needed</think>Answer{EOS}"
    assert parse_assistant(text, thinking=True) == AssistantTurn(
        reasoning=f"Maybe <{D}tool_calls> is needed", content="Answer"
    )


def test_lenient_markup_is_accepted():
    short = "DSML｜"  # models sometimes drop the first bar (seen by ds4)
    text = (
        f'Ok<{short}tool_calls>  <{short}invoke name="f"> <{short}parameter name="a">x'
        f"</{short}parameter>\n\n</{short}invoke></{short}tool_calls>"
    )
    expected = AssistantTurn(content="Ok", tool_calls=[ToolCall("f", {"a": "x"})])
    assert parse_assistant(text) == expected


def test_text_after_a_tool_block_is_content():
    text = "A" + block(invoke("f", "")) + "B"
    assert parse_assistant(text) == AssistantTurn(content="AB", tool_calls=[ToolCall("f", {})])


# ------------------------------------------------------------------------ malformed markup

GOOD_INVOKE = invoke("ok", param("n", "1", False))
MALFORMED = {
    "invoke without name": (f"<{D}invoke>\n</{D}invoke>", "without a name"),
    "bad JSON": (invoke("f", param("n", "{not json", False)), "not JSON"),
    "duplicate parameter": (invoke("f", param("a", "1"), param("a", "2")), "duplicate"),
    "parameter without name": (
        invoke("f", f'<{D}parameter string="true">1</{D}parameter>'),
        "parameter tag without a name",
    ),
    "unknown string flag": (
        f'<{D}invoke name="f">\n<{D}parameter name="a" string="maybe">1'
        f"</{D}parameter>\n</{D}invoke>",
        "string=",
    ),
    "stray text in invoke": (f'<{D}invoke name="f">\nhello\n</{D}invoke>', "unexpected"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_invoke_is_reported_and_the_rest_still_parses(case):
    raw, reason = MALFORMED[case]
    turn = parse_assistant("Hi" + block(raw, GOOD_INVOKE) + EOS)
    assert turn.content == "Hi"
    assert turn.tool_calls == [ToolCall("ok", {"n": 1})]
    assert len(turn.errors) == 1 and turn.errors[0].raw == raw
    assert reason in turn.errors[0].reason


def test_stray_text_in_the_block_is_reported():
    turn = parse_assistant(f"\n\n<{D}tool_calls>\nnot an invoke\n{GOOD_INVOKE}\n</{D}tool_calls>")
    assert turn.tool_calls == []
    assert [error.raw for error in turn.errors] == [f"not an invoke\n{GOOD_INVOKE}\n"]


def test_truncated_block_is_reported_at_finish():
    partial = f'<{D}invoke name="write">\n<{D}parameter name="text" string="true">half a'
    parser = DEEPSEEK_V4.stream_parser()
    assert parser.feed("Writing." + block(GOOD_INVOKE)[:-20] + "\n" + partial) == [
        TextDelta("Writing."),
        ToolCallComplete(ToolCall("ok", {"n": 1})),
    ]
    assert parser.finish() == [
        ToolCallError(partial, "unterminated tool_calls block", unterminated=True)
    ]
    assert parser.feed("more") == [] and parser.finish() == []


@pytest.mark.parametrize("cut", [f"\n\n<{D}tool_ca", "\n\n<DSML｜tool_ca", "<DSML｜t", "<｜DS"])
def test_a_cut_off_block_opening_is_an_unterminated_call_in_either_spelling(cut):
    """The output ends inside a tool_calls opening tag, in the real spelling or the
    first-bar-dropped drift: a cut-off call, not text; a lone "<" stays text."""
    assert parse_assistant("Hi" + cut) == AssistantTurn(
        content="Hi", errors=[ToolCallError(cut, "unterminated tool_calls block", True)]
    )
    assert parse_assistant("Hi <") == AssistantTurn(content="Hi <")


def test_only_a_turn_before_the_assistant_or_the_end_gets_the_assistant_prefix():
    """A user message followed by a developer one: both are user turns in a row, with one
    assistant prefix, at the end."""
    messages = [
        {"role": "user", "content": "a"},
        {"role": "developer", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert render_chat(messages) == f"{BOS}<｜User｜>a<｜User｜>b<｜User｜>c<｜Assistant｜></think>"


def test_eos_inside_a_block_ends_it():
    turn = parse_assistant(f'\n\n<{D}tool_calls>\n<{D}invoke name="f">{EOS}after')
    assert turn == AssistantTurn(
        errors=[
            ToolCallError(
                f'<{D}invoke name="f">', "unterminated tool_calls block", unterminated=True
            )
        ]
    )


# ------------------------------------------------------------------------ streaming

STREAM_SAMPLES = [
    (f"Thinking about <tags> and </thi ngs>.</think>Answer: 4.{EOS}", True),
    (
        "Let me check.\n\n"
        + block(
            invoke("get_weather", param("city", "Rome")),
            invoke("w", param("text", f"</{D}invoke> inside")),
        )
        + EOS,
        False,
    ),
    ("R</think>" + block(invoke("f", param("x", "[1, 2]", False))) + EOS, True),
    ("Trailing newlines stay\n\n", False),
    ("Hi" + block(*(raw for raw, _ in MALFORMED.values()), GOOD_INVOKE) + EOS, False),
    (f"\n\n<{D}tool_calls>\ngarbage", False),
    ("<｜end▁of▁sent", False),
]


def feed_one_char_at_a_time(text: str, thinking: bool) -> list:
    parser = DEEPSEEK_V4.stream_parser(thinking=thinking)
    events = [event for char in text for event in parser.feed(char)]
    return events + parser.finish()


@pytest.mark.parametrize("text, thinking", STREAM_SAMPLES)
def test_streaming_one_char_at_a_time_equals_whole_parse(text, thinking):
    events = feed_one_char_at_a_time(text, thinking)
    assert AssistantTurn.from_events(events) == parse_assistant(text, thinking=thinking)


@pytest.mark.parametrize("text, thinking", STREAM_SAMPLES[:3])
def test_markup_never_reaches_text_deltas(text, thinking):
    events = feed_one_char_at_a_time(text, thinking)
    shown = "".join(e.text for e in events if isinstance(e, (TextDelta, ReasoningDelta)))
    assert "DSML" not in shown and "</think>" not in shown and EOS not in shown


def test_text_is_released_as_soon_as_it_cannot_be_markup():
    parser = DEEPSEEK_V4.stream_parser()
    assert parser.feed("Hello") == [TextDelta("Hello")]
    assert parser.feed("\n") == []
    assert parser.feed("\n<") == []
    assert parser.feed("b>") == [TextDelta("\n\n<b>")]
    assert parser.feed(f"<{D}tool") == []
    assert parser.feed("box>") == [TextDelta(f"<{D}toolbox>")]


_FRAGMENTS = [
    f"<{D}tool_calls>",
    f"</{D}tool_calls>",
    f'<{D}invoke name="f">',
    f"</{D}invoke>",
    f'<{D}parameter name="a" string="false">',
    f'<{D}parameter name="b">',
    f"</{D}parameter>",
    "</think>",
    EOS,
    "\n\n",
    "<",
    "｜",
    "x",
    "1",
    "{",
    '"',
    " ",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=25), st.booleans())
def test_parser_never_raises_and_streaming_is_chunking_invariant(fragments, thinking):
    text = "".join(fragments)
    whole = parse_assistant(text, thinking=thinking)
    assert AssistantTurn.from_events(feed_one_char_at_a_time(text, thinking)) == whole


def test_format_interface():
    assert isinstance(DEEPSEEK_V4, ChatFormat)
    assert DEEPSEEK_V4.stop_strings() == [EOS]
    assert DEEPSEEK_V4.parse("x") == parse_assistant("x")
    assert chat_format_for_arch("deepseek4") is DEEPSEEK_V4
    assert chat_format_for_arch("llama") is None


def test_content_that_is_not_a_string_is_refused_by_field():
    with pytest.raises(TypeError, match="^message content must be a string, got list$"):
        render_chat([{"role": "user", "content": ["a"]}])
    with pytest.raises(TypeError, match="^message reasoning_content must be a string, got int$"):
        render_chat([{"role": "assistant", "content": "a", "reasoning_content": 3}])
