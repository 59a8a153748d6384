"""Saved conversations and the slash commands that manage them."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

from ds4mlx.agent.checkpoints import CheckpointError
from ds4mlx.agent.commands import HELP, SlashCommands
from ds4mlx.agent.conversations import (
    STATE_SUFFIX,
    Conversation,
    ConversationError,
    ConversationStore,
)
from ds4mlx.agent.loop import Agent, CompactionStarted
from ds4mlx.agent.permissions import Permissions, Rule

import pytest
from scripted_backend import ScriptedBackend, text


@pytest.fixture
def commands(toolbox, store) -> SlashCommands:
    agent = Agent(ScriptedBackend(), toolbox, Permissions(yolo=True))
    return SlashCommands(agent, store)


def chat(commands: SlashCommands, prompt: str, answer: str) -> None:
    commands.agent.backend.turns.append([text(answer)])
    list(commands.agent.run(prompt))


def test_save_and_load_round_trip(store):
    conversation = Conversation(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "héllo ✓"}]
    )
    assert store.save(conversation, "first") == "first"
    loaded = store.load("first")
    assert loaded.messages == conversation.messages and loaded.name == "first"
    assert [p.name for p in store.folder.iterdir()] == ["first.json"]  # no temporary left


def test_names_are_checked(store):
    conversation = Conversation([])
    for bad in ("../escape", "a/b", ".hidden", "x" * 200, "a b"):
        with pytest.raises(ConversationError, match="not a valid name"):
            store.save(conversation, bad)
    with pytest.raises(ConversationError, match="no saved conversation"):
        store.load("missing")


def test_a_corrupt_file_is_reported_and_hides_nothing(store):
    store.save(Conversation([{"role": "user", "content": "ok"}]), "good")
    (store.folder / "broken.json").write_text('{"messages": [')
    (store.folder / "alien.json").write_text(json.dumps({"something": "else"}))
    listed = {entry.name: entry for entry in store.list()}
    assert set(listed) == {"good", "broken", "alien"}
    assert listed["good"].messages == 1 and not listed["good"].problem
    assert "cannot be read" in listed["broken"].problem
    assert "not a ds4-agent conversation" in listed["alien"].problem
    with pytest.raises(ConversationError, match="cannot be read"):
        store.load("broken")


def test_save_list_switch_delete(commands, store):
    chat(commands, "first question", "first answer")
    assert commands.handle("/save alpha").text == "saved as alpha"
    new = commands.handle("/new")
    assert new.conversation_changed and new.text == "new conversation (saved as alpha)"
    assert commands.agent.conversation.is_empty
    chat(commands, "second question", "second answer")
    assert commands.handle("/save beta").text == "saved as beta"
    listing = commands.handle("/list").text
    assert "* beta" in listing and "  alpha" in listing and "3 messages" in listing

    switched = commands.handle("/switch alpha")
    assert switched.conversation_changed and switched.text.startswith("switched to alpha")
    assert commands.agent.messages[1]["content"] == "first question"
    assert "no saved conversation named 'gamma'" in commands.handle("/switch gamma").text
    assert commands.agent.conversation.name == "alpha"  # a failed switch changes nothing

    assert commands.handle("/del beta").text == "deleted beta"
    assert [e.name for e in store.list()] == ["alpha"]
    assert commands.agent.conversation.name == "alpha"  # another one went: this keeps its name
    assert "usage" in commands.handle("/del").text
    assert commands.handle("/del alpha").text == "deleted alpha"
    assert commands.agent.conversation.name is None  # it lives on unsaved


def test_leaving_an_unsaved_conversation_saves_it(commands, store):
    chat(commands, "remember me", "ok")
    note = commands.handle("/new").text
    assert note.startswith("new conversation (saved as chat-")
    saved = store.list()
    assert len(saved) == 1 and store.load(saved[0].name).messages[1]["content"] == "remember me"
    assert commands.handle("/quit").quit


def test_history_think_hints_strip_help(commands):
    chat(commands, "what now?", "this\nanswer")
    history = commands.handle("/history").text.splitlines()
    assert history == ["     user: what now?", "assistant: this answer"]
    assert commands.handle("/think on").text == "thinking on"
    assert commands.agent.settings.thinking
    assert commands.handle("/think").text == "thinking off"
    assert commands.handle("/think maybe").text == "usage: /think on|off"
    assert commands.handle("/think ON").text == "thinking on"  # any case
    assert commands.handle("/hints Off").text == "hints off" and not commands.hints
    assert commands.handle("/hints").text == "hints on"
    assert commands.handle("/hints off").text == "hints off" and not commands.hints
    assert commands.handle("/strip").text.startswith("dropped 0 tool outputs")
    assert all(usage.split()[0] in commands.handle("/help").text for usage in HELP)
    assert "unknown command /nope" in commands.handle("/nope").text


def test_compact_command_returns_work_to_run(commands):
    outcome = commands.handle("/compact")
    assert outcome.work is not None
    assert isinstance(next(outcome.work), CompactionStarted)


def test_only_stale_temporaries_are_removed_and_continue_stays_in_its_workspace(tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    store.save(Conversation([{"role": "user", "content": "a"}], workspace="/ws/a"), "a")
    time.sleep(0.01)
    store.save(Conversation([{"role": "user", "content": "b"}], workspace="/ws/b"), "b")
    in_progress = store.folder / ".c.123.tmp"  # another process's save, not finished yet
    in_progress.write_text("{")
    left = store.folder / ".d.456.tmp"  # an interrupted save, an hour ago
    left.write_text("{")
    os.utime(left, (time.time() - 3600, time.time() - 3600))
    assert store.remove_stale_temporaries() == 1
    assert in_progress.exists() and not left.exists()
    assert store.latest("/ws/a").name == "a" and store.latest("/ws/b").name == "b"


def test_the_newest_conversation_of_a_workspace_is_listed_first_and_continued(tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    for name in ("older", "newer"):
        store.save(Conversation([{"role": "user", "content": name}], workspace="/ws"), name)
        time.sleep(0.01)
    assert [saved.name for saved in store.list()] == ["newer", "older"]
    assert store.latest("/ws").name == "newer"


def test_history_takes_a_positive_count_and_names_the_calls(commands):
    assert commands.handle("/history").text == "the conversation is empty"
    for n in range(3):
        chat(commands, f"q{n}", f"a{n}")
    commands.agent.messages.append(
        {
            "role": "assistant",
            "content": "x" * 200,
            "tool_calls": [{"function": {"name": "read"}}, {"function": {"name": "bash"}}],
        }
    )
    last = f"assistant: {('x' * 200 + ' [calls read, bash]')[:160]}"
    assert commands.handle("/history 1").text == last
    assert commands.handle("/history 2").text.splitlines() == ["assistant: a2", last]
    for everything in ("/history 0", "/history -1", "/history two"):
        assert len(commands.handle(everything).text.splitlines()) == 7
    commands.agent.messages.append({"role": "assistant", "content": None, "tool_calls": []})
    commands.agent.messages.append(
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "list"}}]}
    )
    assert commands.handle("/history 2").text.splitlines() == [
        "assistant: ",
        "assistant: [calls list]",
    ]


def test_list_marks_the_current_conversation_and_an_unreadable_one(commands, store):
    assert commands.handle("/list").text == f"no saved conversations in {store.folder}"
    chat(commands, "hello", "hi")
    commands.handle("/save mine")
    (store.folder / "bad.json").write_text("{")
    os.utime(store.folder / "bad.json", (0, 0))
    lines = commands.handle("/list").text.splitlines()
    assert lines[0].startswith("* mine  ") and lines[0].endswith("  3 messages")
    assert lines[1].startswith("  bad  1970-01-01 ") or lines[1].startswith("  bad  1969-12-31 ")
    assert "  unreadable: " in lines[1] and "bad.json cannot be read" in lines[1]


def test_switch_and_del_need_a_name_and_deleting_the_current_one_unsaves_it(commands, store):
    assert commands.handle("/switch").text == "usage: /switch name (see /list)"
    assert commands.handle("/del  ").text == "usage: /del name (see /list)"
    chat(commands, "hello", "hi")
    commands.handle("/save mine")
    assert commands.handle("/del mine").text == "deleted mine"
    assert commands.agent.conversation.name is None
    assert commands.handle("/del mine").text == "error: no saved conversation named 'mine'"


def test_permissions_lists_clears_and_explains(commands):
    permissions = commands.agent.permissions
    assert commands.handle("/permissions").text == "--yolo: every tool runs without asking"
    permissions.yolo = False
    assert commands.handle("/permissions").text == (
        "nothing is allowed always; write, edit and bash ask"
    )
    permissions.rules += [Rule("bash", prefix="git diff"), Rule("edit")]
    assert commands.handle("/permissions").text == (
        "allowed without asking:\n  bash(git diff:*)\n  edit"
    )
    assert commands.handle("/permissions all").text == "usage: /permissions [clear]"
    assert commands.handle("/permissions clear").text == (
        "forgot 2 rule(s); write, edit and bash ask again"
    )
    assert permissions.rules == []


def test_diff_of_an_unchanged_session(commands):
    assert commands.handle("/diff").text == "this session has not changed any file"


def test_help_aligns_the_descriptions_and_commands_may_follow_spaces(commands):
    width = max(map(len, HELP))
    lines = commands.handle("/help").text.splitlines()
    assert (
        lines[0]
        == "/new" + " " * (width - 4) + "  start a new conversation (the current one is saved)"
    )
    assert len(lines) == len(HELP)
    assert SlashCommands.is_command("  /help") and not SlashCommands.is_command("a /help")


def test_leaving_names_where_the_conversation_was_saved(commands, store):
    assert commands.handle("/new").text == "new conversation"
    chat(commands, "hello", "hi")
    commands.handle("/save first")
    assert commands.handle("/new").text == "new conversation (saved as first)"
    assert commands.handle("/switch first").text == "switched to first"


def test_a_failed_autosave_says_why(commands, tmp_path):
    chat(commands, "hello", "hi")
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    commands.store = ConversationStore(blocked / "inside")
    assert commands.autosave().startswith("autosave failed: ")
    commands.store = ConversationStore(tmp_path / "fine")
    assert commands.autosave() == ""


def test_history_of_no_count_shows_the_last_twenty(commands):
    for n in range(13):
        chat(commands, f"q{n}", f"a{n}")  # 26 messages
    for default in ("/history", "/history 0", "/history -3"):
        shown = commands.handle(default).text.splitlines()
        assert len(shown) == 20 and shown[-1] == "assistant: a12", default


@pytest.mark.parametrize("failure", [CheckpointError("git stash: locked"), OSError("disk full")])
def test_undo_and_diff_report_their_failure(commands, monkeypatch, failure):
    """A failed undo or diff is one line naming the error; the UI goes on."""

    def fail() -> str:
        raise failure

    monkeypatch.setattr(commands.agent.checkpoints, "undo", fail)
    monkeypatch.setattr(commands.agent.checkpoints, "diff", fail)
    assert commands.handle("/undo").text == f"error: undo failed: {failure}"
    assert commands.handle("/diff").text == f"error: {failure}"


def test_hints_refuses_a_word_it_does_not_know(commands):
    assert commands.handle("/hints maybe").text == "usage: /hints on|off"
    assert commands.hints  # unchanged


def test_a_save_that_fails_midway_leaves_no_temporary(store):
    """Whatever stops a save (here a message JSON cannot hold), the temporary file goes."""
    with pytest.raises(TypeError):
        store.save(Conversation([{"role": "user", "content": object()}]), "broken")
    assert list(store.folder.iterdir()) == []


def test_a_temporary_gone_before_its_age_is_read_is_passed_over(tmp_path):
    """Another process may remove a temporary between the listing and its stat (here a link
    to nothing stands for it): the stale ones are still removed."""
    store = ConversationStore(tmp_path)
    (tmp_path / ".a.vanished.tmp").symlink_to(tmp_path / "nowhere")
    stale = tmp_path / ".b.stale.tmp"
    stale.write_text("{")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    assert store.remove_stale_temporaries() == 1
    assert not stale.exists()


def test_a_model_state_is_kept_only_with_a_saved_conversation(commands):
    """An empty conversation is not saved on leaving, so neither is its model state."""
    kept = []
    commands.agent.states = SimpleNamespace(
        save=lambda agent: kept.append(agent.conversation.name) or "kept the model state (9 tokens)"
    )
    commands.handle("/save empty")
    assert commands.handle("/new").text == "new conversation"
    assert kept == []
    chat(commands, "hello", "hi")
    commands.handle("/save full")
    assert commands.handle("/new").text == (
        "new conversation (saved as full; kept the model state (9 tokens))"
    )
    assert kept == ["full"]


def test_strip_gives_the_context_before_and_after(commands):
    chat(commands, "list it", "done")
    commands.agent.messages.append({"role": "tool", "content": "x" * 4000})
    before = commands.agent.context_tokens()
    text = commands.handle("/strip").text
    after = commands.agent.context_tokens()
    assert before > after + 900
    assert text == f"dropped 1 tool outputs: context {before} -> {after} tokens"


def test_a_command_after_spaces_is_still_that_command(commands):
    assert commands.handle("  /think on ").text == "thinking on"


def test_list_gives_each_conversations_time_to_the_minute(commands, store):
    chat(commands, "hello", "hi")
    commands.handle("/save timed")
    (saved,) = store.list()
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(saved.saved))
    assert commands.handle("/list").text == f"* timed  {when}  3 messages"


def test_only_conversation_files_are_listed(store):
    """A model state kept beside a conversation (NAME.kv.safetensors) is no conversation."""
    store.save(Conversation([{"role": "user", "content": "a"}]), "kept")
    (store.folder / f"kept{STATE_SUFFIX}").write_bytes(b"state")
    (store.folder / "notes.txt").write_text("not mine")
    assert [(entry.name, entry.problem) for entry in store.list()] == [("kept", "")]
