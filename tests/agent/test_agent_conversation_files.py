"""Saved conversations on disk: the file's form, names, where they go, what delete removes."""

from __future__ import annotations

import json
import os
import time

from ds4mlx.agent.conversations import (
    STATE_SUFFIX,
    Conversation,
    ConversationError,
    ConversationStore,
    SavedConversation,
    default_name,
)

import pytest

MESSAGES = [{"role": "user", "content": "café ☕"}]


def test_a_saved_file_is_version_1_utf8_json(tmp_path):
    store = ConversationStore(tmp_path / "deep" / "er")  # made with its parents
    store.save(Conversation(messages=MESSAGES, workspace="/w"), "talk")
    raw = (tmp_path / "deep" / "er" / "talk.json").read_bytes()
    assert "café ☕".encode() in raw  # written as text, not \\u escapes
    data = json.loads(raw)
    assert data["version"] == 1 and data["name"] == "talk" and data["workspace"] == "/w"
    assert store.load("talk").messages == MESSAGES


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("a", True),
        ("9.b_c-d", True),
        ("a" * 100, True),
        ("a" * 101, False),
        (".hidden", False),
        ("-x", False),
        ("_x", False),
        ("a/b", False),
        ("a b", False),
        ("", False),
    ],
)
def test_names_are_letters_digits_dot_dash_underscore(tmp_path, name, valid):
    store = ConversationStore(tmp_path)
    if valid:
        assert store.save(Conversation(messages=MESSAGES), name) == name
        assert (tmp_path / f"{name}.json").is_file()
    else:
        with pytest.raises(ConversationError, match="is not a valid name"):
            store.load(name)


def test_delete_removes_the_conversation_and_its_state(tmp_path):
    store = ConversationStore(tmp_path)
    store.save(Conversation(messages=MESSAGES), "talk")
    (tmp_path / f"talk{STATE_SUFFIX}").write_bytes(b"state")
    (tmp_path / f"other{STATE_SUFFIX}").write_bytes(b"state")
    store.delete("talk")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"other{STATE_SUFFIX}"]
    with pytest.raises(ConversationError, match="no saved conversation named 'talk'"):
        store.delete("talk")
    store.save(Conversation(messages=MESSAGES), "stateless")
    store.delete("stateless")  # no saved model state beside it: nothing else to remove
    assert not (tmp_path / "stateless.json").exists()


def test_list_is_newest_first_and_latest_matches_the_workspace(tmp_path):
    store = ConversationStore(tmp_path)
    for number, name in enumerate(["old", "mid", "new"]):
        store.save(Conversation(messages=MESSAGES, workspace="/a" if name != "new" else "/b"), name)
        data = json.loads((tmp_path / f"{name}.json").read_text())
        data["saved"] = 1000.0 + number
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    assert [saved.name for saved in store.list()] == ["new", "mid", "old"]
    assert store.latest("/a").name == "mid" and store.latest("/b").name == "new"
    with pytest.raises(ConversationError, match="no saved conversation for /c"):
        store.latest("/c")


def test_an_unreadable_file_is_listed_with_its_problem_and_skipped_by_latest(tmp_path):
    store = ConversationStore(tmp_path)
    store.save(Conversation(messages=MESSAGES, workspace="/a"), "good")
    (tmp_path / "bad.json").write_text('{"messages": [{"content": "no role"}]}')
    problems = {saved.name: saved.problem for saved in store.list()}
    assert problems["good"] == "" and "no message list" in problems["bad"]
    assert store.latest("/a").name == "good"


@pytest.mark.parametrize(
    ("messages", "empty"),
    [
        ([], True),
        ([{"role": "system", "content": "s"}], True),
        ([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}], False),
        ([{"role": "tool", "content": "t"}], False),
    ],
)
def test_only_system_messages_make_an_empty_conversation(messages, empty):
    assert Conversation(messages=messages).is_empty is empty


def test_load_gives_the_files_creation_time_and_workspace(tmp_path):
    (tmp_path / "old.json").write_text(
        json.dumps({"created": 12.5, "workspace": "/w", "messages": MESSAGES})
    )
    loaded = ConversationStore(tmp_path).load("old")
    assert (loaded.name, loaded.created, loaded.workspace) == ("old", 12.5, "/w")
    assert loaded.messages == MESSAGES


def test_list_counts_the_messages_and_takes_the_saved_time(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"saved": 7.0, "messages": MESSAGES * 3}))
    [saved] = ConversationStore(tmp_path).list()
    assert saved == SavedConversation("a", 3, 7.0, "", None)


@pytest.mark.parametrize(
    "content",
    [
        '{"messages": [{"role": 1}]}',
        '{"messages": "hi"}',
        '[{"role": "user"}]',
        "{not json",
        b"\xff\xfe",
    ],
    ids=["role-not-text", "not-a-list", "not-an-object", "bad-json", "not-utf8"],
)
def test_a_file_that_is_no_conversation_cannot_be_loaded(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConversationError, match=r"bad\.json (cannot be read|is not a ds4-agent)"):
        ConversationStore(tmp_path).load("bad")
    [listed] = ConversationStore(tmp_path).list()
    assert (listed.name, listed.messages) == ("bad", 0) and listed.problem


def test_missing_conversations_are_named_in_the_error(tmp_path):
    store = ConversationStore(tmp_path)
    with pytest.raises(ConversationError, match=r"^no saved conversation named 'gone'$"):
        store.load("gone")
    with pytest.raises(ConversationError, match=r"^no saved conversation named 'gone'$"):
        store.delete("gone")
    with pytest.raises(ConversationError, match=rf"^no saved conversation for /w in {tmp_path}$"):
        store.latest("/w")


def test_a_stale_temporary_counts_once_removed(tmp_path):
    store = ConversationStore(tmp_path)
    for name in (".a.1.tmp", ".b.2.tmp.safetensors"):
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (0, 0))
    assert store.remove_stale_temporaries() == 2
    assert list(tmp_path.iterdir()) == []
    assert ConversationStore(tmp_path / "none").remove_stale_temporaries() == 0


def test_the_default_name_is_the_local_time():
    assert default_name(time.mktime((2026, 3, 4, 17, 6, 7, 0, 0, -1))) == "chat-20260304-170607"


@pytest.mark.parametrize(
    "messages",
    [[{"role": "user", "content": "hi"}, "stray"], [{"role": "user"}, {"content": "no role"}]],
)
def test_one_malformed_message_makes_a_file_no_conversation(tmp_path, messages):
    store = ConversationStore(tmp_path)
    (tmp_path / "talk.json").write_text(json.dumps({"messages": messages}), encoding="utf-8")
    with pytest.raises(ConversationError, match="is not a ds4-agent conversation"):
        store.load("talk")
