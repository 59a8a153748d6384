"""``/v1/responses`` translated field by field (no model, no server): input items into chat
turns, the response object, what the store keeps, and the event stream."""

from __future__ import annotations

import json

from ds4mlx.generation import (
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallComplete,
    ToolCallStart,
)
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import GenerationDefaults, parse_request
from ds4mlx.server.openai_responses import ResponsesEndpoint, ResponseStore
from ds4mlx.server.turn import ResponseMeta

import pytest

from server.harness import encoded_stream, named_events

DEFAULTS = GenerationDefaults(max_tokens=100)
META = ResponseMeta("served-model", created=7)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOL = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
CALL = ToolCall("get_weather", {"city": "Paris"})


def request_for(endpoint: ResponsesEndpoint | None = None, **body):
    endpoint = endpoint or ResponsesEndpoint()
    request = parse_request(
        endpoint.request_model, json.dumps({"model": "asked-model", **body}).encode()
    )
    return request, endpoint.call(request, DEFAULTS)


def refusal(**body) -> APIError:
    with pytest.raises(APIError) as refused:
        request_for(**body)
    assert refused.value.status == 400
    return refused.value


def finished(reason: str = "stop") -> Finished:
    return Finished(
        reason, prompt_tokens=9, completion_tokens=4, cached_tokens=2, stats=None,
        reasoning_tokens=1,
    )  # fmt: skip


# ------------------------------------------------------------------------------ requests


def test_input_items_need_their_role_and_name():
    error = refusal(input=[{"type": "message", "content": "hi"}])
    assert error.param == "input[0].role"
    assert error.message == "'input[0].role' is required for a message"
    error = refusal(input=[{"role": "user", "content": "q"}, {"type": "function_call"}])
    assert error.param == "input[1].name"
    assert error.message == "'input[1].name' is required for a function_call"


def test_a_reasoning_summary_stands_in_for_missing_content_and_arguments_default_to_none():
    _, call = request_for(
        input=[
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan."}]},
            {"type": "function_call", "name": "get_weather"},
            {"type": "function_call_output", "output": [{"type": "output_text", "text": "ok"}]},
        ]
    )
    assert call.messages == [
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Plan.",
            "tool_calls": [{"id": None, "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "", "content": "ok"},
    ]


def test_a_user_message_between_assistant_items_ends_the_assistant_turn():
    _, call = request_for(
        input=[
            {"role": "assistant", "content": "One."},
            {"role": "user", "content": "And?"},
            {"role": "assistant", "content": "Two."},
        ]
    )
    assert [(m["role"], m["content"]) for m in call.messages] == [
        ("assistant", "One."),
        ("user", "And?"),
        ("assistant", "Two."),
    ]


def test_an_unknown_output_part_is_refused_by_its_place():
    error = refusal(
        input=[{"type": "function_call_output", "call_id": "c", "output": [{"type": "image"}]}]
    )
    assert error.param == "input[0].output[0]"


def test_a_string_input_is_one_user_message_and_empty_instructions_add_none():
    _, call = request_for(input="hi", instructions="")
    assert call.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "choice", [{"type": "function"}, {"type": "custom", "name": "get_weather"}, {"name": 3}]
)
def test_a_tool_choice_object_must_name_a_function(choice):
    error = refusal(input="q", tools=[TOOL], tool_choice=choice)
    assert (error.param, error.code) == ("tool_choice", "unsupported_parameter")


def test_a_named_function_choice_and_the_tools_in_the_engine_form():
    _, call = request_for(
        input="q",
        tools=[{**TOOL, "description": "Weather.", "strict": True}],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert call.tool_choice.name == "get_weather"
    assert call.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "parameters": SCHEMA,
                "strict": True,
            },
        }
    ]
    _, call = request_for(input="q", tools=[TOOL], tool_choice="none")
    assert (call.tools, call.tool_choice) == (None, "none")


def test_a_tool_without_a_name_is_refused_by_its_place():
    error = refusal(input="q", tools=[TOOL, {"type": "function"}])
    assert (error.param, error.code) == ("tools[1]", "unsupported_parameter")


def test_a_json_schema_text_format_and_its_param():
    _, call = request_for(
        input="q", text={"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}}
    )
    assert call.output_format.schema == SCHEMA
    error = refusal(input="q", text={"format": {"type": "json_schema", "name": "w"}})
    assert error.param == "text.format"


def test_an_unknown_previous_response_is_named_with_the_store_bound():
    error = refusal(input="q", previous_response_id="resp_x")
    assert (error.param, error.code) == ("previous_response_id", "previous_response_not_found")
    assert "the latest 256" in error.message


# ------------------------------------------------------------------------------ responses


def test_the_response_object_repeats_the_request_and_counts_tokens():
    endpoint = ResponsesEndpoint()
    request, _ = request_for(
        endpoint,
        input="q",
        instructions="Be brief.",
        max_output_tokens=50,
        temperature=0.5,
        top_p=0.9,
        parallel_tool_calls=False,
        tools=[TOOL],
        text={"format": {"type": "json_object"}},
    )
    events = [ReasoningDelta("Think."), TextDelta("Sunny."), ToolCallComplete(CALL)]
    body = endpoint.response(request, events, finished(), META)
    assert body["id"].startswith("resp_")
    assert endpoint.store.response(body["id"]) == body
    output = body.pop("output")
    assert {k: v for k, v in body.items() if k != "id"} == {
        "object": "response",
        "created_at": 7,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": "Be brief.",
        "max_output_tokens": 50,
        "model": "served-model",
        "parallel_tool_calls": False,
        "temperature": 0.5,
        "top_p": 0.9,
        "tool_choice": "auto",
        "tools": [TOOL],
        "text": {"format": {"type": "json_object"}},
        "store": True,
        "previous_response_id": None,
        "truncation": "disabled",
        "metadata": {},
        "usage": {
            "input_tokens": 9,
            "input_tokens_details": {"cached_tokens": 2},
            "output_tokens": 4,
            "output_tokens_details": {"reasoning_tokens": 1},
            "total_tokens": 13,
        },
    }
    ids = [item.pop("id") for item in output]
    assert [i[: i.index("_") + 1] for i in ids] == ["rs_", "msg_", "fc_"]
    call_id = output[2]["call_id"]
    assert call_id.startswith("call_")
    assert output == [
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Think."}],
            "status": "completed",
        },
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Sunny.", "annotations": [], "logprobs": []}
            ],
        },
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        },
    ]


def test_a_text_format_left_out_is_text():
    endpoint = ResponsesEndpoint()
    request, _ = request_for(endpoint, input="q")
    body = endpoint.response(request, [], finished(), META)
    assert (body["text"], body["tool_choice"], body["tools"]) == (
        {"format": {"type": "text"}},
        "auto",
        [],
    )


def test_the_next_request_continues_from_the_stored_turn():
    endpoint = ResponsesEndpoint()
    request, _ = request_for(endpoint, input="q", instructions="Sys.")
    events = [
        ReasoningDelta("Hm."),
        TextDelta("A"),
        TextDelta("nswer."),
        ToolCallStart("get_weather"),
        ToolCallArguments('{"city":"Paris"}'),
        ToolCallComplete(CALL),
    ]
    first = endpoint.response(request, events, finished("tool_calls"), META)
    call_id = first["output"][2]["call_id"]
    _, call = request_for(endpoint, input="more", previous_response_id=first["id"])
    assert call.messages == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Answer.",
            "reasoning_content": "Hm.",
            "tool_calls": [
                {"id": call_id, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "user", "content": "more"},
    ]


def test_the_store_answers_none_for_what_it_does_not_hold_and_deletes_once():
    store = ResponseStore(capacity=1)
    store.put({"id": "a"}, [{"role": "user", "content": "x"}])
    assert store.response("a") == {"id": "a"}
    assert store.conversation("a") == [{"role": "user", "content": "x"}]
    assert (store.response("b"), store.conversation("b")) == (None, None)
    assert store.delete("a") is True
    assert store.delete("a") is False
    assert store.response("a") is None
    store.put({"id": "b"}, [])
    assert store.response("b") == {"id": "b"} and store.conversation("b") == []


def events_of(frames: list[bytes]) -> list[dict]:
    """The payloads of named frames, each named by its type."""
    parsed = named_events(frames)
    assert all(name == payload["type"] for name, payload in parsed)
    return [payload for _, payload in parsed]


def stream_of(endpoint: ResponsesEndpoint, request, *events) -> list[dict]:
    return events_of(encoded_stream(endpoint.stream(request, META), *events))


def test_the_stream_numbers_its_events_and_stores_the_response():
    endpoint = ResponsesEndpoint()
    request, _ = request_for(endpoint, input="q", stream=True)
    sent = stream_of(
        endpoint,
        request,
        ReasoningDelta("Hm."),
        TextDelta("Hi"),
        ToolCallStart("get_weather"),
        ToolCallArguments('{"city":"Paris"}'),
        ToolCallComplete(CALL),
        finished("length"),
    )
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert [e["type"] for e in sent] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    created = sent[0]["response"]
    assert (created["status"], created["output"], created["usage"]) == ("in_progress", [], None)
    reasoning_id = sent[2]["item"]["id"]
    assert sent[2]["item"] == {
        "id": reasoning_id,
        "type": "reasoning",
        "summary": [],
        "content": [],
        "status": "in_progress",
    }
    assert sent[3]["part"] == {"type": "reasoning_text", "text": ""}
    assert sent[4] | {"sequence_number": 0} == {
        "type": "response.reasoning_text.delta",
        "sequence_number": 0,
        "item_id": reasoning_id,
        "output_index": 0,
        "content_index": 0,
        "delta": "Hm.",
    }
    assert (sent[5]["text"], sent[6]["part"]["text"]) == ("Hm.", "Hm.")
    assert sent[7]["item"]["status"] == "completed"
    assert sent[9]["part"] == {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    assert (sent[10]["delta"], sent[10]["output_index"], sent[10]["logprobs"]) == ("Hi", 1, [])
    assert (sent[11]["text"], sent[11]["logprobs"]) == ("Hi", [])
    call_item = sent[14]["item"]
    assert (call_item["arguments"], call_item["status"], call_item["name"]) == (
        "",
        "in_progress",
        "get_weather",
    )
    # The deltas are the text as the model wrote it; the done event has the parsed arguments.
    assert sent[15]["delta"] == '{"city":"Paris"}' and sent[15]["item_id"] == call_item["id"]
    assert (sent[16]["name"], sent[16]["arguments"]) == ("get_weather", '{"city": "Paris"}')
    assert sent[17]["item"]["status"] == "completed"
    completed = sent[18]["response"]
    assert (completed["status"], completed["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert [item["id"] for item in completed["output"]] == [
        reasoning_id,
        sent[8]["item"]["id"],
        call_item["id"],
    ]
    assert endpoint.store.response(completed["id"]) == completed


def test_a_streamed_error_names_its_code_and_param():
    endpoint = ResponsesEndpoint()
    request, _ = request_for(endpoint, input="q", stream=True)
    stream = endpoint.stream(request, META)
    stream.start()
    [error] = events_of(stream.error(APIError(400, "bad", param="x", code="y")))
    assert error == {
        "type": "error",
        "sequence_number": 2,
        "code": "y",
        "message": "bad",
        "param": "x",
    }


def test_assistant_items_in_a_row_join_into_one_turn():
    _, call = request_for(
        input=[
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "First. "}]},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Then."}]},
            {"role": "assistant", "content": "One."},
            {"role": "assistant", "content": " Two."},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        ]
    )
    assert call.messages[1:] == [
        {
            "role": "assistant",
            "content": "One. Two.",
            "reasoning_content": "First. Then.",
            "tool_calls": [{"id": "c1", "function": {"name": "get_weather", "arguments": "{}"}}],
        }
    ]
    assert call.parallel_tool_calls is True


def test_an_input_item_of_an_unknown_type_is_refused_by_its_type():
    error = refusal(input=[{"role": "user", "content": "q"}, {"type": "image_generation_call"}])
    assert error.param == "input[1].type"


def test_a_call_the_output_ended_inside_is_an_incomplete_item():
    endpoint = ResponsesEndpoint()
    request, _ = request_for(endpoint, input="q", stream=True)
    cut_call = [ToolCallStart("get_weather"), ToolCallArguments('{"ci')]
    sent = stream_of(endpoint, request, *cut_call, finished("length"))
    done = [event["item"] for event in sent if event["type"] == "response.output_item.done"]
    assert [(item["type"], item["status"], item["arguments"]) for item in done] == [
        ("function_call", "incomplete", '{"ci')
    ]
    assert [item["status"] for item in sent[-1]["response"]["output"]] == ["incomplete"]


def test_an_unstored_continuation_says_so_and_is_not_kept():
    endpoint = ResponsesEndpoint()
    first, _ = request_for(endpoint, input="q")
    stored = endpoint.response(first, [TextDelta("A.")], finished(), META)
    second, _ = request_for(endpoint, input="more", previous_response_id=stored["id"], store=False)
    body = endpoint.response(second, [TextDelta("B.")], finished(), META)
    assert (body["store"], body["previous_response_id"]) == (False, stored["id"])
    assert endpoint.store.response(body["id"]) is None


@pytest.mark.parametrize(
    ("effort", "thinking", "rendered"), [("high", True, "high"), ("none", False, None)]
)
def test_the_reasoning_effort_switches_thinking_and_renders_the_prompt(effort, thinking, rendered):
    _, call = request_for(input="q", reasoning={"effort": effort})
    assert (call.thinking, call.reasoning_effort) == (thinking, rendered)


def test_the_token_limit_and_stop_strings_reach_the_call():
    _, call = request_for(input="q", max_output_tokens=7, stop=["END", "STOP"])
    assert (call.max_tokens, call.stop) == (7, ("END", "STOP"))
    _, call = request_for(input="q", stop="END")
    assert (call.max_tokens, call.stop) == (DEFAULTS.max_tokens, ("END",))
