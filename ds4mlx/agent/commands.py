"""Slash commands, independent of the UI: each returns text to show and what changed.

Leaving a conversation (/new, /switch, /quit) saves it first when it has anything in it, under
its name or a dated one, so no conversation is lost by switching away from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ds4mlx.agent.checkpoints import CheckpointError
from ds4mlx.agent.conversations import ConversationError, ConversationStore
from ds4mlx.agent.loop import Agent, AgentEvent

HELP = {
    "/new": "start a new conversation (the current one is saved)",
    "/save [name]": "save the conversation (under its name, a new name, or a dated one)",
    "/list": "list saved conversations",
    "/switch name": "save this conversation and continue a saved one",
    "/del name": "delete a saved conversation",
    "/history [n]": "show the last n messages (default 20)",
    "/undo": "put back the files the last prompt changed",
    "/diff": "show what this session changed in the workspace",
    "/permissions [clear]": "list what 'always' allowed this session, or forget it",
    "/compact": "summarise older turns to free context",
    "/strip": "drop tool outputs from the context",
    "/think on|off": "let the model reason before answering",
    "/hints on|off": "show or hide the key hints at the bottom",
    "/help": "this list",
    "/quit": "save and exit",
}


@dataclass
class CommandOutcome:
    text: str = ""
    work: Iterator[AgentEvent] | None = None  # events to run like a model turn (compaction)
    conversation_changed: bool = False  # the log should be redrawn from the conversation
    quit: bool = False


class SlashCommands:
    def __init__(self, agent: Agent, store: ConversationStore):
        self.agent = agent
        self.store = store
        self.hints = True
        self._handlers: dict[str, Callable[[str], CommandOutcome]] = {
            "/new": self._new,
            "/save": self._save,
            "/list": self._list,
            "/switch": self._switch,
            "/del": self._delete,
            "/history": self._history,
            "/undo": self._undo,
            "/diff": self._diff,
            "/permissions": self._permissions,
            "/compact": self._compact,
            "/strip": self._strip,
            "/think": self._think,
            "/hints": self._hints,
            "/help": self._help,
            "/quit": self._quit,
        }

    @staticmethod
    def is_command(line: str) -> bool:
        return line.lstrip().startswith("/")

    def handle(self, line: str) -> CommandOutcome:
        name, _, argument = line.strip().partition(" ")
        handler = self._handlers.get(name)
        if handler is None:
            return CommandOutcome(f"unknown command {name}; /help lists them")
        try:
            return handler(argument.strip())
        except ConversationError as exc:
            return CommandOutcome(f"error: {exc}")

    def autosave(self) -> str:
        """Save the conversation after a turn; "" when saved (or empty), else the problem."""
        try:
            self.save_current()
        except (ConversationError, OSError) as exc:
            return f"autosave failed: {exc}"
        return ""

    def save_current(self) -> str:
        """Save the conversation if it has anything in it; a note saying where."""
        if self.agent.conversation.is_empty:
            return ""
        return f"saved as {self.store.save(self.agent.conversation)}"

    def leave_current(self) -> str:
        """Save the conversation being left, and its model state where states are kept; a
        note saying where."""
        note = self.save_current()
        states = self.agent.states
        kept = states.save(self.agent) if states is not None and note else ""
        return "; ".join(part for part in (note, kept) if part)

    def restore_state(self) -> str:
        """Hand the conversation's saved model state to the engine; a note, "" for none."""
        states = self.agent.states
        return states.restore(self.agent) if states is not None else ""

    # ------------------------------------------------------------------ commands

    def _new(self, _: str) -> CommandOutcome:
        note = self.leave_current()
        self.agent.conversation = self.agent.new_conversation()
        return CommandOutcome(
            "new conversation" + (f" ({note})" if note else ""), conversation_changed=True
        )

    def _save(self, name: str) -> CommandOutcome:
        return CommandOutcome(f"saved as {self.store.save(self.agent.conversation, name)}")

    def _list(self, _: str) -> CommandOutcome:
        saved = self.store.list()
        if not saved:
            return CommandOutcome(f"no saved conversations in {self.store.folder}")
        current = self.agent.conversation.name
        lines = []
        for entry in saved:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.saved))
            marker = "*" if entry.name == current else " "
            detail = (
                f"unreadable: {entry.problem}" if entry.problem else f"{entry.messages} messages"
            )
            lines.append(f"{marker} {entry.name}  {when}  {detail}")
        return CommandOutcome("\n".join(lines))

    def _switch(self, name: str) -> CommandOutcome:
        if not name:
            return CommandOutcome("usage: /switch name (see /list)")
        loaded = self.store.load(name)  # before saving: a bad name changes nothing
        note = self.leave_current()
        self.agent.conversation = loaded
        restored = self.restore_state()
        notes = "; ".join(part for part in (note, restored) if part)
        return CommandOutcome(
            f"switched to {name}" + (f" ({notes})" if notes else ""), conversation_changed=True
        )

    def _delete(self, name: str) -> CommandOutcome:
        if not name:
            return CommandOutcome("usage: /del name (see /list)")
        self.store.delete(name)
        if self.agent.conversation.name == name:
            self.agent.conversation.name = None  # it lives on unsaved until saved again
        return CommandOutcome(f"deleted {name}")

    def _history(self, argument: str) -> CommandOutcome:
        count = int(argument) if argument.isdigit() and int(argument) > 0 else 20
        shown = [m for m in self.agent.messages if m["role"] != "system"][-count:]
        if not shown:
            return CommandOutcome("the conversation is empty")
        lines = []
        for message in shown:
            text = " ".join((message.get("content") or "").split())
            calls = [c["function"]["name"] for c in message.get("tool_calls") or ()]
            if calls:
                text = (text + " " if text else "") + f"[calls {', '.join(calls)}]"
            lines.append(f"{message['role']:>9}: {text[:160]}")
        return CommandOutcome("\n".join(lines))

    def _undo(self, _: str) -> CommandOutcome:
        try:
            return CommandOutcome(self.agent.checkpoints.undo())
        except (CheckpointError, OSError) as exc:
            return CommandOutcome(f"error: undo failed: {exc}")

    def _diff(self, _: str) -> CommandOutcome:
        try:
            diff = self.agent.checkpoints.diff()
        except (CheckpointError, OSError) as exc:
            return CommandOutcome(f"error: {exc}")
        return CommandOutcome(diff or "this session has not changed any file")

    def _permissions(self, argument: str) -> CommandOutcome:
        permissions = self.agent.permissions
        if argument == "clear":
            forgotten = len(permissions.rules)
            permissions.rules.clear()
            return CommandOutcome(f"forgot {forgotten} rule(s); write, edit and bash ask again")
        if argument:
            return CommandOutcome("usage: /permissions [clear]")
        if permissions.yolo:
            return CommandOutcome("--yolo: every tool runs without asking")
        if not permissions.rules:
            return CommandOutcome("nothing is allowed always; write, edit and bash ask")
        return CommandOutcome(
            "allowed without asking:\n"
            + "\n".join(f"  {rule.describe()}" for rule in permissions.rules)
        )

    def _compact(self, _: str) -> CommandOutcome:
        # A Ctrl+C that stopped the last run must not stop this one.
        self.agent.cancel.clear()
        return CommandOutcome(work=self.agent.compact("requested with /compact"))

    def _strip(self, _: str) -> CommandOutcome:
        before = self.agent.context_tokens()
        stripped = self.agent.strip_tool_outputs()
        return CommandOutcome(
            f"dropped {stripped} tool outputs: context {before} -> "
            f"{self.agent.context_tokens()} tokens"
        )

    def _think(self, argument: str) -> CommandOutcome:
        value = _on_off(argument, not self.agent.settings.thinking)
        if value is None:
            return CommandOutcome("usage: /think on|off")
        self.agent.settings.thinking = value
        return CommandOutcome(f"thinking {'on' if value else 'off'}")

    def _hints(self, argument: str) -> CommandOutcome:
        value = _on_off(argument, not self.hints)
        if value is None:
            return CommandOutcome("usage: /hints on|off")
        self.hints = value
        return CommandOutcome(f"hints {'on' if value else 'off'}")

    def _help(self, _: str) -> CommandOutcome:
        width = max(map(len, HELP))
        return CommandOutcome(
            "\n".join(f"{usage:<{width}}  {text}" for usage, text in HELP.items())
        )

    def _quit(self, _: str) -> CommandOutcome:
        return CommandOutcome(self.leave_current(), quit=True)


def _on_off(argument: str, toggled: bool) -> bool | None:
    """``on``/``off``; no argument toggles; anything else is None."""
    if not argument:
        return toggled
    return {"on": True, "off": False}.get(argument.lower())
