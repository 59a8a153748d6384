"""Constrained decoding (``engine.constraints``) and log-probabilities, on the trained tiny models
(DeepSeek's DSML and GLM's ``<tool_call>`` syntax):

- reported log-probabilities of greedy tokens are the log-softmax of the step's logits, and the
  top alternatives are ordered, pipelined or one step at a time;
- the pipelined decoder under a constraint commits what one-step decoding commits;
- a constraint rolled back across its phases masks as before;
- chats: no call markup where no call may be made, forced and offered calls parse and name an
  offered tool with schema-valid arguments.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import ds4mlx
from ds4mlx.engine.chat import DEEPSEEK_V4, GLM5
from ds4mlx.engine.chat.call_grammar import argument_rules, callable_tools
from ds4mlx.engine.chat.glm5 import CALL_START
from ds4mlx.engine.constraints import CallConstraint, JsonConstraint, markup_ban
from ds4mlx.engine.generate import Decoder, DoneEvent, run_alone, stepped_generate
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.generation import (
    DSML,
    ChatService,
    NamedTool,
    TextDelta,
    ToolCallComplete,
    ToolCallError,
)

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
MODELS = {"deepseek4": ASSETS / "ds4-tiny.gguf", "glm5": ASSETS / "glm-tiny.gguf"}
MARKERS = {"deepseek4": DSML, "glm5": CALL_START}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
        },
    },
}
QUESTIONS = ["Weather in Paris?", "Find the config loader.", "def main():", "Hello!"]


@cache
def model(arch: str):
    if not MODELS[arch].is_file():
        pytest.skip(f"{MODELS[arch]} is not built")
    return ds4mlx.load_model(MODELS[arch])


def _prompt(arch: str, tools=None, tool_choice="auto") -> list[int]:
    chat = model(arch).chat_format
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    return chat.tokenize(model(arch).tokenizer, messages, tools, tool_choice=tool_choice)


def _decode(arch, prompt, pipeline, constraint=None, options=None, n=32):
    decoder = Decoder()
    decoder.pipeline = pipeline
    events = run_alone(
        stepped_generate(
            model(arch).new_session(),
            prompt,
            n,
            options or SamplingOptions(),
            stop_tokens=model(arch).tokenizer.stop_ids,
            decoder=decoder,
            constraint=constraint,
        )
    )
    return [event for event in events if not isinstance(event, DoneEvent)]


@pytest.mark.parametrize("pipeline", [1, 4])
def test_greedy_logprobs_are_the_log_softmax_of_the_step_logits(pipeline):
    prompt = _prompt("deepseek4")
    events = _decode("deepseek4", prompt, pipeline, options=SamplingOptions(logprobs=5), n=12)
    session = model("deepseek4").new_session()
    logits = session.feed_mx(prompt)[-1]
    for event in events:
        expected = np.array(logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32)))
        assert event.logprob.token == event.token == int(expected.argmax())
        assert event.logprob.logprob == pytest.approx(float(expected[event.token]), abs=1e-5)
        top = event.logprob.top
        assert [token for token, _ in top] == list(np.argsort(-expected)[:5])
        assert [value for _, value in top] == sorted((value for _, value in top), reverse=True)
        assert sum(np.exp([value for _, value in top])) < 1
        logits = session.feed_mx([event.token])[-1]


@pytest.mark.parametrize("arch", ["deepseek4", "glm5"])
@pytest.mark.parametrize("offered", [False, True])
def test_pipelined_constrained_decoding_equals_one_step(arch, offered):
    chat = model(arch).chat_format
    tokenizer = model(arch).tokenizer
    tools = [WEATHER] if offered else None

    def constraint():
        syntax = chat.call_syntax(tools) if tools else None
        return CallConstraint(tokenizer, MARKERS[arch], syntax)

    prompt = _prompt(arch, tools)
    one_step = _decode(arch, prompt, 1, constraint())
    pipelined = _decode(arch, prompt, 4, constraint())
    assert [e.token for e in pipelined] == [e.token for e in one_step]


def test_a_rolled_back_constraint_masks_as_before():
    tokenizer = model("deepseek4").tokenizer
    syntax = model("deepseek4").chat_format.call_syntax([WEATHER])
    text = 'Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
    tokens = tokenizer.encode(text)
    one_by_one = CallConstraint(tokenizer, DSML, syntax)
    expected = []
    for token in tokens:
        expected.append(np.array(one_by_one.mask()))
        one_by_one.advance(token)
    expected.append(np.array(one_by_one.mask()))
    along = CallConstraint(tokenizer, DSML, syntax)
    along.advance(tokens[0])
    masks = np.array(along.masks_along(tokens[1:]))
    np.testing.assert_array_equal(masks, np.stack(expected[1:]))
    np.testing.assert_array_equal(np.array(along.mask()), expected[1])
    assert along.allowed_prefix(tokens[1:]) == len(tokens) - 1
    assert along.allowed_prefix([tokenizer.encode("<｜DSML｜invoke")[1]]) == 0  # no "<" before


def _turn(arch, question, **options):
    service = ChatService(model(arch), max_context=2048)
    events = list(service.chat([{"role": "user", "content": question}], max_tokens=160, **options))
    text = "".join(event.text for event in events if isinstance(event, TextDelta))
    calls = [event.call for event in events if isinstance(event, ToolCallComplete)]
    errors = [event for event in events if isinstance(event, ToolCallError)]
    return text, calls, errors


@pytest.mark.parametrize("arch", ["deepseek4", "glm5"])
@pytest.mark.parametrize("options", [{}, {"tools": [WEATHER], "tool_choice": "none"}])
def test_no_call_markup_where_no_call_may_be_made(arch, options):
    for question in QUESTIONS:
        text, calls, errors = _turn(arch, question, **options)
        assert MARKERS[arch] not in text and not calls and not errors


@pytest.mark.parametrize("arch", ["deepseek4", "glm5"])
@pytest.mark.parametrize("choice", ["required", NamedTool("get_weather")])
def test_forced_calls_name_the_tool_with_schema_valid_arguments(arch, choice):
    for question in QUESTIONS:
        text, calls, errors = _turn(arch, question, tools=[WEATHER], tool_choice=choice)
        # The tiny model may go on calling until the token limit cuts the last call off.
        assert calls and all(error.unterminated for error in errors)
        assert MARKERS[arch] not in text
        for call in calls:
            assert call.name == "get_weather"
            jsonschema.validate(call.arguments, WEATHER["function"]["parameters"])


@pytest.mark.parametrize("arch", ["deepseek4", "glm5"])
def test_offered_calls_parse_and_name_an_offered_tool(arch):
    decoy = json.loads(json.dumps(WEATHER))
    decoy["function"]["name"] = "get_time"
    for question in QUESTIONS:
        text, calls, errors = _turn(arch, question, tools=[WEATHER, decoy])
        assert all(error.unterminated for error in errors) and MARKERS[arch] not in text
        assert {call.name for call in calls} <= {"get_weather", "get_time"}


# ------------------------------------------------------------------ the call grammar's rules


def test_tools_of_one_name_are_refused():
    with pytest.raises(ValueError, match="distinct non-empty names"):
        callable_tools([WEATHER, WEATHER], "auto")
    assert callable_tools([WEATHER], "required") == ([WEATHER], True)


@pytest.mark.parametrize(
    ("tool_choice", "strict", "bound"),
    [("auto", False, False), ("auto", True, True), ("required", False, True)],
)
def test_arguments_are_held_to_the_schema_when_strict_or_forced(tool_choice, strict, bound):
    tool = {"type": "function", "function": {**WEATHER["function"], "strict": strict}}
    tools, forced = callable_tools([tool], tool_choice)
    seen = []
    argument_rules(
        tools, forced, lambda parameter, schema_bound: seen.append(schema_bound) or "x", "y"
    )
    assert seen and set(seen) == {bound}


@pytest.mark.parametrize("chat_format", [DEEPSEEK_V4, GLM5], ids=["deepseek4", "glm5"])
@pytest.mark.parametrize("choice", ["auto", "required", NamedTool("get_weather")], ids=str)
def test_a_turn_takes_more_calls_only_when_parallel(chat_format, choice):
    def grammar(parallel: bool) -> str:
        return chat_format.call_syntax([WEATHER], choice, parallel).grammar

    # Only the rules that differ: the one-call grammar lacks the repetition the other has.
    one, many = set(grammar(False).splitlines()), set(grammar(True).splitlines())
    assert one != many
    assert len(grammar(False)) < len(grammar(True))


class _Pieces:
    """A tokenizer of a handful of pieces (only what the marker scan reads)."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        self.vocab_size = len(pieces)

    def token_bytes(self, token: int) -> bytes:
        return self.pieces[token]


def test_every_token_holding_the_marker_is_banned_wherever_it_holds_it():
    pieces = [b"a", b"<tool_call>", b" <tool_call>", b"x<tool_call>y", b"<tool", b"_call>"]
    constraint = markup_ban(_Pieces(pieces), "<tool_call>")
    assert np.array(constraint.mask()).tolist() == [True, False, False, False, True, True]
    assert markup_ban(_Pieces([b"a", b"<tool"]), "<tool_call>") is None  # nothing to ban


def test_rolling_back_a_stop_token_leaves_the_grammar_where_it_was():
    # A speculative draft may hold a stop token: the grammar never took it, so rolling it
    # back must not undo the token before it.
    tokenizer = model("deepseek4").tokenizer
    constraint = JsonConstraint(tokenizer, None)
    for token in tokenizer.encode('{"a": 1', parse_special=False):
        constraint.advance(token)
    before = np.array(constraint.mask())
    constraint.advance(tokenizer.stop_ids[0])
    constraint.rollback(1)
    np.testing.assert_array_equal(np.array(constraint.mask()), before)


def test_json_without_a_schema_is_an_object():
    """``response_format: json_object`` (no schema) holds the output to a JSON object: a bare
    number, string or array cannot start it."""
    tokenizer = model("deepseek4").tokenizer
    allowed = np.array(JsonConstraint(tokenizer, None).mask())
    for text in ("{", "5", '"', "["):
        first = tokenizer.encode(text, parse_special=False)[0]
        assert allowed[first] == (text == "{"), text


@pytest.mark.parametrize("arch", ["deepseek4", "glm5"])
def test_json_after_reasoning_takes_free_reasoning_then_the_object(arch):
    """With thinking on, the JSON constraint lets the reasoning run as free text up to the
    format's end-of-reasoning marker, and holds what follows to the object."""
    chat_format = DEEPSEEK_V4 if arch == "deepseek4" else GLM5
    tokenizer = model(arch).tokenizer
    constraint = JsonConstraint(tokenizer, None, reasoning_end=chat_format.reasoning_end)
    text = f"Let me think: 2 + 2.{chat_format.reasoning_end}" + '{"a": 4}'
    for token in tokenizer.encode(text, parse_special=True):
        assert np.array(constraint.mask())[token], tokenizer.decode([token])
        constraint.advance(token)
    assert np.array(constraint.mask())[tokenizer.stop_ids[0]]
    # Without thinking, free text cannot start the answer.
    plain = np.array(JsonConstraint(tokenizer, None).mask())
    assert not plain[tokenizer.encode("Let", parse_special=False)[0]]
