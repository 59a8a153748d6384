"""The agent's prompt: a multi-line input with a history of earlier prompts.

Enter sends the prompt; Shift+Enter starts a new line, and so do Ctrl+J and Alt+Enter, which
every terminal can send (most send Shift+Enter as a plain Enter). A paste keeps its newlines:
the terminal's bracketed paste arrives as one event, whose text goes in whole (the carriage
returns with which tmux and some terminals separate pasted lines become newlines). Up on the first
line and Down on the last one walk through the earlier prompts, which are kept in a file (one
JSON string a line, so that multi-line prompts survive) under the data folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from textual import events
from textual.message import Message
from textual.widgets import TextArea

# Prompts the history file keeps, the newest ones.
MAX_HISTORY = 500
NEWLINE_KEYS = frozenset({"shift+enter", "ctrl+j", "alt+enter", "newline"})


class PromptHistory:
    """Earlier prompts, oldest first, and a position for walking through them with Up/Down;
    ``path`` (optional) keeps them between sessions, readable by the user only."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self.entries: list[str] = self._read() if path is not None else []
        self.position = len(self.entries)  # len(entries): the draft being written
        self.draft = ""

    def _read(self) -> list[str]:
        assert self.path is not None
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            return []  # no history yet, or an unreadable one: start afresh, it is not precious
        entries = []
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, str) and entry:
                entries.append(entry)
        return entries[-MAX_HISTORY:]

    def add(self, prompt: str) -> None:
        """Remember a sent prompt (a repeat of the last one once) and go back to a new draft."""
        if prompt and (not self.entries or self.entries[-1] != prompt):
            self.entries.append(prompt)
            del self.entries[:-MAX_HISTORY]
            self._write()
        self.position = len(self.entries)
        self.draft = ""

    def _write(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            temporary = self.path.with_name(f".{self.path.name}.tmp")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.writelines(json.dumps(entry) + "\n" for entry in self.entries)
            os.replace(temporary, self.path)
        except OSError:
            pass  # the history is a convenience; a read-only data folder must not stop a prompt

    def previous(self, current: str) -> str | None:
        """The prompt before the one shown (``current`` is kept as the draft); None at the
        oldest."""
        if self.position == 0:
            return None
        if self.position == len(self.entries):
            self.draft = current
        self.position -= 1
        return self.entries[self.position]

    def next(self) -> str | None:
        """The prompt after the one shown, the draft after the newest; None past the draft."""
        if self.position >= len(self.entries):
            return None
        self.position += 1
        return self.entries[self.position] if self.position < len(self.entries) else self.draft


class PromptInput(TextArea):
    """A TextArea that sends on Enter and keeps a history (see the module notes)."""

    DEFAULT_CSS = """
    PromptInput { height: auto; max-height: 10; }
    """

    class Submitted(Message):
        def __init__(self, prompt_input: PromptInput, value: str):
            super().__init__()
            self.input = prompt_input
            self.value = value

        @property
        def control(self) -> PromptInput:
            return self.input

    def __init__(
        self,
        history: PromptHistory | None = None,
        complete: Callable[[str], str | None] | None = None,
        **kwargs,
    ):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.prompts = history or PromptHistory()
        # Given the text before the cursor, the text to insert there on Tab (None: nothing).
        self.complete = complete

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        handled = True
        if event.key == "enter":
            self.post_message(self.Submitted(self, self.text))
        elif event.key in NEWLINE_KEYS:
            self.replace("\n", *self.selection)
        elif event.key == "up" and self.cursor_location[0] == 0:
            self._recall(self.prompts.previous(self.text))
        elif event.key == "down" and self.cursor_location[0] == self.document.line_count - 1:
            self._recall(self.prompts.next())
        elif event.key == "tab" and self.complete is not None:
            self._complete()
        else:
            handled = False
        if handled:
            event.stop()
            event.prevent_default()
            return
        await super()._on_key(event)

    def _recall(self, text: str | None) -> None:
        if text is not None:
            self.value = text

    def _complete(self) -> None:
        assert self.complete is not None
        row, column = self.cursor_location
        before = self.document[row][:column]
        insert = self.complete(before)
        if insert:
            self.insert(insert)
