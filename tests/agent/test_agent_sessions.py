"""Sessions: /undo and /diff (per-prompt checkpoints in git and plain workspaces), autosave,
resuming in the UI, /permissions, and the session commands' bug fixes (/compact after Ctrl+C,
failed calls redrawn as failed)."""

from __future__ import annotations

import asyncio
import subprocess

from ds4mlx.agent.app import AgentApp
from ds4mlx.agent.commands import SlashCommands
from ds4mlx.agent.conversations import ConversationStore
from ds4mlx.agent.loop import Agent, CompactionFinished
from ds4mlx.agent.permissions import Decision, Permissions
from ds4mlx.agent.widgets import ToolPanel
from ds4mlx.engine.chat import ToolCall

import pytest
from scripted_backend import ScriptedBackend, call, text
from test_agent_app import ready, submit, texts, until


def git(workspace, *arguments: str) -> str:
    return subprocess.run(
        ["git", *arguments], cwd=workspace, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repository(workspace):
    git(workspace, "init", "-q")
    git(workspace, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(workspace, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    return workspace


def agent_with(toolbox, turns, tmp_path) -> tuple[Agent, SlashCommands]:
    agent = Agent(ScriptedBackend(turns), toolbox, Permissions(yolo=True))
    return agent, SlashCommands(agent, ConversationStore(tmp_path / "conversations"))


def changing_turns(with_bash: bool):
    calls = [
        call("edit", path="README.md", old="A demo", new="A changed"),
        call("write", path="src/new.py", content="print('new')\n"),
    ]
    if with_bash:
        calls.append(call("bash", command="echo made by bash > bash.txt"))
    return [calls, [text("changed")]]


def test_undo_in_a_plain_folder(toolbox, workspace, tmp_path):
    agent, commands = agent_with(
        toolbox,
        changing_turns(False)
        + [
            [call("edit", path="README.md", old="A changed", new="A twice changed")],
            [text("again")],
        ],
        tmp_path,
    )
    assert agent.checkpoints.kind == "files"
    list(agent.run("change things"))
    list(agent.run("read only"))  # a prompt that changes nothing records no checkpoint
    list(agent.run("change again"))
    assert "A twice changed" in (workspace / "README.md").read_text()
    diff = commands.handle("/diff").text
    assert "-A demo project." in diff and "+A twice changed project." in diff
    assert "+print('new')" in diff
    assert "restored 1 file" in commands.handle("/undo").text
    assert "A changed project." in (workspace / "README.md").read_text()
    outcome = commands.handle("/undo").text
    assert "restored 1 file(s) as they were before the last change: README.md" in outcome
    assert "removed 1 file(s) it created: src/new.py" in outcome
    assert (workspace / "README.md").read_text() == "# demo\nA demo project.\n"
    assert not (workspace / "src" / "new.py").exists()
    assert "nothing to undo" in commands.handle("/undo").text


def test_undo_in_a_plain_folder_removes_what_bash_created(toolbox, workspace, tmp_path):
    turns = [[call("bash", command="touch HIDDEN_MARKER; echo changed >> README.md")], [text("ok")]]
    agent, commands = agent_with(toolbox, turns, tmp_path)
    list(agent.run("run it"))
    assert (workspace / "HIDDEN_MARKER").exists()
    assert "+++ b/HIDDEN_MARKER" in commands.handle("/diff").text
    outcome = commands.handle("/undo").text
    assert "HIDDEN_MARKER" in outcome and not (workspace / "HIDDEN_MARKER").exists()
    assert "not restored" in outcome and "README.md" in outcome.split("not restored")[1]


@pytest.mark.parametrize("in_git", [False, True])
def test_undo_removes_the_folders_a_prompt_created(toolbox, workspace, tmp_path, in_git):
    if in_git:
        git(workspace, "init", "-q")
    (workspace / "kept").mkdir()
    turns = [
        [
            call("write", path="new/deeper/a.py", content="a\n"),
            call("write", path="new/b.py", content="b\n"),
            call("write", path="kept/c.py", content="c\n"),
        ],
        [text("ok")],
    ]
    agent, commands = agent_with(toolbox, turns, tmp_path)
    assert agent.checkpoints.kind == ("git" if in_git else "files")
    list(agent.run("make files"))
    outcome = commands.handle("/undo").text
    assert "restored" not in outcome
    assert "removed 3 file(s) it created: kept/c.py, new/b.py, new/deeper/a.py" in outcome
    assert "removed the folder(s) it created: new" in outcome
    assert not (workspace / "new").exists()
    assert (workspace / "kept").is_dir() and (workspace / "src").is_dir()


def test_undo_in_a_git_repository_includes_bash_changes(toolbox, repository, tmp_path):
    agent, commands = agent_with(toolbox, changing_turns(True), tmp_path)
    assert agent.checkpoints.kind == "git"
    (repository / "staged.txt").write_text("the user's own work\n")
    git(repository, "add", "staged.txt")
    status_before = git(repository, "status", "--porcelain")
    head_before = git(repository, "rev-parse", "HEAD")
    list(agent.run("change things"))
    assert (repository / "bash.txt").exists()
    diff = commands.handle("/diff").text
    assert "+made by bash" in diff and "+A changed project." in diff
    outcome = commands.handle("/undo").text
    assert "restored 1 file(s) as they were before the last change: README.md" in outcome
    assert "removed 2 file(s) it created: bash.txt, src/new.py" in outcome
    assert (repository / "README.md").read_text() == "# demo\nA demo project.\n"
    assert not (repository / "bash.txt").exists() and not (repository / "src/new.py").exists()
    # the user's index, branch and staged work are untouched
    assert git(repository, "status", "--porcelain") == status_before
    assert git(repository, "rev-parse", "HEAD") == head_before
    assert (repository / "staged.txt").read_text() == "the user's own work\n"
    assert git(repository, "for-each-ref", "refs/ds4-agent").strip()  # objects kept from gc


def test_undo_through_the_ui(toolbox, workspace, tmp_path):
    agent = Agent(ScriptedBackend(changing_turns(False)), toolbox, Permissions(yolo=True))
    app = AgentApp(lambda: agent, ConversationStore(tmp_path / "conversations"))

    async def main():
        async with app.run_test(size=(100, 40)) as pilot:
            await ready(pilot)
            await submit(pilot, "change things")
            await until(pilot, lambda: not app.busy and (workspace / "src/new.py").exists())
            await submit(pilot, "/undo")
            await until(pilot, lambda: not (workspace / "src/new.py").exists())

    asyncio.run(main())
    assert (workspace / "README.md").read_text() == "# demo\nA demo project.\n"


def test_compact_after_ctrl_c_is_not_cancelled(toolbox, tmp_path):
    turns = [[text("one " * 50)], [text("two " * 50)], [text("three " * 50)], [text("a summary")]]
    agent, commands = agent_with(toolbox, turns, tmp_path)
    for prompt in ("first", "second", "third"):
        list(agent.run(prompt))
    agent.stop()  # a Ctrl+C that came after the last run
    events = list(commands.handle("/compact").work)
    finished = [e for e in events if isinstance(e, CompactionFinished)][0]
    assert finished.note != "cancelled"


def test_a_failed_call_is_redrawn_as_failed(toolbox, tmp_path):
    turns = [[call("read", path="missing.txt"), call("list", path=".")], [text("ok")]]
    agent = Agent(ScriptedBackend(turns), toolbox, Permissions(yolo=True))
    store = ConversationStore(tmp_path / "conversations")
    app = AgentApp(lambda: agent, store)

    async def main():
        async with app.run_test(size=(100, 40)) as pilot:
            await ready(pilot)
            await submit(pilot, "look")
            await until(pilot, lambda: not app.busy and len(app.query(ToolPanel)) == 2)
            await submit(pilot, "/save first")
            await submit(pilot, "/new")
            await submit(pilot, "/switch first")
            await until(pilot, lambda: len(app.query(ToolPanel)) == 2)
            titles = [panel.title for panel in app.query(ToolPanel).results(ToolPanel)]
            assert titles[0].startswith("✗ read") and titles[1].startswith("✓ list")

    asyncio.run(main())


def test_a_turn_is_autosaved(toolbox, workspace, tmp_path):
    agent = Agent(ScriptedBackend([[text("saved answer")]]), toolbox, Permissions(yolo=True))
    store = ConversationStore(tmp_path / "conversations")
    app = AgentApp(lambda: agent, store)

    async def main():
        async with app.run_test(size=(100, 40)) as pilot:
            await ready(pilot)
            await submit(pilot, "question")
            await until(pilot, lambda: not app.busy and store.list())

    asyncio.run(main())
    [entry] = store.list()
    assert entry.workspace == str(workspace.resolve())
    assert store.load(entry.name).messages[-1]["content"] == "saved answer"


def test_stale_temporary_files_are_removed(tmp_path):
    import os
    import time

    store = ConversationStore(tmp_path)
    stale, fresh = tmp_path / ".chat.abc.tmp", tmp_path / ".chat.def.tmp"
    stale.write_text("{")
    fresh.write_text("{")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    assert store.remove_stale_temporaries() == 1
    assert not stale.exists() and fresh.exists()  # a save in progress elsewhere is left


def test_a_resumed_conversation_is_drawn(toolbox, tmp_path):
    from ds4mlx.agent.conversations import Conversation

    conversation = Conversation(
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "earlier question"},
            {"role": "assistant", "content": "earlier answer"},
        ],
        name="before",
    )
    agent = Agent(ScriptedBackend([]), toolbox, Permissions(), conversation=conversation)
    app = AgentApp(lambda: agent, ConversationStore(tmp_path / "conversations"))

    async def main():
        async with app.run_test(size=(100, 40)) as pilot:
            await ready(pilot)
            assert texts(app, ".user") == ["earlier question"]
            assert "resumed before" in texts(app, ".note")

    asyncio.run(main())


def test_permissions_lists_and_forgets_the_rules(toolbox, tmp_path):
    agent = Agent(ScriptedBackend([]), toolbox, Permissions())
    commands = SlashCommands(agent, ConversationStore(tmp_path / "conversations"))
    assert "ask" in commands.handle("/permissions").text
    agent.permissions.record(
        ToolCall("bash", {"command": "git diff --stat"}), Decision.ALLOW_PREFIX
    )
    agent.permissions.record(ToolCall("edit", {"path": "a"}), Decision.ALLOW_ALWAYS)
    listed = commands.handle("/permissions").text
    assert "bash(git diff:*)" in listed and "  edit" in listed
    assert "forgot 2" in commands.handle("/permissions clear").text
    assert agent.permissions.must_ask(ToolCall("edit", {"path": "a"}))
