"""The Textual UI of ds4-agent: chat log, tool panels, permission prompts, input and status bar.

The agent loop runs in a worker thread and every event it produces is shown through
``call_from_thread``, so the UI stays responsive: the user can type while the model runs (the
input is queued and runs next), and Ctrl+C stops the current generation or tool without
quitting. The model is loaded in the background too, so the window appears at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from ds4mlx.agent.commands import SlashCommands
from ds4mlx.agent.conversations import ConversationStore
from ds4mlx.agent.display import sanitize
from ds4mlx.agent.event_notes import event_notes
from ds4mlx.agent.loop import (
    Agent,
    AgentEvent,
    CompactionFinished,
    CompactionStarted,
    MalformedToolCall,
    PermissionRequest,
    RunFinished,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from ds4mlx.agent.mentions import complete_mention
from ds4mlx.agent.permissions import Decision
from ds4mlx.agent.prompt_input import PromptHistory, PromptInput
from ds4mlx.agent.tools import ToolResult
from ds4mlx.agent.widgets import PermissionScreen, QuitScreen, ToolPanel
from ds4mlx.generation import PrefillProgress, ReasoningDelta, TextDelta, ToolCall

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.timer import Timer
from textual.widgets import Collapsible, Footer, Markdown, Static
from textual.widgets.markdown import MarkdownStream

# How often a running command's panel shows its output, and how much of its end.
_LIVE_SECONDS = 0.5
_LIVE_BYTES = 2048
_LIVE_LINES = 12
# Earlier prompts (Up/Down in the prompt), beside the saved conversations.
HISTORY_FILE = "prompt-history.jsonl"
# After SIGTERM or SIGHUP, how long the app may take to leave before the process is ended.
LEAVE_GRACE_SECONDS = 5.0


@dataclass
class _Stats:
    context_tokens: int = 0
    generated: int = 0
    tokens_per_second: float = 0.0
    tau: float | None = None


class AgentApp(App[None]):
    TITLE = "ds4-agent"
    CSS = """
    #log { height: 1fr; padding: 0 1; }
    .user { margin: 1 0 0 0; padding: 0 1; border-left: thick $accent; background: $boost; }
    .note { color: $text-muted; margin: 1 0 0 0; }
    .error { color: $error; margin: 1 0 0 0; }
    Markdown.assistant { margin: 1 0 0 0; padding: 0; }
    .reasoning { color: $text-muted; }
    Collapsible.tool { margin: 0; padding: 0; border: none; background: $surface; }
    Collapsible.failed CollapsibleTitle { color: $error; }
    .tool-body { padding: 0 1; }
    #prompt { margin: 0 0; }
    #status { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    PermissionScreen { align: center middle; }
    #permission { width: 90%; height: auto; max-height: 90%; padding: 1 2;
                  border: round $warning; background: $surface; }
    #permission-size { color: $text-muted; }
    #permission-preview { margin: 1 0; height: auto; min-height: 3; border: tall $panel; }
    #permission-hint { color: $text-muted; }
    #permission-buttons { height: auto; }
    #permission-buttons Button { width: auto; margin: 0 1 0 0; }
    """
    BINDINGS = [
        Binding("ctrl+c", "interrupt", "stop", priority=True),
        Binding("ctrl+q", "quit_agent", "quit", priority=True),
    ]

    def __init__(
        self, load_agent: Callable[[], Agent], store: ConversationStore, model_name: str = ""
    ):
        super().__init__()
        self.load_agent = load_agent
        self.store = store
        self.model_name = model_name
        self.agent: Agent | None = None
        self.commands: SlashCommands | None = None
        self.pending: deque[str] = deque()
        self.busy = False
        self.phase = "loading the model…"
        self.stats = _Stats()
        self._answer_stream: MarkdownStream | None = None
        self._reasoning: Static | None = None
        self._reasoning_text = ""
        self._panels: dict[str, ToolPanel] = {}
        self._permission: PermissionScreen | None = None
        self._live: Timer | None = None
        self._leave_watchdog: threading.Timer | None = None
        self._watch_leaving = False

    def run(self, *args: Any, **kwargs: Any) -> None:
        # Only an app run on its own leaves the process when it leaves: one under Textual's
        # pilot (run_test) shares its process with the tests, which a watchdog must not end.
        self._watch_leaving = True
        try:
            return super().run(*args, **kwargs)
        finally:
            if self._leave_watchdog is not None:
                self._leave_watchdog.cancel()  # the app left: the caller's clean-up may take long

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="log")
        yield PromptInput(
            PromptHistory(self.store.folder / HISTORY_FILE),
            complete=self._complete_mention,
            placeholder="Ask ds4-agent… (Enter sends, Shift+Enter or Ctrl+J: new line; "
            "/help lists the commands)",
            id="prompt",
        )
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#log", VerticalScroll).anchor()
        self.query_one("#prompt", PromptInput).focus()
        self._update_status()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            # Not on every platform, and only in the main thread.
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.terminate, sig)
        self._load()

    def _complete_mention(self, before_cursor: str) -> str | None:
        """Tab in the prompt: the rest of an ``@path`` (once the workspace is known)."""
        if self.agent is None:
            return None
        return complete_mention(before_cursor, self.agent.toolbox.workspace)

    def terminate(self, sig: int) -> None:
        """SIGTERM or SIGHUP: stop the work, save the conversation and leave cleanly (the
        terminal is restored as the app exits; the caller stops the background jobs)."""
        if self.agent is not None:
            self.agent.stop()
        if self.commands is not None:
            self.commands.autosave()
        # Leaving can hang for good once the terminal is gone: a hang-up comes with SIGCONT, on
        # which Textual resumes application mode with a new output thread, that thread dies
        # writing to the dead terminal, and closing the app then waits on its full queue (the
        # agent outlived tmux's kill-server so, deaf to SIGTERM). The conversation is saved by
        # now: should leaving outlast the grace, the process ends.
        if self._watch_leaving and self._leave_watchdog is None:
            self._leave_watchdog = threading.Timer(
                LEAVE_GRACE_SECONDS, self._end_process, (128 + sig,)
            )
            self._leave_watchdog.daemon = True
            self._leave_watchdog.start()
        self.exit(return_code=128 + sig)

    def _end_process(self, code: int) -> None:
        """The way out when leaving hangs: the background jobs stopped, as the caller would
        once the app left, then the process ends at once (its main thread is stuck)."""
        if self.agent is not None:
            self.agent.toolbox.close()
        os._exit(code)

    @work(thread=True, group="load")
    def _load(self) -> None:
        try:
            agent = self.load_agent()
        except Exception as exc:  # a bad model file must leave a readable message, not a trace
            self.call_from_thread(self._note, f"could not load the model: {exc}", "error")
            self.call_from_thread(self._set_phase, "no model")
            return
        # A resumed conversation's saved model state is read here, off the UI thread.
        restored = (
            agent.states.restore(agent)
            if agent.states is not None and not agent.conversation.is_empty
            else ""
        )
        self.call_from_thread(self._loaded, agent, restored)

    def _loaded(self, agent: Agent, restored: str = "") -> None:
        self.agent = agent
        self.commands = SlashCommands(agent, self.store)
        self.model_name = agent.backend.name
        self.stats.context_tokens = agent.context_tokens()
        if not agent.conversation.is_empty:
            self._redraw_conversation()
            self._note(
                f"resumed {agent.conversation.name}" + (f" ({restored})" if restored else "")
            )
        self._note(
            f"{self.model_name} in {agent.toolbox.workspace.root} · Ctrl+C stops the "
            "model · /help lists the commands · Ctrl+Q quits"
        )
        if agent.instructions is not None:
            self._note(agent.instructions.describe())
        self._set_phase("ready")
        self._start_next()

    # ------------------------------------------------------------------ input

    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.value.strip()
        event.input.value = ""
        if not text:
            return
        event.input.prompts.add(text)
        if text.split()[0] == "/quit":
            self.action_quit_agent()
            return
        self.pending.append(text)
        if self.busy or self.agent is None:
            self._note(f"queued: {text}")
            self._update_status()
        else:
            self._start_next()

    def _start_next(self) -> None:
        """Run the oldest queued input, if the agent is free."""
        while self.pending and not self.busy and self.agent is not None:
            text = self.pending.popleft()
            if SlashCommands.is_command(text):
                self._run_command(text)
            else:
                self._mount(Static(Text(sanitize(text)), classes="user"))
                self._drive(self.agent.run(text))

    def _run_command(self, line: str) -> None:
        assert self.commands is not None
        outcome = self.commands.handle(line)
        if not line.startswith("/del"):  # a deleted conversation is saved again by a new turn
            self._autosave()
        if outcome.conversation_changed:
            self._redraw_conversation()
        if outcome.text:
            self._note(outcome.text)
        self.query_one(Footer).display = self.commands.hints
        if outcome.quit:
            self.exit()
        elif outcome.work is not None:
            self._drive(outcome.work)
        else:
            self._refresh_context()

    def action_interrupt(self) -> None:
        """Ctrl+C: stop what the agent is doing; when idle, only say how to quit."""
        if self.busy and self.agent is not None:
            self.agent.stop()
            self._set_phase("stopping…")
        else:
            self.query_one("#prompt", PromptInput).value = ""
            self.notify("Ctrl+Q or /quit exits", timeout=3)

    def action_quit_agent(self) -> None:
        """Ctrl+Q or /quit: leave, after asking when background jobs still run."""
        if isinstance(self.screen, QuitScreen):
            return  # already asking
        jobs = self.agent.toolbox.jobs.running_jobs() if self.agent is not None else []
        if jobs:
            self.push_screen(
                QuitScreen([job.state() for job in jobs]),
                lambda leave: self._quit() if leave else None,
            )
        else:
            self._quit()

    def _quit(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        if self.commands is not None:
            self.commands.handle("/quit")
        self.exit()

    # ------------------------------------------------------------------ running the agent

    def _drive(self, events: Iterator[AgentEvent]) -> None:
        self.busy = True
        self._set_phase("working…")
        self._consume(events)

    @work(thread=True, group="agent")
    def _consume(self, events: Iterator[AgentEvent]) -> None:
        try:
            for event in events:
                if isinstance(event, PermissionRequest):
                    event.answer(*self._ask_permission(event.call))
                else:
                    self._from_worker(self._show, event)
                if isinstance(event, (TurnFinished, RunFinished, CompactionFinished)):
                    self._autosave()
        except Exception as exc:  # a failing tool or backend must not take the UI down
            self._from_worker(self._note, f"error: {exc}", "error")
        finally:
            self._from_worker(self._run_done)

    def _autosave(self) -> None:
        """Save after every turn (in the thread that changes the conversation)."""
        problem = self.commands.autosave() if self.commands is not None else ""
        if problem and threading.current_thread() is threading.main_thread():
            self._note(problem, "error")
        elif problem:
            self._from_worker(self._note, problem, "error")

    def _from_worker(self, callback: Callable[..., Any], *args: Any) -> None:
        """``call_from_thread`` while the app runs; once it has ended there is nothing to show
        (and Textual would raise), but the worker must still run to its end."""
        if self.is_running:
            self.call_from_thread(callback, *args)

    def on_unmount(self) -> None:
        # However the app ends (Ctrl+Q, /quit, the terminal closing, a test harness), a worker
        # still generating or waiting for a permission answer must stop, or the process hangs.
        if self.agent is not None:
            self.agent.stop()

    def _ask_permission(self, call: ToolCall) -> tuple[Decision, str]:
        """Show the permission dialog and wait for the answer and the reason given with a
        denial (in the worker thread)."""
        assert self.agent is not None
        answered = threading.Event()
        decisions: list[tuple[Decision, str]] = []

        def decided(decision: Decision | None, reason: str) -> None:
            decisions.append((decision or Decision.DENY, reason))
            answered.set()

        # The diff reads and compares files: here, not in the UI thread.
        diff = self.agent.toolbox.preview(call)
        self._from_worker(self._open_permission, call, diff, decided)
        while not answered.wait(0.05):
            if self.agent.cancel.is_set() or not self.is_running:
                self._from_worker(self._close_permission)
                return Decision.DENY, ""
        return decisions[0]

    def _open_permission(
        self, call: ToolCall, diff: str, decided: Callable[[Decision | None, str], None]
    ) -> None:
        self._set_phase("waiting for permission")
        screen = PermissionScreen(call, diff)

        def answered(decision: Decision | None) -> None:
            if decision not in (None, Decision.DENY):
                self._set_phase(f"running {call.name}…")
            decided(decision, screen.reason)

        self._permission = screen
        self.push_screen(screen, answered)

    def _close_permission(self) -> None:
        if self._permission is not None and self._permission.is_current:
            self._permission.dismiss(Decision.DENY)
        self._permission = None

    async def _show(self, event: AgentEvent) -> None:
        await self._show_progress(event)
        for text, is_error in event_notes(event):
            self._note(text, "error" if is_error else "note")

    async def _show_progress(self, event: AgentEvent) -> None:
        if isinstance(event, TurnStarted):
            self._set_phase("generating…")
        elif isinstance(event, PrefillProgress):
            self._set_phase(
                f"prefill {event.done}/{event.total} tokens, {event.tokens_per_second:.1f} t/s"
            )
        elif isinstance(event, TextDelta):
            if self._answer_stream is None:
                answer = Markdown(classes="assistant")
                self._mount(answer)
                self._answer_stream = Markdown.get_stream(answer)
            await self._answer_stream.write(sanitize(event.text))
        elif isinstance(event, ReasoningDelta):
            self._show_reasoning(event.text)
        elif isinstance(event, ToolStarted):
            await self._end_answer()
            panel = ToolPanel(event.call, event.call_id)
            self._panels[event.call_id] = panel
            self._mount(panel)
            self._set_phase(f"running {event.call.name}…")
            if event.call.name == "bash":
                self._live = self.set_interval(_LIVE_SECONDS, partial(self._show_live, panel))
        elif isinstance(event, ToolFinished):
            self._stop_live()
            self._panels[event.call_id].finish(event.result)
        elif isinstance(event, MalformedToolCall):
            await self._end_answer()
        elif isinstance(event, TurnFinished):
            await self._end_answer()
            self._record_stats(event)
        elif isinstance(event, CompactionStarted):
            self._set_phase("compacting…")
        elif isinstance(event, CompactionFinished):
            self.stats.context_tokens = event.tokens_after
        elif isinstance(event, RunFinished):
            await self._end_answer()
            self._show_run_end(event)

    def _show_run_end(self, event: RunFinished) -> None:
        if event.reason == "cancelled":
            self._note("stopped")
        elif event.reason == "context_full":
            self._note(f"{event.error}: /compact or /new frees room", "error")
        elif event.reason != "answer":
            self._note(f"{event.reason.replace('_', ' ')}: {event.error}", "error")

    async def _end_answer(self) -> None:
        if self._answer_stream is not None:
            await self._answer_stream.stop()
            self._answer_stream = None
        self._reasoning = None
        self._reasoning_text = ""

    def _show_reasoning(self, text: str) -> None:
        self._reasoning_text += text
        if self._reasoning is None:
            self._reasoning = Static(classes="reasoning")
            self._mount(
                Collapsible(self._reasoning, title="thinking", collapsed=True, classes="tool")
            )
        self._reasoning.update(Text(sanitize(self._reasoning_text)))

    def _show_live(self, panel: ToolPanel) -> None:
        """The running command's latest output, in its panel."""
        output = self.agent.toolbox.jobs.current if self.agent is not None else None
        if output is not None and output.total:
            text, _ = output.text_since(max(0, output.total - _LIVE_BYTES))
            panel.show_live("\n".join(text.splitlines()[-_LIVE_LINES:]))

    def _stop_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _run_done(self) -> None:
        self._stop_live()
        self.busy = False
        self._panels.clear()
        self._answer_stream = None
        self._refresh_context()
        self._set_phase("ready")
        self._start_next()

    # ------------------------------------------------------------------ the log

    def _mount(self, widget) -> None:
        self.query_one("#log", VerticalScroll).mount(widget)

    def _note(self, text: str, kind: str = "note") -> None:
        self._mount(Static(Text(sanitize(text)), classes=kind))

    def _redraw_conversation(self) -> None:
        """Show a conversation that was switched to or started: its messages, tool calls with
        their results."""
        assert self.agent is not None
        log = self.query_one("#log", VerticalScroll)
        log.remove_children()
        panels: dict[str, ToolPanel] = {}
        for message in self.agent.messages:
            role, content = message["role"], message.get("content") or ""
            if role == "user":
                self._mount(Static(Text(sanitize(content)), classes="user"))
            elif role == "assistant":
                if content:
                    self._mount(Markdown(sanitize(content), classes="assistant"))
                for call in message.get("tool_calls") or ():
                    function = call["function"]
                    panel = ToolPanel(ToolCall(function["name"], function["arguments"]), call["id"])
                    panels[call["id"]] = panel
                    self._mount(panel)
            elif role == "tool" and message.get("tool_call_id") in panels:
                panels[message["tool_call_id"]].finish(
                    ToolResult(content, is_error=bool(message.get("is_error")))
                )

    # ------------------------------------------------------------------ status bar

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self._update_status()

    def _record_stats(self, event: TurnFinished) -> None:
        stats = event.finished.stats
        self.stats.context_tokens = event.context_tokens
        self.stats.generated = event.finished.completion_tokens
        self.stats.tokens_per_second = stats.decode_tps
        acceptance = event.finished.acceptance
        self.stats.tau = None if acceptance is None else acceptance.tau
        self._update_status()

    def _refresh_context(self) -> None:
        if self.agent is not None:
            self.stats.context_tokens = self.agent.context_tokens()
        self._update_status()

    def _update_status(self) -> None:
        parts = []
        if self.agent is not None:
            size = self.agent.backend.context_size
            used = self.stats.context_tokens
            parts.append(f"ctx {used}/{size} ({used / size:.0%})")
            rate = self.stats.tokens_per_second
            # No rate is shown where none was measured (a remote answer sent in one chunk).
            parts.append(f"{self.stats.generated} tok" + (f" {rate:.1f} t/s" if rate else ""))
            if self.stats.tau is not None:
                parts.append(f"τ {self.stats.tau:.2f}")
            hit_rate = self.agent.backend.expert_hit_rate()
            if hit_rate is not None:
                parts.append(f"experts {hit_rate:.0%} hit")
            parts.append(f"think {'on' if self.agent.settings.thinking else 'off'}")
        if self.agent is not None and self.agent.permissions.yolo:
            parts.append("YOLO: tools run unasked")
        if self.model_name:
            parts.append(self.model_name)
        parts.append(self.phase)
        if self.pending:
            parts.append(f"{len(self.pending)} queued")
        self.query_one("#status", Static).update(Text(" │ ".join(parts)))
