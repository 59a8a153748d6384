"""When the agent saves, restores and drops a conversation's model state: a stand-in backend
records the calls (no model; the engine's side is in test_agent_kv_state.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ds4mlx.agent.conversations import ConversationStore
from ds4mlx.agent.kv_state import ConversationStates
from ds4mlx.generation import SnapshotFileError

import pytest


class Backend:
    def __init__(self, keeps_states: bool = True, fail: Exception | None = None):
        if keeps_states:
            self.keeps_states = True
        self.fail = fail
        self.calls: list[tuple[str, Path]] = []

    def save_state(self, path, messages, schemas, thinking):
        self.calls.append(("save", path))
        if self.fail:
            raise self.fail
        path.write_bytes(b"state")
        return 12

    def restore_state(self, path, messages, schemas, thinking):
        self.calls.append(("restore", path))
        if self.fail:
            raise self.fail
        return 12


def agent(backend, name="chat", running=False):
    return SimpleNamespace(
        backend=backend,
        conversation=SimpleNamespace(name=name),
        messages=[],
        toolbox=SimpleNamespace(schemas=[]),
        settings=SimpleNamespace(thinking=False),
        running=running,
    )


@pytest.fixture
def states(tmp_path):
    return ConversationStates(ConversationStore(tmp_path))


def test_a_saved_conversation_keeps_and_restores_its_state(states):
    backend = Backend()
    assert states.save(agent(backend)) == "kept the model state (12 tokens)"
    assert states.path("chat").is_file()
    assert states.restore(agent(backend)) == "restored the model state (12 tokens need no prefill)"
    assert [call for call, _ in backend.calls] == ["save", "restore"]


@pytest.mark.parametrize(
    "case",
    [
        {"name": None},  # never saved: no name to keep a state under
        {"running": True},  # mid-turn: the state is not the conversation's
        {"backend": Backend(keeps_states=False)},
    ],
)
def test_nothing_is_saved_when_it_cannot_be(states, case):
    backend = case.pop("backend", Backend())
    assert states.save(agent(backend, **case)) == ""
    assert backend.calls == []


@pytest.mark.parametrize("case", [{"name": None}, {"backend": Backend(keeps_states=False)}])
def test_nothing_is_restored_when_it_cannot_be(states, case):
    Backend().save_state(states.path("chat"), [], [], False)
    backend = case.pop("backend", Backend())
    assert states.restore(agent(backend, **case)) == ""
    assert backend.calls == []


def test_without_a_saved_state_nothing_is_restored(states):
    backend = Backend()
    assert states.restore(agent(backend)) == ""
    assert backend.calls == []


def test_a_state_that_cannot_be_read_is_removed(states):
    states.path("chat").write_bytes(b"junk")
    backend = Backend(fail=SnapshotFileError("bad header"))
    assert states.restore(agent(backend)) == "ignored the saved model state: bad header"
    assert not states.path("chat").exists()


def test_a_failed_save_is_a_note(states):
    note = states.save(agent(Backend(fail=OSError("disk full"))))
    assert note == "could not save the model state of chat: disk full"


def test_invalidate_drops_only_a_named_conversations_state(states):
    states.path("chat").write_bytes(b"state")
    states.invalidate(agent(Backend(), name=None))
    assert states.path("chat").exists()
    states.invalidate(agent(Backend()))
    assert not states.path("chat").exists()
    states.invalidate(agent(Backend()))  # already gone: no error


def test_a_save_that_held_no_state_says_nothing_and_thinking_is_passed_on(states):
    seen = []

    class Empty(Backend):
        def save_state(self, path, messages, schemas, thinking):
            seen.append(("save", thinking))
            return 0

        def restore_state(self, path, messages, schemas, thinking):
            seen.append(("restore", thinking))
            return 0

    thinking = agent(Empty())
    thinking.settings.thinking = True
    assert states.save(thinking) == ""
    states.path("chat").write_bytes(b"state")
    assert states.restore(thinking) == "restored the model state (0 tokens need no prefill)"
    assert seen == [("save", True), ("restore", True)]
