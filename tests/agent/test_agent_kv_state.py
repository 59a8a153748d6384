"""Conversations' model states kept beside them (``--kv-disk-dir``): /switch, --resume and
--continue restore the state instead of prefilling the conversation again, and a state that no
longer matches (compaction, another model, damage) is dropped with one note."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import ds4mlx
from ds4mlx.agent.app import AgentApp
from ds4mlx.agent.backend import LocalBackend
from ds4mlx.agent.commands import SlashCommands
from ds4mlx.agent.conversations import Conversation, ConversationStore
from ds4mlx.agent.kv_state import ConversationStates
from ds4mlx.agent.loop import Agent, AgentSettings, TurnFinished
from ds4mlx.agent.permissions import Permissions
from ds4mlx.cli.agent import main
from ds4mlx.engine.kvcache import PromptCache
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.generation import ChatService

import pytest
from scripted_backend import ScriptedBackend, text
from test_agent_app import ready, texts

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
pytestmark = pytest.mark.skipif(not TINY_MODEL.is_file(), reason=f"{TINY_MODEL} is not built")


@pytest.fixture(scope="module")
def model():
    return ds4mlx.load_model(TINY_MODEL)


def fresh_agent(model, toolbox, store: ConversationStore, cache: bool = True) -> Agent:
    """An agent over a new engine service: what a new ds4-agent process has."""
    service = ChatService(
        model, max_context=2048, prompt_cache=PromptCache(256 << 20) if cache else None
    )
    backend = LocalBackend(service, SamplingOptions(temperature=0.0))
    agent = Agent(backend, toolbox, Permissions(), AgentSettings(max_steps=1, max_tokens=6))
    agent.states = ConversationStates(store)
    return agent


def turns(events) -> list[TurnFinished]:
    return [event for event in events if isinstance(event, TurnFinished)]


def test_switch_restores_the_state_instead_of_prefilling(model, toolbox, tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    agent = fresh_agent(model, toolbox, store)
    first = turns(agent.run("What does the add function in src/app.py return?"))
    assert first
    note = SlashCommands(agent, store).handle("/new").text
    name = agent_name = store.list()[0].name
    assert "kept the model state" in note
    assert (store.folder / f"{agent_name}.kv.safetensors").is_file()

    # Cold: a new process that resumes the conversation without a saved state.
    cold_agent = fresh_agent(model, toolbox, store)
    cold_agent.conversation = store.load(name)
    cold = turns(cold_agent.run("And the greet method?"))[0].finished

    warm_agent = fresh_agent(model, toolbox, store)
    outcome = SlashCommands(warm_agent, store).handle(f"/switch {name}")
    assert "restored the model state" in outcome.text
    warm = turns(warm_agent.run("And the greet method?"))[0].finished
    assert cold.cached_tokens == 0 and cold.prompt_tokens == warm.prompt_tokens
    assert warm.cached_tokens >= first[0].finished.prompt_tokens
    assert warm.cached_tokens >= 0.8 * warm.prompt_tokens


def test_a_stale_or_foreign_state_is_dropped_with_one_note(model, toolbox, tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    agent = fresh_agent(model, toolbox, store)
    turns(agent.run("List the files in src."))
    SlashCommands(agent, store).handle("/new")
    name = store.list()[0].name
    state = store.folder / f"{name}.kv.safetensors"
    # The conversation was rewritten after its state was saved (as compaction does).
    conversation = store.load(name)
    conversation.messages[1]["content"] = "Summary: the user asked about files."
    store.save(conversation)
    other = fresh_agent(model, toolbox, store)
    note = SlashCommands(other, store).handle(f"/switch {name}").text
    assert "ignored the saved model state" in note and "stale" in note
    assert not state.exists()
    # A damaged one.
    state.write_bytes(b"\0" * 100)
    note = SlashCommands(other, store).handle(f"/switch {name}").text
    assert note.count("ignored the saved model state") == 1 and not state.exists()
    # The turn after it still runs, from scratch.
    assert turns(other.run("Go on."))[0].finished.cached_tokens == 0


def test_compaction_removes_the_saved_state(toolbox, tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    backend = ScriptedBackend(context_size=4096)
    agent = Agent(backend, toolbox, Permissions(yolo=True))
    agent.states = ConversationStates(store)
    for number in range(30):
        agent.messages.extend(
            [
                {"role": "user", "content": f"Question {number}: what does module {number} do?"},
                {"role": "assistant", "content": f"Module {number} sets x to {number}. " * 8},
            ]
        )
    store.save(agent.conversation)
    state = store.folder / f"{agent.conversation.name}.kv.safetensors"
    state.write_bytes(b"a state of the conversation before compaction")
    backend.turns.append([text("summary of the work")])
    assert list(agent.compact())[-1].compacted
    assert not state.exists()


def test_deleting_a_conversation_deletes_its_state(tmp_path):
    store = ConversationStore(tmp_path)
    name = store.save(Conversation([{"role": "user", "content": "hi"}]))
    state = tmp_path / f"{name}.kv.safetensors"
    state.write_bytes(b"state")
    store.delete(name)
    assert not state.exists() and not list(tmp_path.iterdir())


def test_resume_with_print_restores_the_saved_state(workspace, tmp_path, capsys):
    store = ConversationStore(tmp_path / "conversations")
    name = store.save(
        Conversation(
            [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "What is in README.md?"},
                {"role": "assistant", "content": "A demo project."},
            ],
            workspace=str(workspace.resolve()),
        )
    )
    flags = [
        "-m",
        str(TINY_MODEL),
        "--workspace",
        str(workspace),
        "--data-dir",
        str(store.folder),
        "--kv-disk-dir",
        str(tmp_path / "kv"),
        "--max-steps",
        "1",
        "-n",
        "4",
        "--temp",
        "0",
    ]
    main(["--print", "Thanks. And src/app.py?", "--resume", name, *flags])
    first = capsys.readouterr().err
    assert "kept the model state" in first and "restored" not in first
    main(["--print", "And src/util.js?", "--continue", *flags])
    second = capsys.readouterr().err
    assert "restored the model state" in second


def test_the_ui_restores_a_resumed_conversations_state(model, toolbox, tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    agent = fresh_agent(model, toolbox, store)
    turns(agent.run("What is in README.md?"))
    SlashCommands(agent, store).handle("/new")
    name = store.list()[0].name
    resumed = fresh_agent(model, toolbox, store)
    resumed.conversation = store.load(name)
    app = AgentApp(lambda: resumed, store)

    async def main():
        async with app.run_test(size=(100, 40)) as pilot:
            await ready(pilot)
            notes = texts(app, ".note")
            assert any(f"resumed {name} (restored the model state" in n for n in notes), notes

    asyncio.run(main())
    assert turns(resumed.run("Thanks."))[0].finished.cached_tokens > 0


def test_what_an_interrupted_state_save_left_is_removed(tmp_path):
    store = ConversationStore(tmp_path)
    stale = tmp_path / ".chat.kv.0123abcd.tmp.safetensors"
    stale.write_bytes(b"half a state")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    assert store.remove_stale_temporaries() == 1 and not stale.exists()
