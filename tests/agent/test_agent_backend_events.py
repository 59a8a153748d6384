"""The OpenAI backend without a server: the request options it sends, how streamed chunks
become events and statistics, the context size read from a model card, and the tool calls
assembled from pieces."""

from __future__ import annotations

import json
from types import SimpleNamespace

from ds4mlx.agent.backend import BackendError, OpenAIBackend, _tool_call_event, openai_messages
from ds4mlx.engine.chat import TextDelta, ToolCall, ToolCallComplete, ToolCallError
from ds4mlx.generation import Finished, SamplingOptions

import pytest


def delta(content=None, tool_calls=None, **extra):
    return SimpleNamespace(content=content, tool_calls=tool_calls, model_extra=extra)


def chunk(*deltas, finish=None, usage=None):
    choices = [SimpleNamespace(delta=d, finish_reason=finish) for d in deltas]
    return SimpleNamespace(choices=choices, usage=usage)


def piece(index, name=None, arguments=None):
    return SimpleNamespace(index=index, function=SimpleNamespace(name=name, arguments=arguments))


class Stream(list):
    closed = False

    def close(self):
        self.closed = True


class Client:
    """Records the request and answers with ``chunks``."""

    base_url = "http://fake/v1"

    def __init__(self, chunks=(), card=None):
        self.requests: list[dict] = []
        self.stream = Stream(chunks)
        self.card = card
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))
        self.models = SimpleNamespace(retrieve=lambda name: self.card)

    def _create(self, **request):
        self.requests.append(request)
        return self.stream

    def with_options(self, **options):
        return self


def backend(client: Client, **options) -> OpenAIBackend:
    made = OpenAIBackend("http://fake/v1", "m", **options)
    made.client = client
    return made


def test_the_request_carries_the_sampling_seed_tools_and_thinking_switch():
    client = Client()
    sampling = SamplingOptions(temperature=0.3, top_p=0.9, seed=0)
    tools = [{"type": "function", "function": {"name": "read"}}]
    made = backend(client, sampling=sampling)
    list(made.chat([{"role": "user", "content": "hi"}], tools, max_tokens=9, thinking=True))
    request = client.requests[0]
    assert (request["temperature"], request["top_p"], request["seed"]) == (0.3, 0.9, 0)
    assert request["tools"] == tools and request["max_tokens"] == 9
    assert request["extra_body"] == {"thinking": {"type": "enabled"}}
    assert request["stream_options"] == {"include_usage": True}
    assert client.stream.closed
    list(backend(client).chat([], [], max_tokens=9, thinking=False))
    assert {"seed", "tools", "extra_body"}.isdisjoint(client.requests[1])


def test_events_in_order_and_the_calls_by_index_at_the_end():
    chunks = [
        chunk(delta(reasoning_content="think")),
        chunk(delta("Hi")),
        chunk(delta(tool_calls=[piece(1, "li", '{"path"'), piece(0, "read", "{}")])),
        chunk(delta(tool_calls=[piece(1, "st", ': "."}'), piece(2)]), finish="tool_calls"),
        chunk(delta("")),  # a chunk without a reason after it keeps the reason
        chunk(usage=SimpleNamespace(prompt_tokens=10, completion_tokens=5)),
    ]
    client = Client(chunks)
    events = list(backend(client).chat([], [], max_tokens=9, thinking=False))
    assert [type(e).__name__ for e in events] == [
        "ReasoningDelta",
        "TextDelta",
        "ToolCallComplete",
        "ToolCallComplete",
        "ToolCallError",
        "Finished",
    ]
    assert events[2] == ToolCallComplete(ToolCall("read", {}))
    assert events[3] == ToolCallComplete(ToolCall("list", {"path": "."}))
    assert events[4] == ToolCallError("()", "tool call without a name")
    done = events[-1]
    assert isinstance(done, Finished)
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == ("tool_calls", 10, 5)
    assert done.cached_tokens == 0
    assert (done.stats.prompt_tokens, done.stats.generated_tokens) == (10, 5)
    assert done.stats.stop_reason == "tool_calls"


def test_without_usage_the_chunks_are_counted_and_the_reason_stays_stop():
    client = Client([chunk(delta("a")), chunk(delta("")), chunk(delta("b"))])
    done = list(backend(client).chat([], [], max_tokens=9, thinking=False))[-1]
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == ("stop", 0, 2)
    assert done.stats.decode_seconds > 0


def test_cached_tokens_come_from_the_usage_details():
    usage = SimpleNamespace(
        prompt_tokens=8, completion_tokens=1, prompt_tokens_details=SimpleNamespace(cached_tokens=6)
    )
    client = Client([chunk(delta("a"), finish="length", usage=usage)])
    done = list(backend(client).chat([], [], max_tokens=9, thinking=False))[-1]
    assert (done.finish_reason, done.cached_tokens) == ("length", 6)


def test_the_token_estimate_takes_the_servers_ratio_of_the_last_request():
    messages = [{"role": "user", "content": "x" * 400}]
    chars = len(json.dumps([messages, []], ensure_ascii=False))
    made = backend(Client())
    assert made.count_tokens(messages, [], thinking=False) == round(chars / 4)
    usage = SimpleNamespace(prompt_tokens=chars // 2, completion_tokens=1)
    made.client = Client([chunk(delta("a"), usage=usage)])
    list(made.chat(messages, [], max_tokens=9, thinking=False))
    assert made.count_tokens(messages, [], thinking=False) == chars // 2
    assert made.expert_hit_rate() is None


@pytest.mark.parametrize(
    ("extra", "size"),
    [
        ({"context_length": 8192}, 8192),
        ({"max_model_len": 4096, "n_ctx": 1}, 4096),
        ({"context_window": 1000}, 1000),
        ({"meta": {"n_ctx": 2048}}, 2048),
        ({"max_context_length": 512}, 512),
        ({"context_length": 0, "n_ctx": 300}, 300),
        ({"context_length": "8192"}, None),
        ({}, None),
    ],
)
def test_the_context_size_from_the_model_card(extra, size):
    card = SimpleNamespace(model_extra=extra)
    assert backend(Client(card=card)).server_context_size() == size


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("read", "", ToolCallComplete(ToolCall("read", {}))),
        ("read", '{"path": "a"}', ToolCallComplete(ToolCall("read", {"path": "a"}))),
        ("", "{}", ToolCallError("({})", "tool call without a name")),
        ("read", "[1]", ToolCallError("read([1])", "arguments are not a JSON object")),
    ],
)
def test_a_call_assembled_from_pieces(name, arguments, expected):
    assert _tool_call_event({"name": name, "arguments": arguments}) == expected


def test_arguments_that_are_not_json_name_the_error():
    event = _tool_call_event({"name": "read", "arguments": "{"})
    assert event.raw == "read({)" and event.reason.startswith("arguments are not valid JSON: ")


def test_a_stream_broken_mid_way_is_a_backend_error_and_is_closed():
    import openai

    class Broken(Stream):
        def __iter__(self):
            yield chunk(delta("Hel"))
            raise openai.OpenAIError("connection reset")

    client = Client()
    client.stream = Broken()
    events = []
    with pytest.raises(BackendError, match=r"^http://fake/v1: connection reset$"):
        for event in backend(client).chat([], [], max_tokens=9, thinking=False):
            events.append(event)
    assert events == [TextDelta("Hel")] and client.stream.closed


def test_the_model_card_is_asked_once_with_a_short_timeout():
    import openai

    asked = []
    client = Client(card=SimpleNamespace(model_extra={"n_ctx": 64}))
    client.with_options = lambda **options: asked.append(options) or client
    assert backend(client).server_context_size() == 64
    assert asked == [{"timeout": 5.0, "max_retries": 0}]

    def unknown(name):
        raise openai.OpenAIError("no such model")

    client.models.retrieve = unknown
    assert backend(client).server_context_size() is None


def test_a_tool_result_after_a_later_answer_is_sent_as_a_user_message():
    """A call id is open only until the next assistant message: a result after that answers
    no call a strict server knows."""
    call = {"id": "a", "type": "function", "function": {"name": "list", "arguments": {}}}
    converted = openai_messages(
        [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "a", "content": "files"},
            {"role": "assistant", "content": "done"},
            {"role": "tool", "tool_call_id": "a", "content": "late"},
        ]
    )
    assert converted[1] == {"role": "tool", "tool_call_id": "a", "content": "files"}
    assert converted[3] == {"role": "user", "content": "late"}
