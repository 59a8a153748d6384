"""What every endpoint shares, called directly: the tool choice, thinking and effort, the token
limit, content joined as text, JSON output formats, sampling overrides, the names of invalid
fields, and the ChatService call a request becomes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ds4mlx.generation import JsonFormat, NamedTool, SamplingOptions
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import (
    GenerationCall,
    GenerationDefaults,
    JsonSchemaFormat,
    SamplingFields,
    ThinkingControl,
    joined_text,
    json_arguments,
    output_format,
    parse_request,
    resolve_thinking,
    stop_strings,
    template_effort,
    token_limit,
    tool_choice_for,
    unsupported_content,
)
from ds4mlx.server.limits import RequestLimits
from ds4mlx.server.openai_chat import ChatCompletionRequest

import pytest

from server.harness import ScriptedService

TOOLS = [{"type": "function", "function": {"name": "a"}}]
DEFAULTS = GenerationDefaults(max_tokens=16, sampling=SamplingOptions(temperature=0.5))


def refusal(call: Any, *args: Any) -> APIError:
    with pytest.raises(APIError) as refused:
        call(*args)
    assert refused.value.status == 400
    return refused.value


@pytest.mark.parametrize(
    ("tools", "choice", "named", "expected"),
    [
        (TOOLS, None, None, "auto"),
        (TOOLS, "auto", None, "auto"),
        (TOOLS, "none", None, "none"),
        (TOOLS, "required", None, "required"),
        (None, "auto", None, "none"),
        ([], None, None, "none"),
        (TOOLS, None, "a", NamedTool("a")),
    ],
)
def test_the_tool_choice(tools, choice, named, expected):
    assert tool_choice_for(tools, choice, named, ["a", "b"]) == expected


@pytest.mark.parametrize(
    ("offered", "listed"), [(["a", "b"], "'a', 'b'"), ([], "none")], ids=["some", "none"]
)
def test_a_named_tool_not_offered_is_refused_naming_the_offered_ones(offered, listed):
    error = refusal(tool_choice_for, TOOLS, None, "x", offered)
    assert error.message == (
        f"invalid 'tool_choice': the function 'x' is not among the tools offered ({listed})"
    )
    assert error.param == "tool_choice"


@pytest.mark.parametrize(
    ("control", "effort", "default", "thinking"),
    [
        (True, "none", False, True),
        (False, "high", True, False),
        (ThinkingControl(type="enabled"), None, False, True),
        (ThinkingControl(type="disabled"), "high", True, False),
        (None, "low", False, True),
        (None, "none", True, False),
        (None, None, True, True),
        (None, None, False, False),
    ],
)
def test_thinking_follows_the_switch_then_the_effort_then_the_default(
    control, effort, default, thinking
):
    assert resolve_thinking(control, effort, default) is thinking


@pytest.mark.parametrize(
    ("effort", "rendered"), [(None, None), ("none", None), ("minimal", "minimal"), ("max", "max")]
)
def test_the_effort_a_prompt_is_rendered_with(effort, rendered):
    assert template_effort(effort) == rendered


@pytest.mark.parametrize(("requested", "limit"), [(None, 16), (0, 0), (1, 1), (500, 500)])
def test_the_token_limit_is_the_requested_one_else_the_servers(requested, limit):
    assert token_limit(requested, DEFAULTS) == limit


@pytest.mark.parametrize(
    ("stop", "strings"), [(None, ()), ("END", ("END",)), (["a", "b"], ("a", "b")), ([], ())]
)
def test_stop_strings(stop, strings):
    assert stop_strings(stop) == strings


class Part:
    def __init__(self, type: str, text: str | None) -> None:
        self.type, self.text = type, text


def test_content_is_a_string_or_its_text_parts_joined_by_newlines():
    assert joined_text(None, "content") == ""
    assert joined_text("", "content") == ""
    assert joined_text("hi", "content") == "hi"
    assert joined_text([Part("text", "a"), Part("text", "b")], "content") == "a\nb"
    assert joined_text([Part("input_text", "a")], "content", ("input_text",)) == "a"


def test_content_of_another_type_is_unsupported_naming_its_part():
    error = refusal(
        joined_text, [Part("text", "a"), Part("image_url", None)], "messages[0].content"
    )
    expected = unsupported_content("messages[0].content[1]", "image_url")
    assert (error.message, error.param, error.code) == (
        "'messages[0].content[1]' is not supported: content of type 'image_url' "
        "(only text is understood)",
        "messages[0].content[1]",
        "unsupported_parameter",
    )
    assert (expected.message, expected.param, expected.code) == (
        error.message,
        error.param,
        error.code,
    )


def test_output_formats():
    assert output_format("text", None, "response_format") is None
    assert output_format("json_object", None, "response_format") == JsonFormat()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert output_format(
        "json_schema", JsonSchemaFormat(schema=schema), "response_format"
    ) == JsonFormat(schema)


def test_output_formats_refused():
    unknown = refusal(output_format, "xml", None, "text.format")
    assert unknown.message == (
        "invalid 'text.format.type': 'xml' (expected 'text', 'json_object' or 'json_schema')"
    )
    assert unknown.param == "text.format.type"
    for schema_format in (None, JsonSchemaFormat()):
        missing = refusal(output_format, "json_schema", schema_format, "response_format")
        assert missing.message == "'response_format' of type 'json_schema' needs a schema"
        assert missing.param == "response_format"


def test_every_sampling_field_overrides_the_default():
    fields = {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "min_p": 0.1,
        "seed": 7,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.25,
        "repeat_penalty": 1.1,
        "repeat_last_n": 32,
    }
    sampling = SamplingFields(**fields).sampling(DEFAULTS)
    assert {name: getattr(sampling, name) for name in fields} == fields
    assert SamplingFields().sampling(DEFAULTS) == DEFAULTS.sampling
    biased = SamplingFields(logit_bias={"12": -100.0, "3": 2.5}).sampling(DEFAULTS)
    assert biased.logit_bias == ((12, -100.0), (3, 2.5))


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (b'{"model"', "the body is not valid JSON: ", None),
        (b"[1]", "the body must be a JSON object: ", None),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": 3}]}',
            "invalid 'messages[0].content': Input should be a valid string; or ",
            "messages[0].content",
        ),
        (b'{"model": 1, "messages": []}', "invalid 'model': ", "model"),
    ],
)
def test_invalid_bodies_name_the_field(body, message, param):
    error = refusal(parse_request, ChatCompletionRequest, body)
    assert error.message.startswith(message)
    assert error.param == param


class RecordingService:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def chat(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append(("chat", args, kwargs))
        return "chat"

    def complete(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append(("complete", args, kwargs))
        return "complete"

    def chat_prompt(self, *args: Any, **kwargs: Any) -> list[int]:
        self.calls.append(("chat_prompt", args, kwargs))
        return [1]


def test_a_chat_call_passes_every_option_and_streams_arguments():
    service = RecordingService()
    messages = [{"role": "user", "content": "hi"}]
    call = GenerationCall(
        max_tokens=9,
        sampling=DEFAULTS.sampling,
        stop=("x",),
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        thinking=True,
        reasoning_effort="high",
        prompt_tokens=[4, 5],
        output_format=JsonFormat(),
        parallel_tool_calls=False,
    )
    assert call.run(service) == "chat"
    assert call.chat_prompt(service) == [1]
    assert service.calls == [
        (
            "chat",
            (messages, TOOLS),
            {
                "max_tokens": 9,
                "sampling": DEFAULTS.sampling,
                "stop": ("x",),
                "thinking": True,
                "reasoning_effort": "high",
                "tool_choice": "required",
                "prompt_tokens": [4, 5],
                "stream_arguments": True,
                "output_format": JsonFormat(),
                "parallel_tool_calls": False,
            },
        ),
        (
            "chat_prompt",
            (messages, TOOLS),
            {"thinking": True, "reasoning_effort": "high", "tool_choice": "required"},
        ),
    ]


def test_a_chat_call_leaves_out_the_default_effort_and_tool_choice():
    service = RecordingService()
    GenerationCall(max_tokens=1, sampling=DEFAULTS.sampling, messages=[]).chat_prompt(service)
    assert service.calls == [("chat_prompt", ([], None), {"thinking": False})]


def test_a_completion_call_passes_its_prompt_and_options():
    service = RecordingService()
    call = GenerationCall(
        max_tokens=3,
        sampling=DEFAULTS.sampling,
        stop=("\n",),
        prompt="Once",
        output_format=JsonFormat(),
    )
    assert call.run(service) == "complete"
    assert service.calls == [
        (
            "complete",
            ("Once",),
            {
                "max_tokens": 3,
                "sampling": DEFAULTS.sampling,
                "stop": ("\n",),
                "output_format": JsonFormat(),
            },
        )
    ]


def test_the_text_every_prompt_contains():
    messages = [
        {"role": "system", "content": "ab"},
        {"role": "user", "content": [{"type": "text", "text": "not counted"}]},
        {"role": "assistant", "content": "  cd  "},
        {"role": "tool", "content": "ef"},
        {"role": "developer", "content": "not counted"},
        {"role": "user", "content": "g"},
    ]
    call = GenerationCall(max_tokens=1, sampling=DEFAULTS.sampling, messages=messages)
    assert call.text_characters == 7
    assert GenerationCall(max_tokens=1, sampling=DEFAULTS.sampling).text_characters == 0


# Each sampling field's bounds, both sides: the value at the bound is taken, one step past it
# refused by name (llama.cpp's top_k 0 and repeat_last_n -1 mean "off" and "the whole context").
@pytest.mark.parametrize(
    ("field", "taken", "refused"),
    [
        ("top_k", 0, -1),
        ("frequency_penalty", 2.0, 2.01),
        ("frequency_penalty", -2.0, -2.01),
        ("presence_penalty", 2.0, 2.01),
        ("presence_penalty", -2.0, -2.01),
        ("repeat_penalty", 10.0, 10.01),
        ("repeat_last_n", -1, -2),
    ],
)
def test_a_sampling_bound_is_taken_and_one_step_past_it_refused(field, taken, refused):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    parsed = parse_request(ChatCompletionRequest, json.dumps({**body, field: taken}).encode())
    assert getattr(parsed, field) == taken
    error = refusal(
        parse_request, ChatCompletionRequest, json.dumps({**body, field: refused}).encode()
    )
    assert error.param == field


@pytest.mark.parametrize(("bias", "taken"), [(100.0, True), (-100.0, True), (100.5, False)])
def test_a_logit_bias_is_at_most_100_either_way(bias, taken):
    hi = [{"role": "user", "content": "hi"}]
    body = json.dumps({"model": "m", "messages": hi, "logit_bias": {"5": bias}})
    if taken:
        assert parse_request(ChatCompletionRequest, body.encode()).logit_bias == {"5": bias}
    else:
        assert refusal(parse_request, ChatCompletionRequest, body.encode()).param == "logit_bias.5"


def test_a_whole_context_penalty_window_covers_a_million_token_context():
    """repeat_last_n -1 stands for any context: a 1M-token model's window is all of it."""
    service = ScriptedService([], max_context=1_000_000)
    call = GenerationCall(
        prompt="a", max_tokens=1, sampling=SamplingFields(repeat_last_n=-1).sampling(DEFAULTS)
    )
    checked = asyncio.run(RequestLimits(service).tokenized(call, service))
    assert checked.sampling.repeat_last_n == 1_000_000


def test_call_arguments_keep_their_characters_in_json():
    assert json_arguments({"city": "Zürich", "note": "東京"}) == (
        '{"city": "Zürich", "note": "東京"}'
    )
