"""Saved conversations on disk: the file's form, names, where they go, what delete removes."""

from __future__ import annotations

import json

from ds4mlx.agent.conversations import (
    STATE_SUFFIX,
    Conversation,
    ConversationError,
    ConversationStore,
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
