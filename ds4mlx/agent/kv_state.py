"""A conversation's model state kept beside it: ``NAME.kv.safetensors`` next to ``NAME.json``.

When ds4-agent runs the model in-process with a disk folder for states (``--kv-disk-dir``),
leaving a conversation (/new, /switch, /quit, the end of --print) saves the longest state its
next turn can start from, and /switch, ``--continue`` and ``--resume`` hand that state back to
the engine, so the next turn prefills only what is new instead of the whole conversation.
Compaction rewrites the conversation, so it removes the state (it would never match again). A
state that cannot be used (another model, damaged, stale) is reported in one line and removed;
the turn then prefills as it would have without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from ds4mlx.agent.conversations import STATE_SUFFIX, Conversation, ConversationStore
from ds4mlx.generation import SnapshotFileError


class Agent(Protocol):
    """What of an agent (``agent.loop.Agent``, which holds its ``ConversationStates``) saving
    and restoring its state reads."""

    backend: Any
    conversation: Conversation
    messages: list[Any]
    toolbox: Any
    settings: Any
    running: bool


class ConversationStates:
    def __init__(self, store: ConversationStore):
        self.store = store

    def path(self, name: str) -> Path:
        return self.store.folder / f"{name}{STATE_SUFFIX}"

    @staticmethod
    def _usable(agent: Agent) -> bool:
        return bool(getattr(agent.backend, "keeps_states", False))

    def save(self, agent: Agent) -> str:
        """Save the state of the agent's (saved) conversation; a note for the user, "" when
        there was nothing to save."""
        name = agent.conversation.name
        if name is None or not self._usable(agent) or agent.running:
            return ""
        path = self.path(name)
        try:
            tokens = agent.backend.save_state(
                path, agent.messages, agent.toolbox.schemas, thinking=agent.settings.thinking
            )
        except OSError as exc:
            return f"could not save the model state of {name}: {exc}"
        return f"kept the model state ({tokens} tokens)" if tokens else ""

    def restore(self, agent: Agent) -> str:
        """Hand the saved state of the agent's conversation to the engine; a note for the
        user, "" when there is none."""
        name = agent.conversation.name
        if name is None or not self._usable(agent):
            return ""
        path = self.path(name)
        if not path.is_file():
            return ""
        try:
            tokens = agent.backend.restore_state(
                path, agent.messages, agent.toolbox.schemas, thinking=agent.settings.thinking
            )
        except SnapshotFileError as exc:
            path.unlink(missing_ok=True)
            return f"ignored the saved model state: {exc}"
        return f"restored the model state ({tokens} tokens need no prefill)"

    def invalidate(self, agent: Agent) -> None:
        """The conversation was rewritten (compaction): its saved state no longer matches."""
        if agent.conversation.name is not None:
            self.path(agent.conversation.name).unlink(missing_ok=True)
