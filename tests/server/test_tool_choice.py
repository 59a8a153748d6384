"""Tool choice and cut-off tool calls, with the trained tiny model, which answers questions with
a ``search`` call whether tools are offered or not, through the official clients (greedy: the
server's default temperature is 0).

- No tools, or tool_choice none: no tool calls come back (the output is not parsed for them and
  the template renders no tools), on every API.
- tool_choice required / a named function: the call is made (of that function).
- A call cut off by the token limit or a stop string ends as finish_reason length (or stop)
  with no DSML markup in the text, streamed or not.
- Streamed, a call's name comes first and its arguments follow in pieces while the model
  writes them, on every API, and the official clients' accumulators put them together.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT, ScriptedService, serve

QUESTION = [{"role": "user", "content": "Find where the config is loaded."}]
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search files for a pattern.",
        "parameters": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}},
            "required": ["pattern"],
        },
    },
}
READ = {
    "type": "function",
    "function": {
        "name": "read",
        "description": "Read a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}
MARKUP = ("DSML", "tool_calls", "invoke")


@pytest.fixture(scope="module")
def client(tiny_url):
    return openai.OpenAI(
        base_url=f"{tiny_url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )


@pytest.fixture(scope="module")
def claude(tiny_url):
    return anthropic.Anthropic(base_url=tiny_url, api_key="unused", timeout=TIMEOUT, max_retries=0)


def test_the_model_calls_search_when_tools_are_offered(client):
    # The premise of the tests below: offered tools get called.
    reply = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, tools=[SEARCH], max_tokens=60, temperature=0
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.tool_calls[0].function.name == "search"


@pytest.mark.parametrize("options", [{}, {"tools": [SEARCH], "tool_choice": "none"}])
def test_chat_without_tools_or_with_none_makes_no_call(client, options):
    reply = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, max_tokens=60, temperature=0, **options
    )
    choice = reply.choices[0]
    assert choice.finish_reason != "tool_calls" and not choice.message.tool_calls
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, max_tokens=60, temperature=0, stream=True, **options
    )
    chunks = list(stream)
    assert not any(chunk.choices and chunk.choices[0].delta.tool_calls for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason != "tool_calls"


def test_anthropic_tool_choice_none_makes_no_call(claude):
    tool = {
        "name": "search",
        "description": "Search files for a pattern.",
        "input_schema": SEARCH["function"]["parameters"],
    }
    for options in ({}, {"tools": [tool], "tool_choice": {"type": "none"}}):
        reply = claude.messages.create(model=MODEL_ID, max_tokens=60, messages=QUESTION, **options)
        assert reply.stop_reason != "tool_use"
        assert all(block.type != "tool_use" for block in reply.content)


def test_responses_without_tools_makes_no_call(client):
    for options in (
        {},
        {
            "tools": [
                {
                    "type": "function",
                    "name": "search",
                    "parameters": SEARCH["function"]["parameters"],
                }
            ],
            "tool_choice": "none",
        },
    ):
        response = client.responses.create(
            model=MODEL_ID, input=QUESTION, max_output_tokens=60, temperature=0, **options
        )
        assert all(item.type != "function_call" for item in response.output)


def test_tool_choice_none_renders_no_tools(engine):
    service = ScriptedService([])
    with serve(service, engine) as url:
        client = openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
        )
        with pytest.raises(openai.APIError):  # the script has no Finished: it fails
            client.chat.completions.create(
                model=MODEL_ID, messages=QUESTION, tools=[SEARCH], tool_choice="none"
            )
    assert service.requests[0]["tools"] is None
    assert service.requests[0]["tool_choice"] == "none"


def test_named_tool_choice_calls_that_function(client, claude):
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=QUESTION,
        tools=[SEARCH, READ],
        max_tokens=60,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "read"}},
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert [call.function.name for call in reply.choices[0].message.tool_calls] == ["read"]

    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
        for t in (SEARCH, READ)
    ]
    message = claude.messages.create(
        model=MODEL_ID,
        max_tokens=60,
        messages=QUESTION,
        tools=tools,
        tool_choice={"type": "tool", "name": "read"},
    )
    assert message.stop_reason == "tool_use"
    assert [b.name for b in message.content if b.type == "tool_use"] == ["read"]


def test_required_tool_choice_makes_a_call(client):
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=QUESTION,
        tools=[SEARCH, READ],
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    assert reply.choices[0].message.tool_calls


@pytest.mark.parametrize("max_tokens", [6, 12])
def test_a_call_cut_by_the_token_limit_leaves_no_markup(client, claude, max_tokens):
    reply = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, tools=[SEARCH], max_tokens=max_tokens, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert not any(word in (choice.message.content or "") for word in MARKUP)

    chunks = list(
        client.chat.completions.create(
            model=MODEL_ID,
            messages=QUESTION,
            tools=[SEARCH],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert not any(word in streamed for word in MARKUP)
    assert chunks[-1].choices[0].finish_reason == "length"

    tool = {"name": "search", "input_schema": SEARCH["function"]["parameters"]}
    message = claude.messages.create(
        model=MODEL_ID, max_tokens=max_tokens, messages=QUESTION, tools=[tool]
    )
    assert message.stop_reason == "max_tokens"
    assert not any(
        word in block.text for block in message.content if block.type == "text" for word in MARKUP
    )


def test_a_call_cut_by_a_stop_string_leaves_no_markup(client):
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=QUESTION,
        tools=[SEARCH],
        max_tokens=60,
        temperature=0,
        stop=["pattern"],
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert not any(word in (choice.message.content or "") for word in MARKUP)


def test_tool_call_arguments_stream_while_written(client):
    whole = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, tools=[SEARCH], max_tokens=60, temperature=0
    )
    expected = whole.choices[0].message.tool_calls[0]
    chunks = list(
        client.chat.completions.create(
            model=MODEL_ID,
            messages=QUESTION,
            tools=[SEARCH],
            max_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    pieces = [
        call
        for chunk in chunks
        if chunk.choices
        for call in chunk.choices[0].delta.tool_calls or ()
    ]
    # The id and name come first, on their own; the arguments follow in pieces.
    assert pieces[0].id and pieces[0].function.name == "search"
    assert pieces[0].function.arguments == ""
    assert len(pieces) >= 3 and all(p.index == 0 and p.id is None for p in pieces[1:])
    assert "".join(p.function.arguments for p in pieces) == expected.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_streamed_arguments_through_the_official_accumulators(client, claude):
    tool = {"name": "search", "input_schema": SEARCH["function"]["parameters"]}
    with claude.messages.stream(
        model=MODEL_ID, max_tokens=60, messages=QUESTION, tools=[tool]
    ) as stream:
        events = list(stream)
        message = stream.get_final_message()
    json_deltas = [
        e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(json_deltas) >= 2
    uses = [block for block in message.content if block.type == "tool_use"]
    assert uses[0].name == "search" and "pattern" in uses[0].input
    assert message.stop_reason == "tool_use"

    responses_tool = {
        "type": "function",
        "name": "search",
        "parameters": SEARCH["function"]["parameters"],
    }
    with client.responses.stream(
        model=MODEL_ID, input=QUESTION, tools=[responses_tool], max_output_tokens=60
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert sum(e.type == "response.function_call_arguments.delta" for e in events) >= 2
    call = next(item for item in final.output if item.type == "function_call")
    assert call.name == "search" and call.status == "completed"
    assert json.loads(call.arguments) == uses[0].input


def test_a_streamed_call_cut_off_is_reported_incomplete(client):
    tool = {"type": "function", "name": "search", "parameters": SEARCH["function"]["parameters"]}
    with client.responses.stream(
        model=MODEL_ID, input=QUESTION, tools=[tool], max_output_tokens=12
    ) as stream:
        final = stream.get_final_response()
    assert final.status == "incomplete"
    assert all(item.status == "incomplete" for item in final.output if item.type == "function_call")
    assert "DSML" not in final.output_text
