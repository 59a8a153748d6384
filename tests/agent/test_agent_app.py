"""The Textual app driven through Textual's pilot, on a scripted backend: streaming, tool panels,
permission prompts answered by key, Ctrl+C, queued input and the slash commands."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from ds4mlx.agent.app import AgentApp, PermissionScreen, ToolPanel
from ds4mlx.agent.loop import Agent
from ds4mlx.agent.permissions import Permissions

import pytest
from scripted_backend import ScriptedBackend, call, text
from textual.widgets import Footer, Markdown, Static


def make_app(toolbox, store, turns=(), yolo=True) -> tuple[AgentApp, Agent]:
    agent = Agent(ScriptedBackend(turns), toolbox, Permissions(yolo=yolo))
    return AgentApp(lambda: agent, store), agent


async def until(pilot, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError("condition not reached")


async def submit(pilot, line: str) -> None:
    pilot.app.query_one("#prompt").value = line
    await pilot.press("enter")


async def ready(pilot) -> None:
    await until(pilot, lambda: pilot.app.agent is not None and not pilot.app.busy)


def answers(app: AgentApp) -> list[str]:
    return [widget.source for widget in app.query("Markdown.assistant").results(Markdown)]


def texts(app: AgentApp, selector: str) -> list[str]:
    return [str(widget.content) for widget in app.query(selector).results(Static)]


def play(app: AgentApp, scenario) -> None:
    async def main():
        async with app.run_test(size=(100, 40)) as pilot:
            await ready(pilot)
            await scenario(pilot)

    asyncio.run(main())


def test_a_prompt_streams_an_answer(toolbox, store):
    app, _ = make_app(toolbox, store, [[text("Hello, "), text("**world**.")]])

    async def scenario(pilot):
        await pilot.press(*"hi there", "enter")
        await until(pilot, lambda: answers(app) == ["Hello, **world**."] and not app.busy)
        assert texts(app, ".user") == ["hi there"]
        status = str(app.query_one("#status").content)
        assert "scripted" in status and "ready" in status and "ctx " in status

    play(app, scenario)


def test_a_tool_call_shows_a_panel_with_its_result(toolbox, store):
    app, _ = make_app(toolbox, store, [[call("list", path="src")], [text("Three files.")]])

    async def scenario(pilot):
        await submit(pilot, "what is in src?")
        await until(pilot, lambda: answers(app) == ["Three files."] and not app.busy)
        panel = app.query_one(ToolPanel)
        assert panel.title == "✓ list src" and panel.collapsed
        assert "app.py" in str(panel.body.content.renderables[1])

    play(app, scenario)


@pytest.mark.parametrize(
    ("keys", "allowed"), [(["y"], True), (["n", "enter"], False), (None, False)]
)
def test_permission_prompt_answered_by_key_or_closed(toolbox, store, workspace, keys, allowed):
    turns = [[call("edit", path="README.md", old="A demo", new="The demo")], [text("Done.")]]
    app, _ = make_app(toolbox, store, turns, yolo=False)

    async def scenario(pilot):
        await submit(pilot, "edit the readme")
        await until(pilot, lambda: isinstance(app.screen, PermissionScreen) and app.screen.armed)
        if keys is None:  # closed some other way than by a key: no answer is a denial
            app.screen.dismiss()
        else:
            await pilot.press(*keys)
        await until(pilot, lambda: answers(app) == ["Done."] and not app.busy)
        panel = app.query_one(ToolPanel)
        readme = (workspace / "README.md").read_text()
        if allowed:
            assert "The demo" in readme and panel.title.startswith("✓ edit")
            assert not panel.collapsed  # the diff is shown at once
        else:
            assert "A demo" in readme and panel.has_class("failed")

    play(app, scenario)


def test_ctrl_c_stops_the_generation_without_quitting(toolbox, store):
    app, agent = make_app(toolbox, store)
    agent.backend.turns.append([text("partial"), lambda: agent.cancel.wait(10), text(" never")])
    agent.backend.turns.append([text("Still here.")])

    async def scenario(pilot):
        await submit(pilot, "a long task")
        await until(pilot, lambda: answers(app) == ["partial"])
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.busy)
        assert "stopped" in texts(app, ".note")
        assert answers(app) == ["partial"]
        await pilot.press("ctrl+c")  # idle: Ctrl+C does not quit either
        assert app.is_running
        await submit(pilot, "again")
        await until(pilot, lambda: answers(app)[-1:] == ["Still here."])

    play(app, scenario)


def test_input_typed_while_busy_runs_next(toolbox, store):
    release = threading.Event()
    app, _ = make_app(toolbox, store, [[text("first answer"), release], [text("second answer")]])

    async def scenario(pilot):
        await submit(pilot, "first")
        await until(pilot, lambda: answers(app) == ["first answer"])
        await submit(pilot, "second")
        assert "queued: second" in texts(app, ".note")
        assert "1 queued" in str(app.query_one("#status").content)
        release.set()
        await until(
            pilot, lambda: answers(app) == ["first answer", "second answer"] and not app.busy
        )
        assert texts(app, ".user") == ["first", "second"]

    play(app, scenario)


def test_slash_commands(toolbox, store):
    app, agent = make_app(toolbox, store, [[text("an answer")], [text("summary")]])

    async def scenario(pilot):
        await submit(pilot, "a question")
        await until(pilot, lambda: answers(app) == ["an answer"] and not app.busy)
        for line, expected in [
            ("/save first", "saved as first"),
            ("/list", "* first"),
            ("/history", "assistant: an answer"),
            ("/think on", "thinking on"),
            ("/strip", "dropped 0"),
            ("/help", "/switch name"),
            ("/bogus", "unknown command"),
        ]:
            await submit(pilot, line)
            await until(
                pilot,
                lambda expected=expected: any(expected in note for note in texts(app, ".note")),
            )
        assert "think on" in str(app.query_one("#status").content)
        await submit(pilot, "/hints off")
        await until(pilot, lambda: not app.query_one(Footer).display)
        await submit(pilot, "/compact")
        await until(
            pilot,
            lambda: (
                any(
                    "not compacted" in n or "compacted the context" in n
                    for n in texts(app, ".note")
                )
                and not app.busy
            ),
        )
        await submit(pilot, "/new")
        await until(pilot, lambda: not answers(app))
        assert agent.conversation.is_empty
        await submit(pilot, "/switch first")
        await until(pilot, lambda: answers(app) == ["an answer"])
        assert texts(app, ".user") == ["a question"]
        await submit(pilot, "/del first")
        await until(pilot, lambda: "deleted first" in texts(app, ".note"))
        await submit(pilot, "/quit")
        await until(pilot, lambda: not app.is_running)

    play(app, scenario)
    assert [entry.name for entry in store.list()] != []  # /quit saved the conversation


def test_a_model_that_cannot_load_leaves_a_message(store):
    def fail() -> Agent:
        raise OSError("no such model file")

    app = AgentApp(fail, store)

    async def main():
        async with app.run_test() as pilot:
            await until(pilot, lambda: "no model" in str(app.query_one("#status").content))
            assert any("no such model file" in t for t in texts(app, ".error"))

    asyncio.run(main())


def test_ctrl_c_during_a_permission_prompt_denies_and_stops(toolbox, store, workspace):
    app, _ = make_app(toolbox, store, [[call("write", path="new.txt", content="x")]], yolo=False)

    async def scenario(pilot):
        await submit(pilot, "write a file")
        await until(pilot, lambda: isinstance(app.screen, PermissionScreen))
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.busy and not isinstance(app.screen, PermissionScreen))
        assert "stopped" in texts(app, ".note")
        assert not (workspace / "new.txt").exists()

    play(app, scenario)


def test_markup_in_model_text_is_shown_as_text(toolbox, store):
    turns = [[text("[bold]not markup[/]"), call("read", path="[/oops] [red")], [text("[/x]")]]
    app, _ = make_app(toolbox, store, turns)

    async def scenario(pilot):
        await submit(pilot, "[/user]")
        await until(pilot, lambda: answers(app)[-1:] == ["[/x]"] and not app.busy)
        assert texts(app, ".user") == ["[/user]"]
        assert not texts(app, ".error")
        assert "does not exist" in str(app.query_one(ToolPanel).body.content.renderables[1])

    play(app, scenario)


class StreamingScriptedBackend(ScriptedBackend):
    """A scripted backend that reports an expert-cache hit rate, as a streamed model does."""

    def expert_hit_rate(self) -> float:
        return 0.75


def test_status_bar_shows_the_expert_cache_hit_rate_when_streaming(toolbox, store):
    agent = Agent(StreamingScriptedBackend([[text("ok")]]), toolbox, Permissions(yolo=True))
    app = AgentApp(lambda: agent, store)

    async def scenario(pilot):
        await submit(pilot, "hi")
        await until(pilot, lambda: answers(app) == ["ok"] and not app.busy)
        assert "experts 75% hit" in str(app.query_one("#status").content)

    play(app, scenario)


def test_status_bar_shows_no_rate_that_was_not_measured(toolbox, store):
    # The scripted turn reports no decode time, as a remote answer sent in one chunk.
    app, _ = make_app(toolbox, store, [[text("ok")]])

    async def scenario(pilot):
        await submit(pilot, "hi")
        await until(pilot, lambda: answers(app) == ["ok"] and not app.busy)
        status = str(app.query_one("#status").content)
        assert "│ 5 tok │" in status and "t/s" not in status

    play(app, scenario)


def test_a_full_context_suggests_compact_in_the_ui(toolbox, store):
    agent = Agent(ScriptedBackend([], context_size=600), toolbox, Permissions(yolo=True))
    app = AgentApp(lambda: agent, store)

    async def scenario(pilot):
        await submit(pilot, "hi")
        await until(pilot, lambda: bool(texts(app, ".error")) and not app.busy)
        assert any("context not compacted" in note for note in texts(app, ".note"))
        assert "/compact or /new frees room" in texts(app, ".error")[-1]
        assert not agent.backend.requests

    play(app, scenario)


def test_a_deleted_conversation_stays_deleted_until_a_later_command(toolbox, store):
    app, agent = make_app(toolbox, store, [[text("an answer")]])

    async def scenario(pilot):
        await submit(pilot, "a question")
        await until(pilot, lambda: answers(app) == ["an answer"] and not app.busy)
        saved = agent.conversation.name
        assert [entry.name for entry in store.list()] == [saved]  # the turn autosaved
        await submit(pilot, f"/del {saved}")
        await until(pilot, lambda: f"deleted {saved}" in texts(app, ".note"))
        assert store.list() == []
        await submit(pilot, "/history")  # any other command saves the conversation again
        await until(pilot, lambda: "assistant: an answer" in "".join(texts(app, ".note")))
        assert len(store.list()) == 1 and agent.conversation.name is not None

    play(app, scenario)
