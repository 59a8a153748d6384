"""``/v1/completions`` translated field by field (no model, no server): what a request may ask
for, the completion object with its legacy ``logprobs``, and the chunks of its stream."""

from __future__ import annotations

import json

from ds4mlx.generation import Finished, TextDelta, TokenLogprobs
from ds4mlx.server.choices import ChoiceEvent
from ds4mlx.server.errors import APIError
from ds4mlx.server.generation import GenerationDefaults, parse_request
from ds4mlx.server.openai_completions import CompletionsEndpoint
from ds4mlx.server.sse import DONE_FRAME
from ds4mlx.server.turn import ResponseMeta

import pytest

DEFAULTS = GenerationDefaults(max_tokens=100)
META = ResponseMeta("served-model", created=7)
ENDPOINT = CompletionsEndpoint()


def request_for(**body):
    return parse_request(
        ENDPOINT.request_model, json.dumps({"model": "asked-model", "prompt": "p", **body}).encode()
    )


def call_for(**body):
    return ENDPOINT.call(request_for(**body), DEFAULTS)


def finished(reason: str = "stop") -> Finished:
    return Finished(reason, prompt_tokens=3, completion_tokens=2, cached_tokens=1, stats=None)


def token(text: str, logprob: float, *top: tuple[str, float]) -> TokenLogprobs:
    return TokenLogprobs(text, text.encode(), logprob, tuple((t, t.encode(), lp) for t, lp in top))


TOKENS = [token("He", -0.5, ("He", -0.5), ("A", -2.0)), token("llo", -0.25, ("llo", -0.25))]
EVENTS = [TOKENS[0], TextDelta("He"), TOKENS[1], TextDelta("llo")]


@pytest.mark.parametrize(
    "option, value, param",
    [("best_of", 2, "best_of"), ("suffix", "end", "suffix"), ("echo", True, "echo")],
)
def test_what_a_completion_cannot_do_is_refused_by_name(option, value, param):
    with pytest.raises(APIError) as refused:
        call_for(**{option: value})
    assert (refused.value.status, refused.value.param) == (400, param)
    assert refused.value.code == "unsupported_parameter"


@pytest.mark.parametrize("option, value", [("best_of", 1), ("suffix", ""), ("echo", False)])
def test_the_harmless_values_of_those_options_are_accepted(option, value):
    assert call_for(**{option: value}).prompt == "p"


@pytest.mark.parametrize("top", [0, 3])
def test_logprobs_reach_the_sampler_even_at_zero(top):
    assert call_for(logprobs=top).sampling.logprobs == top
    assert call_for().sampling.logprobs is None


def test_a_bad_response_format_is_named():
    with pytest.raises(APIError) as refused:
        call_for(response_format={"type": "xml"})
    assert refused.value.param == "response_format.type"


def test_the_completion_names_the_served_model_and_its_logprobs():
    body = ENDPOINT.response(request_for(logprobs=1), EVENTS, finished("length"), META)
    assert body["id"].startswith("cmpl-")
    assert {k: v for k, v in body.items() if k != "id"} == {
        "object": "text_completion",
        "created": 7,
        "model": "served-model",
        "choices": [
            {
                "index": 0,
                "text": "Hello",
                "logprobs": {
                    "tokens": ["He", "llo"],
                    "token_logprobs": [-0.5, -0.25],
                    "top_logprobs": [{"He": -0.5, "A": -2.0}, {"llo": -0.25}],
                    "text_offset": [0, 2],
                },
                "finish_reason": "length",
            }
        ],
        "usage": body["usage"],
    }
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (3, 2, 5)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 1}


def test_logprobs_zero_still_lists_the_tokens_and_none_asked_lists_nothing():
    body = ENDPOINT.response(request_for(logprobs=0), EVENTS, finished(), META)
    assert body["choices"][0]["logprobs"]["tokens"] == ["He", "llo"]
    body = ENDPOINT.response(request_for(), EVENTS, finished(), META)
    assert body["choices"][0]["logprobs"] is None


def test_each_choice_has_its_own_text_and_finish_reason():
    events = [
        ChoiceEvent(0, TextDelta("a")),
        ChoiceEvent(0, finished("length")),
        ChoiceEvent(1, TextDelta("b")),
        ChoiceEvent(1, finished("stop")),
    ]
    body = ENDPOINT.response(request_for(n=2), events, finished("length"), META)
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "a", "length"),
        (1, "b", "stop"),
    ]


def chunks(stream, events, end: Finished) -> list:
    frames = stream.start()
    for event in events:
        frames += stream.event(event)
    frames += stream.finish(end)
    assert frames[-1] == DONE_FRAME
    return [json.loads(frame.decode().removeprefix("data: ")) for frame in frames[:-1]]


def test_streamed_offsets_run_on_across_chunks():
    stream = ENDPOINT.stream(request_for(logprobs=0, stream=True), META)
    sent = chunks(stream, [*EVENTS, token("!", -1.0)], finished())
    assert [c["choices"][0]["text"] for c in sent] == ["He", "llo", "", ""]
    assert [c["choices"][0]["logprobs"]["text_offset"] for c in sent[:3]] == [[0], [2], [5]]
    assert sent[2]["choices"][0]["logprobs"]["tokens"] == ["!"]
    assert [c["choices"][0]["finish_reason"] for c in sent] == [None, None, None, "stop"]
    assert sent[3]["choices"][0]["logprobs"] is None
    assert {c["id"] for c in sent} == {stream.id} and stream.id.startswith("cmpl-")
    assert {(c["object"], c["model"], c["created"]) for c in sent} == {
        ("text_completion", "served-model", 7)
    }


def test_the_stream_sends_usage_only_when_asked():
    for options in ({}, {"stream_options": {"include_usage": False}}):
        stream = ENDPOINT.stream(request_for(stream=True, **options), META)
        plain = chunks(stream, [TextDelta("a")], finished("context"))
        assert plain[-1]["choices"][0]["finish_reason"] == "length"
        assert all("usage" not in c for c in plain)
    asked = ENDPOINT.stream(request_for(stream=True, stream_options={"include_usage": True}), META)
    last = chunks(asked, [TextDelta("a")], finished())[-1]
    assert (last["choices"], last["usage"]["total_tokens"]) == ([], 5)


def test_a_text_response_format_asks_for_no_json():
    assert call_for(response_format={"type": "text"}).output_format is None
    assert call_for(response_format={"type": "json_object"}).output_format is not None


@pytest.mark.parametrize(
    "options, problem",
    [
        ({"repeat_last_n": 0}, "repeat_last_n must be >= 1, got 0"),
        ({"logit_bias": {"1": 1.0, "01": 2.0}}, "logit_bias needs distinct token ids >= 0"),
    ],
)
def test_options_the_sampler_refuses_are_a_400_naming_them(options, problem):
    with pytest.raises(APIError) as refused:
        call_for(**options)
    assert refused.value.status == 400
    assert refused.value.message.startswith(f"invalid sampling options: {problem}")


def test_the_token_limit_and_stop_strings_reach_the_call():
    call = call_for(max_tokens=5, stop=["\n", "END"])
    assert (call.max_tokens, call.stop) == (5, ("\n", "END"))
    assert call_for().max_tokens == DEFAULTS.max_tokens


def test_logprob_tokens_are_their_text_not_their_bytes():
    # The first two bytes of "€" add no text yet (the detokenizer waits for the third).
    half = TokenLogprobs("", b"\xe2\x82", -1.5)
    body = ENDPOINT.response(request_for(logprobs=0), [half], finished(), META)
    assert body["choices"][0]["logprobs"]["tokens"] == [""]


def test_the_usage_of_several_choices_is_the_requests_total():
    events = [ChoiceEvent(0, finished()), ChoiceEvent(1, finished())]
    total = Finished("stop", prompt_tokens=3, completion_tokens=4, cached_tokens=1, stats=None)
    usage = ENDPOINT.response(request_for(n=2), events, total, META)["usage"]
    assert (usage["completion_tokens"], usage["total_tokens"]) == (4, 7)


def test_streamed_choices_carry_their_index():
    stream = ENDPOINT.stream(request_for(n=2, stream=True), META)
    events = [
        ChoiceEvent(0, TextDelta("a")),
        ChoiceEvent(0, finished()),
        ChoiceEvent(1, TextDelta("b")),
        ChoiceEvent(1, finished("length")),
    ]
    sent = chunks(stream, events, finished())
    assert [(c["choices"][0]["index"], c["choices"][0]["text"]) for c in sent] == [
        (0, "a"),
        (0, ""),
        (1, "b"),
        (1, ""),
    ]
