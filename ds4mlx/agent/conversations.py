"""Conversations and where they are kept: one JSON file each under a data folder.

Files are written atomically (a temporary file in the same folder, then a rename), so a crash
never leaves half a conversation; temporary files a killed process left behind are removed
later. A file that cannot be read is reported by name with the reason, and never hides the
other conversations. Each conversation records the workspace it ran in, so that
``ds4-agent --continue`` finds the last one of this workspace.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
# A conversation's saved model state sits beside its JSON (``agent.kv_state``).
STATE_SUFFIX = ".kv.safetensors"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A temporary file older than this belongs to a save that was interrupted.
_STALE_TEMPORARY_SECONDS = 60.0


class ConversationError(Exception):
    """A conversation could not be saved, found or read; the message says which and why."""


@dataclass
class Conversation:
    messages: list[dict[str, Any]]
    name: str | None = None  # None until saved
    created: float = field(default_factory=time.time)
    workspace: str | None = None  # the folder the agent worked in

    @property
    def is_empty(self) -> bool:
        return not any(m["role"] != "system" for m in self.messages)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "name": self.name,
            "created": self.created,
            "saved": time.time(),
            "workspace": self.workspace,
            "messages": self.messages,
        }


@dataclass(frozen=True)
class SavedConversation:
    name: str
    messages: int
    saved: float
    problem: str = ""  # why the file cannot be loaded, if it cannot
    workspace: str | None = None


def default_name(now: float | None = None) -> str:
    return time.strftime("chat-%Y%m%d-%H%M%S", time.localtime(now))


class ConversationStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def save(self, conversation: Conversation, name: str | None = None) -> str:
        name = name or conversation.name or default_name()
        path = self._path(name)
        self.folder.mkdir(parents=True, exist_ok=True)
        conversation.name = name
        self.remove_stale_temporaries()
        handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                json.dump(conversation.to_json(), file, ensure_ascii=False, indent=1)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return name

    def load(self, name: str) -> Conversation:
        path = self._path(name)
        if not path.is_file():
            raise ConversationError(f"no saved conversation named {name!r}")
        data = self._read(path)
        return Conversation(
            messages=data["messages"],
            name=name,
            created=data.get("created", time.time()),
            workspace=data.get("workspace"),
        )

    def latest(self, workspace: str) -> Conversation:
        """The most recently saved conversation that ran in ``workspace``."""
        for saved in self.list():
            if not saved.problem and saved.workspace == workspace:
                return self.load(saved.name)
        raise ConversationError(f"no saved conversation for {workspace} in {self.folder}")

    def remove_stale_temporaries(self) -> int:
        """Remove what interrupted saves left behind; returns how many files."""
        removed = 0
        now = time.time()
        # Conversations' temporaries, and those of their saved model states (``kv_state``).
        patterns = (".*.tmp", ".*.tmp.safetensors")
        left = (
            [p for pattern in patterns for p in self.folder.glob(pattern)]
            if self.folder.is_dir()
            else []
        )
        for path in left:
            try:
                if now - path.stat().st_mtime > _STALE_TEMPORARY_SECONDS:
                    path.unlink()
                    removed += 1
            except OSError:  # another process removed or renamed it
                continue
        return removed

    def delete(self, name: str) -> None:
        path = self._path(name)
        if not path.is_file():
            raise ConversationError(f"no saved conversation named {name!r}")
        path.unlink()
        path.with_name(f"{name}{STATE_SUFFIX}").unlink(missing_ok=True)

    def list(self) -> list[SavedConversation]:
        """Every saved conversation, newest first; unreadable ones included, with the reason."""
        found = []
        for path in self.folder.glob("*.json") if self.folder.is_dir() else ():
            try:
                data = self._read(path)
                found.append(
                    SavedConversation(
                        path.stem,
                        len(data["messages"]),
                        data.get("saved", path.stat().st_mtime),
                        workspace=data.get("workspace"),
                    )
                )
            except ConversationError as exc:
                found.append(SavedConversation(path.stem, 0, path.stat().st_mtime, str(exc)))
        return sorted(found, key=lambda saved: saved.saved, reverse=True)

    def _path(self, name: str) -> Path:
        if not _NAME.fullmatch(name):
            raise ConversationError(
                f"{name!r} is not a valid name: use letters, digits, '.', "
                "'_' and '-', starting with a letter or digit"
            )
        return self.folder / f"{name}.json"

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConversationError(f"{path} cannot be read: {exc}") from exc
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise ConversationError(f"{path} is not a ds4-agent conversation (no message list)")
        return data
