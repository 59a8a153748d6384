"""ChatService: prompts rendered and streamed, sessions reused across turns, stop strings."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.generation import (
    ChatService,
    DrafterKind,
    Finished,
    PrefillProgress,
    SpeculationConfig,
    TextDelta,
    generate,
    load_drafter,
)
from ds4mlx.generation import service as service_module

import pytest


@pytest.fixture(scope="module")
def service(chat_model_path):
    return ChatService(ds4mlx.load_model(chat_model_path), max_context=512)


def collect(events):
    events = list(events)
    assert isinstance(events[-1], Finished)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, events[-1]


def test_chat_generates_what_plain_decoding_generates(service):
    messages = [{"role": "user", "content": "hello there"}]
    text, done = collect(service.chat(messages, max_tokens=12))
    model = service.model
    prompt = model.tokenizer.encode(model.chat_format.render(messages))
    tokens = [e.token for e in generate(model.new_session(), prompt, 12) if hasattr(e, "token")]
    assert done.prompt_tokens == len(prompt) and done.completion_tokens == 12
    expected = model.tokenizer.decode(
        [t for t in tokens if t not in model.tokenizer.stop_ids], skip_special=True
    )
    assert text == expected
    assert done.finish_reason == "length"


def test_a_growing_conversation_reuses_the_session(service):
    first = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    answer, _ = collect(service.chat(first, max_tokens=8))
    second = [
        *first,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Thanks!"},
    ]
    _, done = collect(service.chat(second, max_tokens=8))
    assert done.cached_tokens > done.prompt_tokens // 2
    # An unrelated prompt starts over.
    _, done = collect(service.chat([{"role": "user", "content": "List the files."}], max_tokens=4))
    assert done.cached_tokens < 5


def test_stop_strings_cut_the_text(service):
    text, _ = collect(service.complete("The quick brown fox", max_tokens=24))
    assert len(text) > 4
    stop = text[2:4]
    cut, done = collect(service.complete("The quick brown fox", max_tokens=24, stop=[stop]))
    assert cut == text[: text.index(stop)]
    assert done.finish_reason == "stop"


def test_overlong_prompt_is_refused(service):
    with pytest.raises(ValueError, match="context"):
        list(service.complete("hello " * 600, max_tokens=4))


def test_every_turn_reuses_the_previous_prompt(service):
    messages = [{"role": "system", "content": "You are ds4-agent."}]
    previous_prompt = 0
    for turn in ["hello there", "second", "third", "fourth"]:
        messages.append({"role": "user", "content": turn})
        answer, done = collect(service.chat(messages, max_tokens=24))
        assert done.cached_tokens >= previous_prompt
        previous_prompt = done.prompt_tokens
        messages.append({"role": "assistant", "content": answer})


def test_a_conversation_sharing_only_the_system_prompt_does_not_take_over_a_slot(chat_model_path):
    """With two sessions, a second conversation that shares just the system prompt with the
    first opens the free slot instead of wiping the first one's cache (ds4's #765/#1069)."""
    service = ChatService(ds4mlx.load_model(chat_model_path), max_context=512, sessions=2)
    system = {"role": "system", "content": "You are a helpful assistant for the ds4 project."}
    conversations = {
        name: [system, {"role": "user", "content": text}]
        for name, text in (("a", "Write a Python function."), ("b", "List three colours."))
    }
    for messages in conversations.values():
        answer, done = collect(service.chat(messages, max_tokens=6))
        messages.append({"role": "assistant", "content": answer})
    for messages in conversations.values():
        messages.append({"role": "user", "content": "Thanks, go on."})
        before = service.model.tokenizer.encode(service.model.chat_format.render(messages[:-1]))
        _, done = collect(service.chat(messages, max_tokens=4))
        # Each continuation finds its own earlier turn cached (up to the rendered answer).
        assert done.cached_tokens >= len(before) - 8, (done.cached_tokens, len(before))


DSPARK = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny-dspark.gguf"


@pytest.mark.skipif(not DSPARK.is_file(), reason="needs assets/ds4-tiny-dspark.gguf")
def test_a_chunked_prefill_drafts_as_a_whole_one_does(monkeypatch):
    """The agent prefills in chunks (``report_prefill``); the drafter must then see the prompt
    as after one prefill: the same text and the same acceptance at every draft position."""
    monkeypatch.setattr(service_module, "PREFILL_CHUNK", 24)  # several chunks, a short prompt
    model = ds4mlx.load_model(DSPARK.with_name("ds4-tiny.gguf"))
    config = SpeculationConfig(kind=DrafterKind.DSPARK, support_path=DSPARK)
    source = (Path(ds4mlx.__file__).parent / "cli" / "plan.py").read_text()
    messages = [{"role": "user", "content": "Continue this file:\n" + source[:500]}]
    runs, progress = [], []
    for chunked in (False, True):
        service = ChatService(model, load_drafter(config, model), config, max_context=2048)
        events = list(service.chat(messages, max_tokens=40, report_prefill=chunked))
        progress += [e for e in events if isinstance(e, PrefillProgress)]
        events = [e for e in events if not isinstance(e, PrefillProgress)]
        text, done = collect(events)
        runs.append((text, done.acceptance.position_accepted, done.acceptance.position_drafted))
    assert len(progress) >= 3  # the second run did prefill in chunks
    assert sum(runs[0][2]) > 0  # and drafted: there is an acceptance to compare
    assert runs[0] == runs[1]
