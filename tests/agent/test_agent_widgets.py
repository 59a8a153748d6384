"""The agent UI's widgets on their own: a tool call's panel, the permission prompt (its title,
buttons, keys, size line and the room it gives the preview) and the question asked before
quitting with jobs, each shown in a bare host app instead of the whole agent."""

from __future__ import annotations

import asyncio

from ds4mlx.agent import widgets
from ds4mlx.agent.permissions import Decision
from ds4mlx.agent.tools import ToolResult
from ds4mlx.agent.widgets import PermissionScreen, QuitScreen, ToolPanel, arguments_text
from ds4mlx.generation import ToolCall

import pytest
from rich.syntax import Syntax
from rich.text import Text
from test_agent_app import until
from textual.app import App
from textual.containers import VerticalScroll
from textual.widgets import Button, Input, Static


class Host(App[None]):
    """An empty app that shows one modal screen and keeps what it was dismissed with."""

    def __init__(self, modal) -> None:
        super().__init__()
        self.modal = modal
        self.answers: list = []

    def on_mount(self) -> None:
        self.push_screen(self.modal, self.answers.append)


def show(modal, scenario, size=(100, 40)) -> list:
    """Run ``scenario(pilot, modal)`` with ``modal`` on screen; what it was dismissed with."""
    host = Host(modal)

    async def main():
        async with host.run_test(size=size) as pilot:
            await until(pilot, lambda: host.screen is modal)
            await scenario(pilot, modal)

    asyncio.run(main())
    return host.answers


@pytest.fixture(autouse=True)
def quick_arming(monkeypatch):
    monkeypatch.setattr(widgets, "ARM_SECONDS", 0.05)


async def armed(pilot, screen: PermissionScreen) -> None:
    await until(pilot, lambda: screen.armed)


def unarmed_until_told(monkeypatch) -> None:
    """The screens shown from now on stay unarmed until ``arm_now``: a timer of half a second
    armed the dialog before a loaded machine had shown it to the test (a full run under load
    saw the buttons enabled at the first look)."""
    monkeypatch.setattr(widgets, "ARM_SECONDS", 3600.0)


async def arm_now(pilot, screen: PermissionScreen) -> None:
    """What the arming timer does when it fires, now."""
    screen._arm_timer.stop()
    screen._arm()
    await armed(pilot, screen)


def labels(screen) -> dict[str, str]:
    return {button.id: str(button.label) for button in screen.query(Button)}


def content(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).content)


# ---------------------------------------------------------------------- the tool panel


def test_a_finished_write_opens_even_without_a_diff_and_bash_stays_closed():
    write = ToolPanel(ToolCall("write", {"path": "a.txt", "content": "x"}), "c1")
    assert write.title == "… write a.txt" and write.collapsed
    write.finish(ToolResult("wrote a.txt"))
    assert write.title == "✓ write a.txt" and not write.collapsed
    assert not write.has_class("failed")

    bash = ToolPanel(ToolCall("bash", {"command": "ls"}), "c2")
    bash.finish(ToolResult("a.txt\n"))
    assert bash.collapsed
    shown = bash.body.content.renderables
    assert shown[0].plain == "command: ls\n" and isinstance(shown[1], Text)
    assert shown[1].plain == "a.txt\n"


def test_a_failed_call_is_marked_and_a_diff_is_shown_as_a_diff():
    failed = ToolPanel(ToolCall("bash", {"command": "false"}), "c1")
    failed.finish(ToolResult("exit code 1", is_error=True))
    assert failed.title == "✗ bash false" and failed.has_class("failed") and failed.collapsed
    # Titles are markup to Textual: the model's brackets are escaped, not obeyed.
    marked = ToolPanel(ToolCall("bash", {"command": "echo [b]x[/b]"}), "c3")
    assert marked.title == "… bash echo \\[b]x\\[/b]"

    edit = ToolPanel(ToolCall("bash", {"command": "sed -i s/a/b/ f"}), "c2")
    edit.finish(ToolResult("changed", diff="-a\n+b"))
    assert not edit.collapsed  # a change is shown at once, whichever tool made it
    shown = edit.body.content.renderables[1]
    assert isinstance(shown, Syntax) and shown.code == "-a\n+b"


def test_live_output_opens_the_panel_dimmed_below_the_arguments():
    panel = ToolPanel(ToolCall("bash", {"command": "make"}), "c1")
    panel.show_live("building\x1b[2J")
    arguments, output = panel.body.content.renderables
    assert arguments.plain == "command: make\n"
    assert output.plain == "building\\x1b[2J" and output.style == "dim"
    assert not panel.collapsed


def test_arguments_are_one_line_each_key_in_bold():
    text = arguments_text(ToolCall("edit", {"path": "a.py", "old": 1}))
    assert text.plain == "path: a.py\nold: 1\n"
    assert [(span.start, span.end, span.style) for span in text.spans] == [
        (0, 6, "bold"),
        (11, 16, "bold"),
    ]


# ------------------------------------------------------------------- the permission prompt


@pytest.mark.parametrize(
    ("command", "size"),
    [
        ("ls -l", "the complete command: 1 line, 5 characters"),
        ("ls\nrm x", "the complete command: 2 lines, 7 characters"),
        ("a\nb\nc\n", "the complete command: 4 lines, 6 characters"),
    ],
)
def test_the_size_line_counts_a_commands_lines_and_characters(command, size):
    preview, said = PermissionScreen(ToolCall("bash", {"command": command}))._preview()
    assert said == size
    assert isinstance(preview, Syntax) and preview.code == command
    assert preview.line_numbers == ("\n" in command)  # numbers only where there are lines


@pytest.mark.parametrize("tool", ["write", "edit"])
def test_a_write_or_edit_previews_its_diff(tool):
    screen = PermissionScreen(ToolCall(tool, {"path": "a.py"}), "-a\n+b\n c")
    preview, said = screen._preview()
    assert said == "the exact change: a diff of 3 lines"
    assert isinstance(preview, Syntax) and preview.code == "-a\n+b\n c"
    one = PermissionScreen(ToolCall(tool, {"path": "a.py"}), "+b")._preview()[1]
    assert one == "the exact change: a diff of 1 line"


def test_a_call_without_a_diff_previews_its_arguments():
    for call, diff in [
        (ToolCall("edit", {"path": "a.py", "old": "x"}), ""),
        (ToolCall("read", {"path": "a.py"}), "-a\n+b"),
    ]:
        preview, said = PermissionScreen(call, diff)._preview()
        assert said == "the call's arguments"
        assert preview.plain == arguments_text(call).plain


def test_only_a_bash_call_has_a_prefix():
    assert PermissionScreen(ToolCall("bash", {"command": "git diff --stat"})).prefix == "git diff"
    assert PermissionScreen(ToolCall("bash", {"command": "ls"})).prefix is None
    assert PermissionScreen(ToolCall("write", {"command": "git diff --stat"})).prefix is None


def test_a_prefix_is_offered_and_p_answers_with_it(monkeypatch):
    unarmed_until_told(monkeypatch)  # time to see the buttons disabled

    async def scenario(pilot, screen):
        assert content(screen, "#permission-title") == "Allow this bash command?"
        assert labels(screen) == {
            "once": "Allow once (y)",
            "always": "Always this exact command (a)",
            "prefix": "Always `git diff …` (p)",
            "deny": "Deny (n)",
        }
        assert all(button.disabled for button in screen.query(Button))
        await arm_now(pilot, screen)
        assert not any(button.disabled for button in screen.query(Button))
        assert content(screen, "#permission-hint") == (
            "y allow once · a always · p prefix · n deny (then a reason) · Esc deny"
            " · ↑↓ PgUp PgDn scroll"
        )
        await pilot.press("p")

    call = ToolCall("bash", {"command": "git diff --stat src"})
    assert show(PermissionScreen(call), scenario) == [Decision.ALLOW_PREFIX]


def test_without_a_prefix_p_does_nothing():
    async def scenario(pilot, screen):
        assert "prefix" not in labels(screen)
        await armed(pilot, screen)
        assert content(screen, "#permission-hint") == (
            "y allow once · a always · n deny (then a reason) · Esc deny · ↑↓ PgUp PgDn scroll"
        )
        await pilot.press("p", "x")
        await pilot.pause(0.05)
        assert pilot.app.screen is screen
        await pilot.press("a")

    assert show(PermissionScreen(ToolCall("bash", {"command": "ls"})), scenario) == [
        Decision.ALLOW_ALWAYS
    ]


def test_a_file_tool_is_named_in_the_title_and_allowed_for_the_session():
    async def scenario(pilot, screen):
        assert content(screen, "#permission-title") == "Allow edit a.py?"
        assert labels(screen)["always"] == "Always edit this session (a)"
        await armed(pilot, screen)
        await pilot.press("y")

    call = ToolCall("edit", {"path": "a.py", "old": "x", "new": "y"})
    assert show(PermissionScreen(call, "-x\n+y"), scenario) == [Decision.ALLOW_ONCE]


@pytest.mark.parametrize(
    ("keys", "reason"),
    [
        (["escape"], ""),
        (["n", *" too risky ", "enter"], "too risky"),
        (["n", *"never", "escape"], ""),
    ],
)
def test_a_denial_with_and_without_a_reason(keys, reason):
    screens = []

    async def scenario(pilot, screen):
        screens.append(screen)
        await armed(pilot, screen)
        await pilot.press(*keys)

    call = ToolCall("bash", {"command": "rm -rf build"})
    assert show(PermissionScreen(call), scenario) == [Decision.DENY]
    assert screens[0].reason == reason


def test_n_opens_the_reason_line_and_says_how_to_send_it():
    async def scenario(pilot, screen):
        reason = screen.query_one("#deny-reason", Input)
        await armed(pilot, screen)
        assert not reason.display
        await pilot.press("n")
        assert reason.display and reason.has_focus
        assert content(screen, "#permission-hint") == (
            "Enter denies with this reason (or none) · Esc denies without one"
        )
        await pilot.press("y", "a")  # typed into the reason, not answers
        assert pilot.app.screen is screen and reason.value == "ya"
        await pilot.press("enter")

    assert show(PermissionScreen(ToolCall("bash", {"command": "ls"})), scenario) == [Decision.DENY]


def test_buttons_answer_only_once_armed(monkeypatch):
    unarmed_until_told(monkeypatch)

    async def scenario(pilot, screen):
        always = screen.query_one("#always", Button)
        screen.on_button_pressed(Button.Pressed(always))
        await pilot.pause(0.01)
        assert pilot.app.screen is screen and not pilot.app.answers
        await arm_now(pilot, screen)
        await pilot.click("#always")

    assert show(PermissionScreen(ToolCall("bash", {"command": "ls"})), scenario) == [
        Decision.ALLOW_ALWAYS
    ]


@pytest.mark.parametrize(
    ("call", "room"),
    [
        # 40 rows: 36 for the dialog, 15 of them its chrome; a 24-character title is one line.
        (ToolCall("bash", {"command": "ls"}), 21),
        # A title wider than the dialog (90 - 6 columns) takes a second line from the preview.
        (ToolCall("edit", {"path": "d/" * 45 + "a.py"}), 20),
    ],
)
def test_the_preview_gets_the_room_the_dialog_leaves(call, room):
    async def scenario(pilot, screen):
        preview = screen.query_one("#permission-preview", VerticalScroll)
        assert preview.styles.max_height.value == room
        await pilot.press("escape")

    show(PermissionScreen(call), scenario)


def test_a_tiny_terminal_still_leaves_three_preview_lines():
    async def scenario(pilot, screen):
        preview = screen.query_one("#permission-preview", VerticalScroll)
        assert preview.styles.max_height.value == 3

    show(PermissionScreen(ToolCall("bash", {"command": "ls"})), scenario, size=(30, 12))


# ---------------------------------------------------------------------- quitting with jobs


@pytest.mark.parametrize(
    ("jobs", "key", "leave", "heading"),
    [
        (["sleep 9 (running)"], "y", True, "1 background job still running"),
        (["a", "b"], "n", False, "2 background jobs still running"),
        (["a"], "escape", False, "1 background job still running"),
    ],
)
def test_the_quit_question_counts_the_jobs_and_takes_a_key(jobs, key, leave, heading):
    async def scenario(pilot, screen):
        shown = [str(widget.content) for widget in screen.query(Static).results(Static)]
        assert shown[:2] == [heading, "\n".join(jobs)]
        await pilot.press("x")
        assert pilot.app.screen is screen
        await pilot.press(key)

    assert show(QuitScreen(jobs), scenario) == [leave]


@pytest.mark.parametrize(("button", "leave"), [("#quit", True), ("#stay", False)])
def test_the_quit_question_takes_a_click(button, leave):
    async def scenario(pilot, screen):
        await pilot.click(button)

    assert show(QuitScreen(["a"]), scenario) == [leave]
