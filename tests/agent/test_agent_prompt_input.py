"""The agent's prompt through Textual's pilot: a paste keeps its lines, Enter sends, Shift+Enter
and the keys terminals can send instead (Ctrl+J, Alt+Enter) start a new line, and Up/Down walk
through earlier prompts, kept between sessions."""

from __future__ import annotations

import asyncio

from ds4mlx.agent.app import HISTORY_FILE, AgentApp
from ds4mlx.agent.loop import Agent
from ds4mlx.agent.permissions import Permissions
from ds4mlx.agent.prompt_input import PromptHistory, PromptInput

import pytest
from scripted_backend import ScriptedBackend
from test_agent_app import until
from textual import events


def run(app: AgentApp, scenario) -> None:
    async def main():
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.agent is not None and not app.busy)
            await scenario(pilot)

    asyncio.run(main())


def user_messages(backend: ScriptedBackend) -> list[str]:
    return [m["content"] for m in backend.requests[-1] if m["role"] == "user"]


def make_app(toolbox, store) -> tuple[AgentApp, ScriptedBackend]:
    backend = ScriptedBackend()
    agent = Agent(backend, toolbox, Permissions(yolo=True))
    return AgentApp(lambda: agent, store), backend


@pytest.mark.parametrize("separator", ["\n", "\r", "\r\n"])
def test_a_pasted_three_line_text_reaches_the_model_as_one_message(toolbox, store, separator):
    app, backend = make_app(toolbox, store)

    async def scenario(pilot):
        prompt = app.query_one("#prompt", PromptInput)
        # As the terminal driver does: the app forwards the paste to the focused widget.
        app.post_message(events.Paste(separator.join(["line one", "line two", "line three"])))
        await until(pilot, lambda: prompt.text.count("\n") == 2)
        await pilot.press("enter")
        await until(pilot, lambda: backend.requests and not app.busy)
        assert user_messages(backend) == ["line one\nline two\nline three"]
        assert prompt.text == ""

    run(app, scenario)


@pytest.mark.parametrize("key", ["shift+enter", "ctrl+j", "alt+enter"])
def test_newline_keys_start_a_line_and_enter_sends(toolbox, store, key):
    app, backend = make_app(toolbox, store)

    async def scenario(pilot):
        await pilot.press(*"first", key, *"second")
        assert not backend.requests
        await pilot.press("enter")
        await until(pilot, lambda: backend.requests and not app.busy)
        assert user_messages(backend) == ["first\nsecond"]

    run(app, scenario)


def test_up_and_down_walk_through_earlier_prompts_kept_between_sessions(toolbox, store):
    app, backend = make_app(toolbox, store)

    async def first_session(pilot):
        for line in ("one", "two\nlines"):
            await pilot.press(*line.replace("\n", "|"))
            prompt = app.query_one("#prompt", PromptInput)
            prompt.value = line
            await pilot.press("enter")
            await until(pilot, lambda: not app.busy and not app.pending)

    run(app, first_session)
    assert (store.folder / HISTORY_FILE).stat().st_mode & 0o077 == 0

    app, _ = make_app(toolbox, store)

    async def second_session(pilot):
        prompt = app.query_one("#prompt", PromptInput)
        await pilot.press(*"draft")
        await pilot.press("up")
        assert prompt.text == "two\nlines"
        # The cursor is on the last line of the recalled prompt: Up moves inside it first.
        await pilot.press("up", "up")
        assert prompt.text == "one"
        await pilot.press("up")  # the oldest stays
        assert prompt.text == "one"
        await pilot.press("down")
        assert prompt.text == "two\nlines"
        await pilot.press("down")
        assert prompt.text == "draft"

    run(app, second_session)


def test_history_skips_a_repeat_and_an_unreadable_file(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('"a"\nnot json\n42\n')
    history = PromptHistory(path)
    assert history.entries == ["a"]
    history.add("b")
    history.add("b")
    assert PromptHistory(path).entries == ["a", "b"]


def test_empty_entries_are_dropped_and_a_file_not_utf8_starts_afresh(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('""\n"kept"\n')
    assert PromptHistory(path).entries == ["kept"]
    path.write_bytes(b'"a"\n\xff\n')
    assert PromptHistory(path).entries == []


def test_walking_stops_at_both_ends_and_returns_to_the_draft():
    history = PromptHistory()
    for prompt in ("one", "two"):
        history.add(prompt)
    assert history.next() is None  # already at the draft
    assert history.previous("draft") == "two"
    assert history.previous("two") == "one"
    assert history.previous("one") is None  # the oldest
    assert history.next() == "two"
    assert history.next() == "draft"
    assert history.next() is None
    assert history.previous("draft") == "two"
    history.add("")  # an empty prompt is not kept, but the walk starts over
    assert history.entries == ["one", "two"]
    assert (history.position, history.draft) == (2, "")


def test_a_history_without_a_file_or_in_a_read_only_place_still_works(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    history = PromptHistory(blocked / "history.jsonl")  # its folder cannot be made
    history.add("x")
    assert history.entries == ["x"] and not (blocked / "history.jsonl").exists()


def test_a_submitted_prompt_names_its_input_as_the_control():
    """Textual matches ``@on(PromptInput.Submitted, "#id")`` handlers by the message's
    control: it must be the input that sent it."""
    prompt = PromptInput(id="prompt")
    message = PromptInput.Submitted(prompt, "hi")
    assert message.control is prompt and message.value == "hi"


def test_a_damaged_line_does_not_hide_the_prompts_after_it(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('"a"\n{"half a line\n"b"\n')
    assert PromptHistory(path).entries == ["a", "b"]
