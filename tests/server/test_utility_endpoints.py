"""The endpoints scripts written for llama-server and Anthropic use: token counting, tokenize /
detokenize, props, slots, Prometheus metrics, the paths without /v1; and the Responses API's
stored conversations and Anthropic's message_start usage."""

from __future__ import annotations

from ds4mlx.engine.chat.deepseek4 import EOS

import anthropic
import httpx
import openai
import pytest

from server.harness import MODEL_ID, TIMEOUT

QUESTION = [{"role": "user", "content": "Say something about the sea."}]


@pytest.fixture(scope="module")
def claude(base_url):
    return anthropic.Anthropic(base_url=base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(
        base_url=f"{base_url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )


def test_count_tokens_matches_the_prompt_a_message_uses(claude, prompt_tokens):
    counted = claude.messages.count_tokens(model=MODEL_ID, messages=QUESTION, system="Be brief.")
    expected = prompt_tokens([{"role": "system", "content": "Be brief."}, *QUESTION])
    assert counted.input_tokens == expected
    message = claude.messages.create(
        model=MODEL_ID, max_tokens=2, messages=QUESTION, system="Be brief."
    )
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == expected


def test_count_tokens_refuses_bad_requests(claude):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model=MODEL_ID, messages=[])


def test_message_start_reports_the_prompt_tokens(claude, prompt_tokens):
    with claude.messages.stream(model=MODEL_ID, max_tokens=3, messages=QUESTION) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(event for event in events if event.type == "message_start")
    assert start.message.usage.input_tokens == prompt_tokens(QUESTION) > 0
    assert final.usage.output_tokens == 3


def test_tokenize_and_detokenize_round_trip(base_url, chat_model):
    text = f"Hello world{EOS}"
    plain = httpx.post(
        f"{base_url}/tokenize", timeout=TIMEOUT, json={"content": text, "parse_special": False}
    ).json()["tokens"]
    special = httpx.post(f"{base_url}/tokenize", timeout=TIMEOUT, json={"content": text}).json()[
        "tokens"
    ]
    assert plain == chat_model.tokenizer.encode(text, parse_special=False)
    assert special[-1] == chat_model.tokenizer.token_to_id(EOS) and len(plain) > len(special)
    pieces = httpx.post(
        f"{base_url}/tokenize", timeout=TIMEOUT, json={"content": "Hello", "with_pieces": True}
    ).json()["tokens"]
    assert "".join(piece["piece"] for piece in pieces) == "Hello"
    # llama-server's shape: each token's id under "id", beside its piece.
    assert [piece["id"] for piece in pieces] == chat_model.tokenizer.encode(
        "Hello", parse_special=False
    )
    back = httpx.post(f"{base_url}/detokenize", timeout=TIMEOUT, json={"tokens": plain})
    assert back.json() == {"content": text}
    bad = httpx.post(f"{base_url}/detokenize", timeout=TIMEOUT, json={"tokens": [1, -5]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[1]"


def test_tokenize_pieces_give_partial_utf8_as_bytes(base_url):
    """A piece that is part of a character (the byte tokens of an emoji) comes back as its
    bytes, as llama-server sends it, so the pieces join to the text's exact UTF-8."""
    text = "🌊 sea"
    pieces = httpx.post(
        f"{base_url}/tokenize", timeout=TIMEOUT, json={"content": text, "with_pieces": True}
    ).json()["tokens"]
    partial = [token["piece"] for token in pieces if isinstance(token["piece"], list)]
    assert partial, "the emoji's byte tokens should come back as lists of bytes"
    joined = b"".join(
        bytes(piece) if isinstance(piece, list) else piece.encode("utf-8")
        for piece in (token["piece"] for token in pieces)
    )
    assert joined == text.encode("utf-8")


def test_props_and_slots(base_url, service):
    props = httpx.get(f"{base_url}/props", timeout=TIMEOUT).json()
    assert props["default_generation_settings"]["n_ctx"] == service.max_context
    assert props["default_generation_settings"]["params"]["n_predict"] == 16
    assert props["total_slots"] == 1 and props["chat_template"] == "deepseek-v4"
    slots = httpx.get(f"{base_url}/slots", timeout=TIMEOUT).json()
    assert [slot["id"] for slot in slots] == [0]
    assert slots[0]["n_ctx"] == service.max_context


def test_metrics_count_the_requests(base_url, client):
    def metric(name: str) -> float:
        page = httpx.get(f"{base_url}/metrics", timeout=TIMEOUT)
        assert page.headers["content-type"].startswith("text/plain")
        values = [
            line.split()[-1] for line in page.text.splitlines() if line.startswith(name + " ")
        ]
        return float(values[0])

    before = metric("llamacpp:tokens_predicted_total")
    answered = metric("ds4mlx:time_to_first_token_seconds_count")
    reply = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=4)
    assert metric("llamacpp:tokens_predicted_total") == before + 4
    assert metric("ds4mlx:time_to_first_token_seconds_count") == answered + 1
    assert metric("llamacpp:prompt_tokens_total") >= reply.usage.prompt_tokens


def test_paths_without_v1(base_url):
    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)
    reply = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=2)
    assert reply.usage.completion_tokens == 2
    completion = client.completions.create(model=MODEL_ID, prompt="The sea", max_tokens=2)
    assert completion.usage.completion_tokens == 2


def test_responses_continue_a_stored_conversation(client, prompt_tokens):
    first = client.responses.create(model=MODEL_ID, input="Name a fish.", max_output_tokens=3)
    assert first.store is True
    assert client.responses.retrieve(first.id).output_text == first.output_text
    second = client.responses.create(
        model=MODEL_ID, input="And a bird?", max_output_tokens=3, previous_response_id=first.id
    )
    conversation = [
        {"role": "user", "content": "Name a fish."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And a bird?"},
    ]
    assert second.usage.input_tokens == prompt_tokens(conversation)
    assert second.previous_response_id == first.id

    unstored = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL_ID, input="x", previous_response_id=unstored.id)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_streamed_responses_are_stored_too(client):
    with client.responses.stream(
        model=MODEL_ID, input="Name a fish.", max_output_tokens=3
    ) as stream:
        final = stream.get_final_response()
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_count_tokens_checks_the_model(claude):
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="claude-opus-9", messages=QUESTION)
