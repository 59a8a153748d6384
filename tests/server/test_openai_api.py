"""The OpenAI endpoints through the official ``openai`` client, against the chat model."""

from __future__ import annotations

import json

import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base_url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )


def test_lists_the_served_model(client):
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    # The context the server serves, which clients such as ds4-agent --api-base read.
    assert models.data[0].model_extra["context_length"] == 1024


def test_chat_returns_text_and_usage_counts_the_rendered_prompt(client, prompt_tokens):
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    completion = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=6)
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage.prompt_tokens == prompt_tokens(messages)
    assert completion.usage.completion_tokens == 6
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 6


def test_streamed_chat_equals_the_whole_answer(client):
    messages = [{"role": "user", "content": "List the files."}]
    whole = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=8)
    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage.prompt_tokens == whole.usage.prompt_tokens and usage.completion_tokens == 8
    # The same prompt again: everything but the last token comes from the session.
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


def test_a_growing_conversation_reports_cached_tokens(client):
    first = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    answer = client.chat.completions.create(model=MODEL_ID, messages=first, max_tokens=5)
    second = [
        *first,
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": "Thanks!"},
    ]
    reply = client.chat.completions.create(model=MODEL_ID, messages=second, max_tokens=5)
    assert reply.usage.prompt_tokens_details.cached_tokens > reply.usage.prompt_tokens // 2


def test_stop_sequences_cut_chat_and_completions(client):
    prompt = "The quick brown fox"
    text = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12).choices[0].text
    assert len(text) > 4
    stop = text[2:4]
    cut = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"

    messages = [{"role": "user", "content": "hello there"}]
    answer = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12)
    content = answer.choices[0].message.content
    stopped = client.chat.completions.create(
        model=MODEL_ID, messages=messages, max_tokens=12, stop=content[3:5]
    )
    assert stopped.choices[0].message.content == content[: content.index(content[3:5])]
    assert stopped.choices[0].finish_reason == "stop"


def test_legacy_completions_stream_and_count_tokens(client, chat_model):
    prompt = "def add(a, b):"
    whole = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=7)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == len(chat_model.tokenizer.encode(prompt, add_special=True))
    assert whole.usage.completion_tokens == 7
    chunks = list(
        client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=7, stream=True)
    )
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_seed_makes_sampling_reproducible(client):
    def sample(seed: int) -> str:
        return (
            client.chat.completions.create(
                model=MODEL_ID,
                messages=[{"role": "user", "content": "hello there"}],
                max_tokens=12,
                temperature=1.0,
                top_p=0.95,
                seed=seed,
                extra_body={"top_k": 100, "min_p": 0.001},
            )
            .choices[0]
            .message.content
        )

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_offered_tools_are_rendered_into_the_prompt(client, prompt_tokens):
    hidden = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=2
    )
    assert hidden.usage.prompt_tokens == prompt_tokens(QUESTION)
    # Offered last: the next test's conversation extends this prompt and reuses its session.
    completion = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, tools=[WEATHER_TOOL], max_tokens=2
    )
    assert completion.usage.prompt_tokens == prompt_tokens(QUESTION, [WEATHER_TOOL])


def test_tool_calls_and_results_go_back_into_the_prompt(client, prompt_tokens):
    arguments = {"city": "Paris"}
    conversation = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    completion = client.chat.completions.create(
        model=MODEL_ID, messages=conversation, tools=[WEATHER_TOOL], max_tokens=2
    )
    engine_view = [
        *QUESTION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "get_weather", "arguments": arguments}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    assert completion.usage.prompt_tokens == prompt_tokens(engine_view, [WEATHER_TOOL])


def test_responses_api_takes_function_calls_and_outputs(client, prompt_tokens):
    tool = {
        "type": "function",
        "name": "get_weather",
        **{key: WEATHER_TOOL["function"][key] for key in ("description", "parameters")},
    }
    response = client.responses.create(
        model=MODEL_ID,
        max_output_tokens=2,
        tools=[tool],
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"},
        ],
    )
    engine_view = [
        *QUESTION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    assert response.usage.input_tokens == prompt_tokens(engine_view, [WEATHER_TOOL])


def test_thinking_is_returned_as_reasoning_content(client, prompt_tokens):
    completion = client.chat.completions.create(
        model=MODEL_ID,
        messages=QUESTION,
        max_tokens=6,
        extra_body={"thinking": {"type": "enabled"}},
    )
    message = completion.choices[0].message
    # The random model never closes its thinking block: everything it writes is reasoning.
    assert message.reasoning_content and not message.content
    assert completion.usage.prompt_tokens == prompt_tokens(QUESTION, thinking=True)
    effort = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, max_tokens=6, reasoning_effort="high"
    )
    assert effort.usage.prompt_tokens == prompt_tokens(QUESTION, thinking=True)


def test_responses_api_plain_and_streamed(client, prompt_tokens):
    response = client.responses.create(
        model=MODEL_ID, input="hello there", instructions="Be brief.", max_output_tokens=6
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text
    assert response.usage.input_tokens == prompt_tokens(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    )
    assert response.usage.output_tokens == 6

    events = list(
        client.responses.create(
            model=MODEL_ID,
            input="hello there",
            instructions="Be brief.",
            max_output_tokens=6,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    # The stream ends with response.completed even when the limit cut it (its response says
    # so): the official stream helper waits for that event.
    assert kinds[-1] == "response.completed"
    assert events[-1].response.status == "incomplete"
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == response.output_text == events[-1].response.output_text
    assert [event.sequence_number for event in events] == list(range(len(events)))

    with client.responses.stream(
        model=MODEL_ID, input="hello there", instructions="Be brief.", max_output_tokens=6
    ) as stream:
        final = stream.get_final_response()
    assert final.status == "incomplete" and final.output_text == text


def test_reasoning_tokens_are_counted(client):
    """The random model never closes its thinking block: all it writes is reasoning."""
    messages = [{"role": "user", "content": "hello there"}]
    thinking = client.chat.completions.create(
        model=MODEL_ID, messages=messages, max_tokens=6, reasoning_effort="high"
    )
    assert thinking.choices[0].message.reasoning_content
    assert thinking.usage.completion_tokens_details.reasoning_tokens == 6
    plain = client.chat.completions.create(
        model=MODEL_ID, messages=messages, max_tokens=6, reasoning_effort="none"
    )
    assert plain.usage.completion_tokens_details.reasoning_tokens == 0
    response = client.responses.create(
        model=MODEL_ID, input="hello there", max_output_tokens=5, reasoning={"effort": "low"}
    )
    assert response.usage.output_tokens_details.reasoning_tokens == 5


def test_max_reasoning_effort_renders_the_templates_max_mode(client, chat_model):
    """DeepSeek-V4's template has a maximum-effort mode; "max" selects it (a longer prompt)."""
    messages = [{"role": "user", "content": "hello there"}]
    usage = {
        effort: client.chat.completions.create(
            model=MODEL_ID, messages=messages, max_tokens=1, reasoning_effort=effort
        ).usage
        for effort in ("high", "max")
    }
    expected = chat_model.chat_format.render(messages, thinking=True, reasoning_effort="max")
    assert usage["max"].prompt_tokens == len(
        chat_model.tokenizer.encode(expected, add_special=False)
    )
    assert usage["max"].prompt_tokens > usage["high"].prompt_tokens
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=MODEL_ID, messages=messages, max_tokens=1, reasoning_effort="extreme"
        )
    assert "reasoning_effort" in error.value.body["message"]
