"""What responses say at their edges: an answer with neither text nor calls, the end of the
context (a token limit to every API), stored responses past the store's capacity, and tool-call
markup the model got wrong on its way through the server.

Each test was checked against a one-spot mutation of the code it guards (``scripts/
mutation_sets/fresh3.py``).
"""

from __future__ import annotations

from ds4mlx.engine.chat import TextDelta, ToolCallError
from ds4mlx.engine.chat import events as chat
from ds4mlx.generation import Finished
from ds4mlx.server.anthropic_messages import MessagesEndpoint, MessagesRequest
from ds4mlx.server.openai_chat import ChatCompletionRequest, ChatCompletionsEndpoint
from ds4mlx.server.openai_responses import ResponsesEndpoint, ResponsesRequest, ResponseStore
from ds4mlx.server.turn import ResponseMeta, track

import httpx
import pytest

from server.harness import MODEL_ID, TIMEOUT, ScriptedService, serve

META = ResponseMeta(MODEL_ID)
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


def finished(reason: str) -> Finished:
    return Finished(reason, prompt_tokens=4, completion_tokens=2, cached_tokens=0)


def test_an_answer_without_text_or_calls_has_empty_content():
    request = ChatCompletionRequest(model=MODEL_ID, messages=QUESTION)
    body = ChatCompletionsEndpoint().response(request, [], finished("stop"), META)
    assert body["choices"][0]["message"]["content"] == ""


def test_the_end_of_the_context_is_a_token_limit_on_every_api():
    events = [TextDelta("It is")]
    chat = ChatCompletionsEndpoint().response(
        ChatCompletionRequest(model=MODEL_ID, messages=QUESTION), events, finished("context"), META
    )
    assert chat["choices"][0]["finish_reason"] == "length"
    messages = MessagesEndpoint().response(
        MessagesRequest(model=MODEL_ID, max_tokens=8, messages=QUESTION),
        events,
        finished("context"),
        META,
    )
    assert messages["stop_reason"] == "max_tokens"
    responses = ResponsesEndpoint().response(
        ResponsesRequest(model=MODEL_ID, input="Weather?"), events, finished("context"), META
    )
    assert responses["status"] == "incomplete"
    assert responses["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_response_store_forgets_the_oldest_first():
    store = ResponseStore(capacity=2)
    for name in ("first", "second", "third"):
        store.put({"id": name}, [{"role": "user", "content": name}])
    assert store.response("first") is None
    assert store.response("second") == {"id": "second"}
    assert store.conversation("third") == [{"role": "user", "content": "third"}]


@pytest.mark.parametrize(("unterminated", "content"), [(False, "Hm <invoke oops>"), (True, "Hm ")])
def test_only_a_call_the_output_ended_inside_is_dropped(engine, unterminated, content):
    # Markup the model finished but got wrong is its text; a call cut off by the token limit
    # is no text at all.
    script = [
        TextDelta("Hm "),
        ToolCallError("<invoke oops>", "bad", unterminated),
        finished("stop"),
    ]
    with serve(ScriptedService(script), engine) as url:
        response = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": MODEL_ID, "messages": QUESTION},
            timeout=TIMEOUT,
        )
    assert response.json()["choices"][0]["message"]["content"] == content


def test_a_whole_call_after_a_streamed_one_of_the_same_name_is_a_call_of_its_own():
    """A completed streamed call is closed: the next call of that name, arriving whole, is a
    second call with its own id (fresh6's turn_completed_call_takes_the_next_call_of_its_name)."""
    first, second = chat.ToolCall("get", {"a": 1}), chat.ToolCall("get", {"a": 2})
    events = [
        chat.ToolCallStart("get"),
        chat.ToolCallArguments('{"a": 1}'),
        chat.ToolCallComplete(first),
        chat.ToolCallComplete(second),
    ]
    calls = track(events, "call_").tool_calls
    assert [block.call for block in calls] == [first, second]
    assert calls[0].call_id != calls[1].call_id


def test_a_chat_turn_of_tool_calls_finishes_as_tool_calls_without_logprobs_unasked():
    request = ChatCompletionRequest(model=MODEL_ID, messages=QUESTION)
    events = [chat.ToolCallComplete(chat.ToolCall("get_weather", {"city": "Paris"}))]
    choice = ChatCompletionsEndpoint().response(request, events, finished("tool_calls"), META)
    assert choice["choices"][0]["finish_reason"] == "tool_calls"
    assert choice["choices"][0]["logprobs"] is None
