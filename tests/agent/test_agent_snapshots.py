"""Snapshots (pytest-textual-snapshot) of ds4-agent's main screens on a scripted backend: an
answer after a tool call, the permission prompt, and the help listing. Each starts a new
conversation first, so the machine-specific workspace path in the greeting is off screen.

After an intended UI change: ``pytest tests/agent/test_agent_snapshots.py --snapshot-update``,
then review the SVGs in ``tests/agent/__snapshots__/``."""

from __future__ import annotations

from ds4mlx.agent.app import AgentApp, PermissionScreen
from ds4mlx.agent.conversations import ConversationStore
from ds4mlx.agent.loop import Agent
from ds4mlx.agent.permissions import Permissions

from scripted_backend import ScriptedBackend, call, text

SIZE = (100, 32)


def make_app(toolbox, tmp_path, turns, yolo=True) -> AgentApp:
    agent = Agent(ScriptedBackend(turns), toolbox, Permissions(yolo=yolo))
    return AgentApp(lambda: agent, ConversationStore(tmp_path / "conversations"))


async def until(pilot, condition) -> None:
    for _ in range(500):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError("condition not reached")


async def start(pilot) -> None:
    await until(pilot, lambda: pilot.app.agent is not None and not pilot.app.busy)
    pilot.app.query_one("#prompt").cursor_blink = False  # a blinking cursor is a coin toss
    await enter(pilot, "/new")


async def enter(pilot, line: str) -> None:
    pilot.app.query_one("#prompt").value = line
    await pilot.press("enter")
    await until(pilot, lambda: not pilot.app.busy and not pilot.app.pending)
    await settle(pilot)


async def settle(pilot) -> None:
    """Let streamed markdown, highlighting, scrolling and animations finish before a shot."""
    for _ in range(3):
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.1)


def test_answer_after_a_tool_call(snap_compare, toolbox, tmp_path):
    app = make_app(
        toolbox,
        tmp_path,
        [
            [text("Let me look."), call("list", path="src")],
            [text("There are **three** files:\n\n```python\nprint('app.py')\n```")],
        ],
    )

    async def run_before(pilot):
        await start(pilot)
        await enter(pilot, "What is in src?")

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_permission_prompt(snap_compare, toolbox, tmp_path):
    app = make_app(
        toolbox, tmp_path, [[call("write", path="notes.txt", content="hi\n")]], yolo=False
    )

    async def run_before(pilot):
        await start(pilot)
        pilot.app.query_one("#prompt").value = "Write a note."
        await pilot.press("enter")
        await until(
            pilot, lambda: isinstance(pilot.app.screen, PermissionScreen) and pilot.app.screen.armed
        )
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_help(snap_compare, toolbox, tmp_path):
    app = make_app(toolbox, tmp_path, [])

    async def run_before(pilot):
        await start(pilot)
        await enter(pilot, "/help")

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
