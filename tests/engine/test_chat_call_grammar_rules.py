"""The grammars each chat format holds its tool calls to, rule by rule: which values are held to
their schemas (strict tools and forced choices only), how an enum of strings is written, and
where a forced call starts; the marker that opens a call and the text that ends reasoning.
``test_constraints.py`` runs the grammars against a tokenizer."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.engine.chat import DEEPSEEK_V4, GLM5, NamedTool
from ds4mlx.engine.chat.call_grammar import Parameter, callable_tools, literal
from ds4mlx.engine.tokenizer import Tokenizer
from ds4mlx.gguf import GGUFFile

import pytest

PICK = {
    "type": "function",
    "function": {
        "name": "pick",
        "parameters": {
            "type": "object",
            "properties": {
                "color": {"type": "string", "enum": ["red", "blue"]},
                "n": {"type": "integer"},
                "mixed": {"type": "string", "enum": ["a", 1]},
            },
        },
    },
}
OTHER = {"type": "function", "function": {"name": "other", "parameters": {}}}
ASSETS = Path(__file__).resolve().parents[2] / "assets"
# The layout the templates render JSON with (json.dumps' separators), no free whitespace.
LAYOUT = (
    '"x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}'
)


def rules(chat_format, tool_choice) -> dict[str, str]:
    grammar = chat_format.call_syntax([PICK, OTHER], tool_choice).grammar
    return dict(line.split(": ", 1) for line in grammar.splitlines())


@pytest.mark.parametrize("tool_choice", ["auto", "required", NamedTool("pick")])
def test_glm_holds_values_to_their_schemas_only_for_a_forced_choice(tool_choice):
    bound = tool_choice != "auto"
    arguments = rules(GLM5, tool_choice)
    value = '("red" | "blue") "</arg_value>"' if bound else "raw"
    assert arguments["t0_0"] == '"<arg_key>color</arg_key><arg_value>" ' + value
    schema = '{"type": "integer", ' if bound else "{"
    assert arguments["t0_1"] == (
        f'"<arg_key>n</arg_key><arg_value>" %json {schema}{LAYOUT}}} "</arg_value>"'
    )
    # An enum that is not all strings cannot be written as literal text: any text.
    assert arguments["t0_2"] == '"<arg_key>mixed</arg_key><arg_value>" raw'


@pytest.mark.parametrize(
    ("tool_choice", "start"),
    [
        ("auto", "call more_calls"),
        ("required", "call more_calls"),
        (NamedTool("pick"), 't0_arguments "</tool_call>" more_calls'),
    ],
)
def test_glm_starts_after_the_name_only_for_a_named_choice(tool_choice, start):
    assert rules(GLM5, tool_choice)["start"] == start


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_deepseek_writes_a_narrowed_string_as_json_only_when_held_to_its_schema(tool_choice):
    color = rules(DEEPSEEK_V4, tool_choice)["t0_0"]
    head = '"<｜DSML｜parameter name=\\"color\\" string='
    if tool_choice == "auto":
        assert color == head + '\\"true\\">" raw "\\n"'
    else:
        schema = '{"type": "string", "enum": ["red", "blue"], '
        end = literal("</｜DSML｜parameter>\n")
        assert color == f'{head}\\"false\\">" %json {schema}{LAYOUT}}} {end}'


@pytest.mark.parametrize(
    ("tool_choice", "start"),
    [
        ("auto", literal('tool_calls>\n<｜DSML｜invoke name="') + " invoke_named calls_rest"),
        ("required", "invoke_named calls_rest"),
        (NamedTool("pick"), 't0_arguments "</｜DSML｜invoke>" calls_rest'),
    ],
)
def test_deepseek_starts_where_the_prompt_left_the_call(tool_choice, start):
    assert rules(DEEPSEEK_V4, tool_choice)["start"] == start


def test_a_tool_without_a_name_is_refused():
    with pytest.raises(ValueError, match="distinct non-empty names"):
        callable_tools([{"type": "function", "function": {"parameters": {}}}], "auto")


@pytest.mark.parametrize(
    ("schema", "is_string"),
    [({"type": "string"}, True), ({"type": ["string", "null"]}, False), ({}, False)],
)
def test_only_a_plain_string_type_is_a_string(schema, is_string):
    assert Parameter("p", schema, False).is_string is is_string


@pytest.mark.parametrize(
    ("chat_format", "asset"),
    [(DEEPSEEK_V4, "ds4-tiny.gguf"), (GLM5, "glm-tiny.gguf")],
    ids=["deepseek4", "glm5"],
)
def test_the_call_marker_is_one_token_of_the_model_and_opens_the_grammar(chat_format, asset):
    tokenizer = Tokenizer.from_gguf(GGUFFile(ASSETS / asset))
    assert tokenizer.encode(chat_format.call_marker, add_special=False, parse_special=True) == [
        tokenizer.token_to_id(chat_format.call_marker)
    ]
    assert chat_format.call_syntax([PICK]).marker == chat_format.call_marker


@pytest.mark.parametrize("chat_format", [DEEPSEEK_V4, GLM5], ids=["deepseek4", "glm5"])
def test_the_reasoning_end_is_what_the_parser_ends_reasoning_at(chat_format):
    turn = chat_format.parse(f"r{chat_format.reasoning_end}a", thinking=True)
    assert (turn.reasoning, turn.content) == ("r", "a")
