"""What both chat formats share: reasoning efforts, tool calls taken from messages, forced call
prefixes, the markers streaming parsers look for, prompt pieces and their tokenization, and the
call grammar's view of the offered tools."""

from __future__ import annotations

import json

from ds4mlx.engine.chat.base import (
    ArgumentStream,
    first_marker,
    marker_prefix_length,
    tool_call_from_message,
    write_forced_prefix,
)
from ds4mlx.engine.chat.call_grammar import (
    JSON_LAYOUT,
    Parameter,
    argument_rules,
    callable_tools,
    is_strict,
    json_lexeme,
    parameter_sequence,
    parameters,
    tool_name,
)
from ds4mlx.engine.chat.events import ToolCall, ToolCallArguments, ToolCallStart
from ds4mlx.engine.chat.glm5 import GLM5, GLM5ChatFormat
from ds4mlx.engine.chat.prompt import NamedTool, PromptText, encode_prompt, max_token_bytes
from ds4mlx.engine.tokenizer import NumericTokenizer, Tokenizer

import pytest

# ------------------------------------------------------------------------ reasoning efforts


class _NoEfforts(GLM5ChatFormat):
    reasoning_efforts = ()


class _NoMax(GLM5ChatFormat):
    reasoning_efforts = ("low", "high")


def test_efforts_outside_openais_names_are_refused():
    with pytest.raises(ValueError, match=r"^reasoning effort must be one of \("):
        GLM5.template_effort("extreme")


def test_max_is_refused_by_a_template_without_a_maximum():
    with pytest.raises(ValueError, match=r"^the glm-5 chat template has no 'max' reasoning effort"):
        _NoMax().template_effort("max")
    with pytest.raises(ValueError, match="has no 'max'"):
        _NoEfforts().template_effort("max")
    assert _NoMax().template_effort("xhigh") == "high"


def test_a_template_without_efforts_takes_none():
    assert [_NoEfforts().template_effort(e) for e in ("minimal", "high", "xhigh")] == [None] * 3


# ------------------------------------------------------------------ tool calls from messages


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}, ({"a": 1}, "c1")),
        ({"function": {"name": "f", "arguments": "[1, 2]"}}, ({"arguments": [1, 2]}, None)),
        ({"function": {"name": "f", "arguments": "not json"}}, ({"arguments": "not json"}, None)),
        ({"function": {"name": "f", "arguments": ""}}, ({}, None)),
        ({"function": {"name": "f"}}, ({}, None)),
        ({"id": "c2", "name": "f", "arguments": {"b": [2]}}, ({"b": [2]}, "c2")),  # flat entry
        ({"function": {"name": "f", "arguments": 7}}, ({"arguments": 7}, None)),
    ],
)
def test_a_message_tool_call_becomes_a_call_with_object_arguments(entry, expected):
    arguments, call_id = expected
    assert tool_call_from_message(entry) == (ToolCall("f", arguments), call_id)


def test_a_tool_call_object_is_taken_as_it_is():
    call = ToolCall("f", {"a": 1})
    assert tool_call_from_message(call) == (call, None)


# ---------------------------------------------------------------------- forced call prefixes


def test_a_forced_names_last_occurrence_is_the_callers_text():
    out = PromptText()
    write_forced_prefix(out, "<tool_call>tool", NamedTool("tool"))
    assert out.pieces == [("<tool_call>", True), ("tool", False)]
    out = PromptText()
    write_forced_prefix(out, '<x name="f">\n', NamedTool("f"))
    assert out.pieces == [('<x name="', True), ("f", False), ('">\n', True)]
    out = PromptText()
    write_forced_prefix(out, "<tool_call>", "required")
    assert out.pieces == [("<tool_call>", True)]


def test_streamed_arguments_open_once_and_separate_each_argument():
    stream, events = ArgumentStream(), []
    stream.announce(events, "f")
    stream.announce(events, "f")
    stream.arguments(events, [("a", 1)])
    stream.arguments(events, [("a", 1), ("b", "ü")])
    stream.close(events)
    assert events == [
        ToolCallStart("f"),
        ToolCallArguments('{"a": 1'),
        ToolCallArguments(', "b": "ü"'),
        ToolCallArguments("}"),
    ]


# -------------------------------------------------------------------------------- markers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ab<x>cd<xy>", (2, "<x>")),  # the earliest
        ("ab<xy>cd<x>", (2, "<xy>")),
        ("ab<x>y>", (2, "<x>")),
        ("<xyz>", (0, "<xyz>")),  # the longest of those starting at one place
        ("none here", None),
    ],
)
def test_the_first_marker_is_the_earliest_then_the_longest(text, expected):
    assert first_marker(text, ["<x>", "<xy>", "<xyz>"]) == expected


@pytest.mark.parametrize("markers", [("<t", "<tool>"), ("<tool>", "<t")])
def test_of_markers_starting_together_the_longest_is_found(markers):
    """Where one marker begins another, the longer one found there is the marker."""
    assert first_marker("a<tool>b<t", markers) == (1, "<tool>")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("abc<thi", 4), ("abc<", 1), ("abc", 0), ("<think", 6), ("", 0), ("a</", 2)],
)
def test_the_held_back_end_is_the_longest_that_could_start_a_marker(text, expected):
    assert marker_prefix_length(text, ["<think>", "</"]) == expected


# ------------------------------------------------------------------ prompt pieces, tokenized


def test_prompt_pieces_keep_who_wrote_them_and_count_the_callers_characters():
    prompt = PromptText()
    prompt.template("<a>", "")
    prompt.caller("hello", "")
    prompt.template("<b>")
    prompt.caller("ü!")
    assert prompt.pieces == [("<a>", True), ("hello", False), ("<b>", True), ("ü!", False)]
    assert str(prompt) == "<a>hello<b>ü!"
    # 7 characters of the caller's, 6 of the template's: only the caller's count.
    assert prompt.caller_characters == 7


def test_a_tokenizer_without_special_tokens_encodes_the_joined_text():
    """No piece boundary may split the text's tokens: "abcde" is one numeric chunk."""
    numeric = NumericTokenizer(1000)
    prompt = PromptText()
    prompt.template("abc")
    prompt.caller("de")
    assert encode_prompt(numeric, prompt) == numeric.encode("abcde")
    plain = Tokenizer(["a", "b", "ab"], ["a b"], "gpt-2")
    prompt = PromptText()
    prompt.template("a")
    prompt.caller("b")
    assert encode_prompt(plain, prompt) == [2]


class _WordTokenizer:
    """A text tokenizer of another kind: one id per word, no vocabulary to read specials from."""

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list:
        return [len(word) for word in text.split()]


def test_a_tokenizer_of_another_kind_encodes_the_joined_text_as_plain_text():
    prompt = PromptText()
    prompt.template("<|user|>ab")
    prompt.caller("c de")
    assert encode_prompt(_WordTokenizer(), prompt) == [11, 2]


def test_the_longest_special_spelling_wins_where_two_start_together():
    tok = Tokenizer(
        ["a", "<", "|", ">", "<|e|>", "<|e|>x", "x"], [], "gpt-2", token_types=[1, 1, 1, 1, 3, 3, 1]
    )
    prompt = PromptText()
    prompt.template("a<|e|>xa<|e|>")
    assert encode_prompt(tok, prompt) == [0, 5, 0, 4]


def test_the_longest_token_bounds_how_few_tokens_a_text_is():
    tok = Tokenizer(["a", "Ġabcdef", "<|x|>"], [], "gpt-2", token_types=[1, 1, 3])
    assert max_token_bytes(tok) == 7
    assert max_token_bytes(NumericTokenizer(50)) == 5
    assert max_token_bytes(object()) is None


# ---------------------------------------------------------------------- the offered tools


def _tool(name: str, properties=None, required=(), strict=False) -> dict:
    function = {"name": name, "strict": strict}
    if properties is not None:
        function["parameters"] = {"properties": properties, "required": list(required)}
    return {"type": "function", "function": function}


def test_a_choice_decides_which_tools_a_call_may_name():
    tools = [_tool("a"), _tool("b")]
    assert callable_tools(tools, "auto") == (tools, False)
    assert callable_tools(tools, "required") == (tools, True)
    assert callable_tools(tools, NamedTool("b")) == ([tools[1]], True)
    with pytest.raises(ValueError, match=r"^tool_choice names 'c', which is not offered$"):
        callable_tools(tools, NamedTool("c"))


@pytest.mark.parametrize("names", [["a", "a"], ["a", ""]])
def test_tools_need_distinct_names(names):
    with pytest.raises(ValueError, match="^tools need distinct non-empty names"):
        callable_tools([_tool(name) for name in names], "auto")


def test_a_tools_name_and_strictness_are_read_flat_or_under_function():
    assert tool_name({"name": "flat"}) == "flat" and tool_name({"function": {}}) == ""
    assert is_strict(_tool("a", strict=True)) and not is_strict(_tool("a"))
    assert is_strict({"name": "flat", "strict": True})


def test_declared_parameters_come_in_order_with_their_requirement():
    declared = parameters(_tool("f", {"b": {"type": "string"}, "a": 3}, required=["a"]))
    assert declared == [
        Parameter("b", {"type": "string"}, False),
        Parameter("a", {}, True),  # a schema that is not an object constrains nothing
    ]
    assert parameters(_tool("f", {})) is None
    assert parameters(_tool("f")) is None
    assert parameters({"name": "f", "parameters": {"properties": ["a"]}}) is None


def test_a_string_is_plain_only_without_narrowing_keywords():
    assert Parameter("p", {"type": "string"}, True).plain_string
    assert not Parameter("p", {"type": "string", "enum": ["x"]}, True).plain_string
    assert not Parameter("p", {"type": "integer"}, True).plain_string
    assert Parameter("p", {"type": "string", "enum": ["x"]}, True).is_string


def test_parameter_sequences_mark_the_optional_ones():
    assert parameter_sequence([("a", True), ("b", False)]) == "a b?"
    assert parameter_sequence([]) == '""'


def test_json_lexemes_carry_the_templates_layout():
    assert json_lexeme(None) == "%json " + json.dumps({"x-guidance": JSON_LAYOUT})
    assert json_lexeme({"type": "integer"}) == "%json " + json.dumps(
        {"type": "integer", "x-guidance": JSON_LAYOUT}
    )


def test_argument_rules_bind_required_parameters_of_strict_or_forced_tools_only():
    def rule(parameter: Parameter, bound: bool) -> str:
        return f"{parameter.name}:{'bound' if bound else 'free'}"

    loose = _tool("f", {"a": {"type": "integer"}}, required=["a"])
    strict = _tool("g", {"a": {"type": "integer"}}, required=["a"], strict=True)
    bare = _tool("h")
    assert argument_rules([loose, strict, bare], False, rule, "ANY") == [
        "t0_0: a:free",
        "t0_arguments: t0_0?",
        "t1_0: a:bound",
        "t1_arguments: t1_0",
        "t2_arguments: ANY",
    ]
    assert argument_rules([loose], True, rule, "ANY") == ["t0_0: a:bound", "t0_arguments: t0_0"]
