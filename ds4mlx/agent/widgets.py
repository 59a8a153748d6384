"""The agent UI's own widgets: a tool call's panel, the permission prompt and the question
asked before quitting with background jobs.

The permission prompt shows everything that would run: the whole command (wrapped, scrollable,
with its line count) or the exact diff a write or edit would make. It cannot be answered by
keys typed before it appeared: it ignores every key until none has been pressed for
``ARM_SECONDS``, so the tail of a sentence typed while the agent worked ("okay thanks") neither
allows nor denies anything.
"""

from __future__ import annotations

from ds4mlx.agent.display import sanitize
from ds4mlx.agent.permissions import Decision, command_prefix
from ds4mlx.agent.tools import ToolResult, describe_call
from ds4mlx.generation import ToolCall

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Button, Collapsible, Input, Static

# Tools whose result is a change worth seeing without a click.
_EXPANDED_TOOLS = {"edit", "write"}
# Quiet time, after the prompt appears and after any key, before the prompt takes answers.
ARM_SECONDS = 0.6
# Lines of the dialog besides the preview: border, padding, title, size line, the preview's
# border and margins, hint, buttons.
_DIALOG_CHROME_LINES = 15


class ToolPanel(Collapsible):
    """One tool call: a title line with its state, and its arguments, result or diff inside."""

    def __init__(self, call: ToolCall, call_id: str):
        self.call = call
        self.call_id = call_id
        self.body = Static(arguments_text(call), classes="tool-body")
        super().__init__(self.body, title=_title("…", call), collapsed=True, classes="tool")

    def show_live(self, output: str) -> None:
        """The end of a running command's output, until its result replaces it."""
        self.body.update(Group(arguments_text(self.call), Text(sanitize(output), style="dim")))
        self.collapsed = False

    def finish(self, result: ToolResult) -> None:
        self.title = _title("✗" if result.is_error else "✓", self.call)
        shown = (
            Syntax(sanitize(result.diff), "diff", theme="ansi_dark")
            if result.diff
            else Text(sanitize(result.output))
        )
        self.body.update(Group(arguments_text(self.call), shown))
        if result.is_error:
            self.add_class("failed")
        if result.diff or self.call.name in _EXPANDED_TOOLS:
            self.collapsed = False


class PermissionScreen(ModalScreen[Decision]):
    """Asks whether a write, edit or bash call may run: once, always (scoped), or not."""

    def __init__(self, call: ToolCall, diff: str = ""):
        super().__init__()
        self.call = call
        self.diff = diff
        self.prefix = (
            command_prefix(str(call.arguments.get("command", ""))) if call.name == "bash" else None
        )
        self.armed = False
        self._arm_timer: Timer | None = None
        self.reason = ""  # what the user typed after n, for the model

    def compose(self) -> ComposeResult:
        with Vertical(id="permission"):
            # A command is shown whole below; other calls are named whole here.
            title = (
                "Allow this bash command?"
                if self.call.name == "bash"
                else f"Allow {sanitize(describe_call(self.call, width=None))}?"
            )
            yield Static(Text(title, style="bold"), id="permission-title")
            preview, size = self._preview()
            yield Static(Text(size, style="italic"), id="permission-size")
            with VerticalScroll(id="permission-preview"):
                yield Static(preview)
            yield Static(
                Text("(keys typed now are ignored until you stop typing)"), id="permission-hint"
            )
            with Horizontal(id="permission-buttons"):
                yield Button("Allow once (y)", id="once", variant="primary", disabled=True)
                always = (
                    "Always this exact command (a)"
                    if self.call.name == "bash"
                    else f"Always {self.call.name} this session (a)"
                )
                yield Button(always, id="always", disabled=True)
                if self.prefix:
                    yield Button(
                        Text(f"Always `{sanitize(self.prefix)} …` (p)"), id="prefix", disabled=True
                    )
                yield Button("Deny (n)", id="deny", variant="error", disabled=True)
            reason = Input(
                placeholder="why not? Enter denies; the reason goes to the model (may be empty)",
                id="deny-reason",
            )
            reason.display = False
            yield reason

    def _preview(self) -> tuple[RenderableType, str]:
        arguments = self.call.arguments
        if self.call.name == "bash":
            command = sanitize(str(arguments.get("command", "")))
            lines = command.count("\n") + 1
            return (
                Syntax(command, "bash", theme="ansi_dark", word_wrap=True, line_numbers=lines > 1),
                f"the complete command: {lines} line{'s' * (lines != 1)}, "
                f"{len(command)} characters",
            )
        if self.call.name in ("write", "edit") and self.diff:
            diff = sanitize(self.diff)
            lines = diff.count("\n") + 1
            return (
                Syntax(diff, "diff", theme="ansi_dark", word_wrap=True),
                f"the exact change: a diff of {lines} line{'s' * (lines != 1)}",
            )
        return arguments_text(self.call), "the call's arguments"

    def on_mount(self) -> None:
        self.query_one("#permission-preview", VerticalScroll).focus()
        self._fit()
        self._arm_timer = self.set_timer(ARM_SECONDS, self._arm)

    def on_resize(self, _: events.Resize) -> None:
        self._fit()

    def _fit(self) -> None:
        """Give the preview what the dialog leaves, so that the buttons stay on screen and
        the preview scrolls instead."""
        width = max(20, int(self.app.size.width * 0.9) - 6)
        title = str(self.query_one("#permission-title", Static).content)
        chrome = _DIALOG_CHROME_LINES + len(title) // width
        preview = self.query_one("#permission-preview", VerticalScroll)
        preview.styles.max_height = max(3, int(self.app.size.height * 0.9) - chrome)

    def _arm(self) -> None:
        self.armed = True
        for button in self.query(Button):
            button.disabled = False
        keys = (
            "y allow once · a always"
            + (" · p prefix" if self.prefix else "")
            + " · n deny (then a reason) · Esc deny · ↑↓ PgUp PgDn scroll"
        )
        self.query_one("#permission-hint", Static).update(Text(keys))

    def on_key(self, event: events.Key) -> None:
        reason = self.query_one("#deny-reason", Input)
        if reason.display:  # typing the reason: Enter sends it, Esc denies without one
            if event.key == "escape":
                event.stop()
                self.dismiss(Decision.DENY)
            return
        if not self.armed:
            # Type-ahead: swallow the key and wait for a quiet moment again.
            event.stop()
            event.prevent_default()
            if self._arm_timer is not None:
                self._arm_timer.reset()
            return
        choice = {"y": "once", "a": "always", "n": "deny", "escape": "deny"}.get(event.key)
        if event.key == "p" and self.prefix:
            choice = "prefix"
        if event.key == "n":
            event.stop()
            event.prevent_default()
            self._ask_reason()
        elif choice is not None:
            event.stop()
            self.dismiss(Decision(choice))

    def _ask_reason(self) -> None:
        """After n: a line for the reason, which the model reads with the denial."""
        reason = self.query_one("#deny-reason", Input)
        reason.display = True
        reason.focus()
        self.query_one("#permission-hint", Static).update(
            Text("Enter denies with this reason (or none) · Esc denies without one")
        )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.reason = event.value.strip()
        self.dismiss(Decision.DENY)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if self.armed:
            self.dismiss(Decision(event.button.id or "deny"))


class QuitScreen(ModalScreen[bool]):
    """Asks before quitting while background jobs run (quitting stops them)."""

    def __init__(self, jobs: list[str]):
        super().__init__()
        self.jobs = jobs

    def compose(self) -> ComposeResult:
        count = len(self.jobs)
        with Vertical(id="permission"):
            yield Static(
                Text(f"{count} background job{'s' * (count != 1)} still running", style="bold")
            )
            yield Static(Text("\n".join(sanitize(job) for job in self.jobs)))
            yield Static(Text("Quit and stop them? y quits · n/Esc stays"), id="permission-hint")
            with Horizontal(id="permission-buttons"):
                yield Button("Quit and stop them (y)", id="quit", variant="error")
                yield Button("Stay (n)", id="stay", variant="primary")

    def on_key(self, event: events.Key) -> None:
        answer = {"y": True, "n": False, "escape": False}.get(event.key)
        if answer is not None:
            event.stop()
            self.dismiss(answer)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "quit")


def _title(mark: str, call: ToolCall) -> str:
    # Collapsible titles are parsed as markup; the model's text must not be.
    return f"{mark} {escape(sanitize(describe_call(call)))}"


def arguments_text(call: ToolCall) -> Text:
    text = Text()
    for key, value in call.arguments.items():
        text.append(f"{sanitize(str(key))}: ", style="bold")
        text.append(f"{sanitize(str(value))}\n")
    return text
