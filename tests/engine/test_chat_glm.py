"""GLM-5.3-Flash chat template: golden prompts, parse round trips, streaming, malformed markup.

The golden strings without tools are the released ``zai-org/GLM-5.3-Flash`` template's renderings
quoted in NVIDIA NeMo Automodel's tests (``test_glm5_3_flash_training_chat_template``); the
others were checked against that template rendered by ``transformers``.
"""

from __future__ import annotations

from ds4mlx.engine.chat import (
    DEEPSEEK_V4,
    GLM5,
    AssistantTurn,
    ChatFormat,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallError,
    chat_format_for_arch,
)
from ds4mlx.engine.chat.base import REASONING_EFFORT_ORDER

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

PREFIX = "[gMASK]<sop><|system|>Reasoning Effort: Max"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search",
        "parameters": {"type": "object", "properties": {}},
    },
}
CALLS = [
    {
        "type": "function",
        "id": "c1",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
]
TOOLS_SECTION = (
    "<|system|>\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", '
    '"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, '
    '"required": ["city"]}}\n'
    '{"name": "search", "description": "Search", "parameters": {"type": "object", '
    '"properties": {}}}\n'
    "</tools>\n\n"
    "For each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
    "</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>..."
    "</tool_call>"
)


def render(messages, tools=None, **options):
    options.setdefault("add_generation_prompt", False)
    return GLM5.render(messages, tools, **options)


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize(
    "messages, expected",
    [
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello there"},
                {"role": "user", "content": "bye"},
                {"role": "assistant", "content": "see you"},
            ],
            "<|user|>hi<|assistant|><think></think>hello there<|user|>bye<|assistant|>"
            "<think></think>see you",
        ),
        (
            [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "add them"},
            ],
            "<|user|>2+2?<|assistant|><think>add them</think>4",
        ),
        (
            [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": CALLS},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "assistant", "content": "It is sunny."},
            ],
            "<|user|>weather?<|assistant|><think></think><tool_call>get_weather<arg_key>city</arg_key>"
            "<arg_value>Paris</arg_value></tool_call><|observation|><tool_response>sunny"
            "</tool_response><|assistant|><think></think>It is sunny.",
        ),
        (
            [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "checking", "tool_calls": CALLS},
            ],
            "<|user|>weather?<|assistant|><think></think>checking<tool_call>get_weather<arg_key>city"
            "</arg_key><arg_value>Paris</arg_value></tool_call>",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "system", "content": "new rule"},
                {"role": "user", "content": "ok"},
                {"role": "assistant", "content": "done"},
            ],
            "<|user|>hi<|assistant|><think></think>hello<|system|>new rule<|user|>ok<|assistant|>"
            "<think></think>done",
        ),
    ],
    ids=["plain", "reasoning", "tool-call", "ends-with-tool-call", "system-after-assistant"],
)
def test_released_template_renderings(messages, expected):
    assert render(messages) == PREFIX + expected


def test_generation_prompt_keeps_earlier_reasoning_unless_cleared():
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "r"},
        {"role": "user", "content": "c"},
    ]
    end = "<|user|>c<|assistant|><think>"
    assert GLM5.render(messages, thinking=True) == (
        PREFIX + "<|user|>a<|assistant|><think>r</think>b" + end
    )
    assert GLM5.render(messages, thinking=True, clear_thinking=True) == (
        PREFIX + "<|user|>a<|assistant|><think></think>b" + end
    )
    # Without thinking the block is closed at once (not a switch of the released template).
    assert GLM5.render(messages, clear_thinking=True).endswith(end + "</think>")


def test_tools_section_effort_and_results_in_call_order():
    calls = [
        {"id": "a", "function": {"name": "search", "arguments": {"q": "x", "n": 3}}},
        {
            "id": "b",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": [1, 2]}'},
        },
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]},
        {"role": "assistant", "content": " <think>plan</think> sure ", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
        {"role": "tool", "tool_call_id": "a", "content": "hits"},
    ]
    assert GLM5.render(messages, [WEATHER, SEARCH], reasoning_effort="high", thinking=True) == (
        "[gMASK]<sop><|system|>Reasoning Effort: High"
        + TOOLS_SECTION
        + "<|system|>Be brief.<|user|>look<|begin_of_image|><|image|><|end_of_image|>"
        "<|assistant|><think>plan</think>sure<tool_call>search<arg_key>q</arg_key><arg_value>x"
        "</arg_value><arg_key>n</arg_key><arg_value>3</arg_value></tool_call><tool_call>"
        "get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>days</arg_key>"
        "<arg_value>[1, 2]</arg_value></tool_call><|observation|><tool_response>hits"
        "</tool_response><tool_response>rain</tool_response><|assistant|><think>"
    )


@pytest.mark.parametrize("unmatched", [{}, {"tool_call_id": "zz"}], ids=["no id", "unknown id"])
def test_results_keep_their_order_when_they_do_not_all_name_a_call(unmatched):
    # A result without an id, or with one no call has (fresh6's
    # glm5_unmatched_tool_result_dropped): nothing to sort by, and nothing is dropped.
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": CALLS + [{"id": "c2", "function": {"name": "search", "arguments": {}}}],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "B"},
        {"role": "tool", "content": "A", **unmatched},
    ]
    assert render(messages).endswith(
        "<|observation|><tool_response>B</tool_response><tool_response>A</tool_response>"
    )


def calls_with_ids(*ids: str) -> list[dict]:
    return [{"id": i, "function": {"name": f"f{n}", "arguments": {}}} for n, i in enumerate(ids)]


@pytest.mark.parametrize(
    ("call_ids", "results", "expected"),
    [
        # Two results naming one call: nothing to sort by, and neither is dropped.
        (("a", "b"), [("b", "B1"), ("b", "B2")], ["B1", "B2"]),
        # Two calls of one id: the result is rendered once, not once per call.
        (("a", "a"), [("a", "A")], ["A"]),
    ],
    ids=["repeated result id", "repeated call id"],
)
def test_results_are_sorted_only_by_distinct_ids(call_ids, results, expected):
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": calls_with_ids(*call_ids)},
        *({"role": "tool", "tool_call_id": i, "content": text} for i, text in results),
    ]
    responses = "".join(f"<tool_response>{text}</tool_response>" for text in expected)
    assert render(messages).endswith(f"</tool_call><|observation|>{responses}")


def test_a_list_of_outputs_is_sorted_by_their_ids():
    """Responses-style results (``{"id": ..., "output": ...}`` entries) name their calls by
    ``id``: they follow the calls' order too."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": calls_with_ids("a", "b")},
        {"role": "tool", "content": [{"id": "b", "output": "B"}, {"id": "a", "output": "A"}]},
    ]
    assert render(messages).endswith(
        "<|observation|><tool_response>A</tool_response><tool_response>B</tool_response>"
    )


def test_an_empty_result_list_is_an_empty_response():
    assert render([{"role": "tool", "content": []}]) == (
        f"{PREFIX}<|observation|><tool_response></tool_response>"
    )


def test_deferred_tools_appear_through_tool_references():
    deferred = {
        "type": "function",
        "function": {"name": "Workflow", "description": "later", "defer_loading": True},
    }
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "t", "function": {"name": "search", "arguments": {}}}],
        },
        {
            "role": "tool",
            "tool_call_id": "t",
            "content": [{"type": "tool_reference", "name": "Workflow"}],
        },
    ]
    prompt = render(messages, [SEARCH, deferred])
    assert prompt.count("Workflow") == 1
    assert prompt.endswith(
        '<|observation|><tool_response><tools>\n{"name": "Workflow", '
        '"description": "later"}\n</tools></tool_response>'
    )


def test_a_strict_tool_renders_as_the_same_tool_without_strict():
    # OpenAI's "strict" flag is for the server's constraint, not the model: the template's
    # tool line leaves it out, as it leaves out "defer_loading".
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    question = [{"role": "user", "content": "weather?"}]
    prompt = render(question, [strict])
    assert prompt == render(question, [WEATHER]) and "strict" not in prompt


@pytest.mark.parametrize(
    ("chat_format", "expected"),
    [
        (GLM5, ["low", "low", "low", "high", "high", "max"]),
        (DEEPSEEK_V4, ["high", "high", "high", "high", "high", "max"]),
    ],
    ids=["glm5", "deepseek4"],
)
def test_a_requested_effort_maps_to_the_strongest_the_template_has_not_above_it(
    chat_format, expected
):
    """An effort the template has by name is its own (fresh6's
    chat_effort_of_the_same_name_skipped); one it lacks takes the next weaker, else the
    weakest."""
    assert [chat_format.template_effort(e) for e in REASONING_EFFORT_ORDER] == expected


def test_developer_message_renders_as_system():
    # OpenAI clients send "developer" where older ones send "system"; GLM's template knows only
    # the latter, so both must render the same instead of one being refused.
    as_system = render(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    as_developer = render(
        [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert as_developer == as_system
    assert "<|system|>be brief<|user|>hi" in as_developer


def test_invalid_input_is_refused():
    with pytest.raises(ValueError, match="reasoning_effort"):
        GLM5.render([{"role": "user", "content": "x"}], reasoning_effort="medium")
    with pytest.raises(ValueError, match="role"):
        GLM5.render([{"role": "narrator", "content": "x"}])


# --------------------------------------------------------------------------- parsing


def test_parse_reasoning_content_and_calls():
    text = (
        "think</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
        "</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call><|observation|>"
        "ignored"
    )
    turn = GLM5.parse(text, thinking=True)
    assert (turn.reasoning, turn.content, turn.errors) == ("think", "Checking.", [])
    assert turn.tool_calls == [ToolCall("get_weather", {"city": "Paris", "days": 2})]


def test_string_schema_keeps_values_literal():
    text = (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>2</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
    )
    assert GLM5.parse(text).tool_calls == [ToolCall("get_weather", {"city": 2, "days": 3})]
    assert GLM5.parse(text, tools=[WEATHER]).tool_calls == [
        ToolCall("get_weather", {"city": "2", "days": 3})
    ]


def test_glm45_layout_with_newlines_is_accepted():
    text = "<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>red fish</arg_value>\n</tool_call>"
    assert GLM5.parse(text).tool_calls == [ToolCall("search", {"q": "red fish"})]


def test_tool_call_markup_inside_reasoning_is_reasoning_text():
    turn = GLM5.parse("<tool_call>x</tool_call></think>ok", thinking=True)
    assert (turn.reasoning, turn.content, turn.tool_calls) == ("<tool_call>x</tool_call>", "ok", [])


@pytest.mark.parametrize(
    "body, reason",
    [
        ("<arg_key>a</arg_key><arg_value>1</arg_value>", "without a function name"),
        ("f<arg_key>a</arg_key>", "has no <arg_value>"),
        ("f<arg_key>a</arg_key><arg_value>1", "has no </arg_value>"),
        ("f<arg_key>a</arg_key><arg_value>1</arg_value>junk", "unexpected text"),
        (
            "f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value>",
            "duplicate argument",
        ),
        ("f<arg_key> </arg_key><arg_value>1</arg_value>", "empty arg_key"),
    ],
)
def test_malformed_call_is_reported_and_parsing_goes_on(body, reason):
    good = "<tool_call>g<arg_key>b</arg_key><arg_value>x</arg_value></tool_call>"
    turn = GLM5.parse(f"A<tool_call>{body}</tool_call>B{good}C")
    assert turn.content == "ABC"
    assert turn.tool_calls == [ToolCall("g", {"b": "x"})]
    assert len(turn.errors) == 1 and reason in turn.errors[0].reason
    assert turn.errors[0].raw == f"<tool_call>{body}</tool_call>"


@pytest.mark.parametrize(
    "text",
    [
        "a<tool_call>f<arg_key>k</arg_key><arg_value>v",
        "a<tool_call>f<arg_key>k</arg_key><arg_value>v<|observation|>after",
    ],
)
def test_unterminated_call_is_reported(text):
    turn = GLM5.parse(text)
    assert turn.content == "a" and not turn.tool_calls
    assert [e.reason for e in turn.errors] == ["unterminated tool_call"]
    assert "after" not in turn.errors[0].raw


def test_output_ending_in_the_start_of_a_call_tag_is_an_unterminated_call():
    """ "<tool" or more of ``<tool_call>`` at the end is a cut-off call; less is text."""
    assert GLM5.parse("a<tool") == AssistantTurn(
        content="a", errors=[ToolCallError("<tool", "unterminated tool_call", True)]
    )
    assert GLM5.parse("a<too") == AssistantTurn(content="a<too")


def test_a_function_name_with_markup_in_it_is_no_call():
    body = "f<x<arg_key>k</arg_key><arg_value>1</arg_value>"
    turn = GLM5.parse(f"<tool_call>{body}</tool_call>")
    assert turn.tool_calls == [] and turn.errors == [
        ToolCallError(f"<tool_call>{body}</tool_call>", "tool_call without a function name")
    ]


def test_role_tokens_end_the_turn():
    for stop in GLM5.stop_strings():
        assert GLM5.parse(f"yes{stop}no").content == "yes"


def test_text_is_released_as_soon_as_it_cannot_be_markup():
    parser = GLM5.stream_parser()
    assert parser.feed("Hello <to") == [TextDelta("Hello ")]
    assert parser.feed("p") == [TextDelta("<top")]
    assert parser.feed("<|us") == []
    assert parser.feed("er|>tail") == []
    assert parser.finish() == []


TEXT = st.text(alphabet=st.sampled_from(list('ab <>/|_k\n"{}1')), max_size=12)
VALUES = st.one_of(
    st.text(alphabet="abc xyz", min_size=1, max_size=8),
    st.integers(-5, 5),
    st.booleans(),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from("pq"), st.integers(0, 3), max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(
    reasoning=st.one_of(st.none(), TEXT.filter(lambda s: "</think>" not in s)),
    content=TEXT.filter(
        lambda s: (
            not any(
                m in s
                for m in ("<tool_call>", "<|user|>", "<|observation|>", "<|endoftext|>", "</think>")
            )
        )
    ),
    calls=st.lists(
        st.tuples(
            st.sampled_from(["f", "get_weather"]),
            st.dictionaries(st.sampled_from(["a", "b", "city"]), VALUES, max_size=3),
        ),
        max_size=2,
    ),
)
def test_render_then_parse_round_trip(reasoning, content, calls):
    """The assistant turn as rendered, read back: values typed by JSON round-trip only when
    their text is not itself JSON, so string values here never are."""
    message = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": [{"function": {"name": n, "arguments": a}} for n, a in calls],
    }
    prompt = GLM5.render(
        [{"role": "user", "content": "q"}, message], thinking=True, add_generation_prompt=False
    )
    generated = prompt.split("<|assistant|><think>", 1)[1] + "<|observation|>"
    turn = GLM5.parse(generated, thinking=True)
    assert turn.reasoning == (reasoning or "")
    assert turn.content == content.strip()
    assert turn.tool_calls == [ToolCall(n, a) for n, a in calls] and not turn.errors


SAMPLES = [
    "plan</think>Hi<tool_call>f<arg_key>a</arg_key><arg_value>[1]</arg_value></tool_call>x",
    "r</think>bad<tool_call><arg_key></tool_call><tool_call>g</tool_call><|user|>z",
    "no end<tool_call>f<arg_key>a",
    "<tool_call>f</tool_call></think>y<|endoftext|>",
]


def _merged(events):
    """Adjacent deltas of one kind joined: chunking may split text differently."""
    out = []
    for event in events:
        if out and type(event) is type(out[-1]) and isinstance(event, (TextDelta, ReasoningDelta)):
            out[-1] = type(event)(out[-1].text + event.text)
        else:
            out.append(event)
    return out


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("thinking", [False, True])
def test_streaming_one_char_at_a_time_equals_whole_parse(text, thinking):
    whole = GLM5.stream_parser(thinking=thinking)
    expected = [*whole.feed(text), *whole.finish()]
    streaming = GLM5.stream_parser(thinking=thinking)
    events = [event for char in text for event in streaming.feed(char)]
    assert _merged([*events, *streaming.finish()]) == _merged(expected)
    for event in expected:  # markup never shows as text (tool calls in reasoning are text)
        if isinstance(event, (TextDelta, ReasoningDelta)):
            assert "<|" not in event.text
        if isinstance(event, TextDelta):
            assert "<tool_call>" not in event.text


@settings(max_examples=80, deadline=None)
@given(
    fragments=st.lists(
        st.sampled_from(
            [
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
                "</think>",
                "<|user|>",
                "f",
                "1",
                " ",
                "\n",
                "x<",
            ]
        ),
        max_size=14,
    ),
    thinking=st.booleans(),
)
def test_parser_never_raises_and_is_chunking_invariant(fragments, thinking):
    text = "".join(fragments)
    whole = GLM5.stream_parser(thinking=thinking)
    expected = [*whole.feed(text), *whole.finish()]
    pieces = GLM5.stream_parser(thinking=thinking)
    events = [event for fragment in fragments for event in pieces.feed(fragment)]
    assert _merged([*events, *pieces.finish()]) == _merged(expected)
    assert all(
        isinstance(e, (TextDelta, ReasoningDelta, ToolCallComplete, ToolCallError))
        for e in expected
    )


def test_format_interface():
    assert chat_format_for_arch("glm5-next") is GLM5
    assert isinstance(GLM5, ChatFormat) and GLM5.name == "glm-5"
    assert GLM5.stop_strings() == ["<|user|>", "<|observation|>", "<|endoftext|>"]


def test_content_parts_render_as_text_and_media_placeholders():
    parts = ["a", {"type": "text", "text": "b"}, {"type": "image"}, {"type": "unknown"}]
    messages = [
        {"role": "user", "content": [*parts, {"type": "text"}]},
        {"role": "user", "content": None},
        {"role": "user", "content": 42},
    ]
    assert render(messages) == (
        f"{PREFIX}<|user|>ab<|begin_of_image|><|image|><|end_of_image|><|user|><|user|>42"
    )
    results = [{"role": "tool", "content": [{"type": "text", "text": "x"}, "y", {"type": "audio"}]}]
    assert render(results) == (
        f"{PREFIX}<|observation|><tool_response>xy<|begin_of_audio|><|end_of_audio|>"
        "</tool_response>"
    )
