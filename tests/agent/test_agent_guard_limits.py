"""The agent's guards at the edges the fourth fresh mutation run found untested (issue 37,
``scripts/mutation_sets/fresh4.py``): paths at the length limit, the mode of a new file,
@path mentions (the cut marker's line, punctuation around them, hidden names on Tab),
compaction's kept tail and summary, conversation names at their length limit, and undo in
both modes (a file at the snapshot limit, two commands in one prompt, an edit after a command,
the session diff at its line limit).

Each test was checked against the mutation it is named after in that set.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ds4mlx.agent import checkpoints as checkpoints_module
from ds4mlx.agent.checkpoints import MAX_DIFF_LINES, Checkpoints
from ds4mlx.agent.compaction import (
    SUMMARY_HEADER,
    Budgets,
    assemble,
    plan_compaction,
    summary_message,
)
from ds4mlx.agent.conversations import Conversation, ConversationError, ConversationStore
from ds4mlx.agent.mentions import (
    MAX_ATTACHED_CHARS,
    attach_mentions,
    complete_mention,
    mentioned_paths,
)
from ds4mlx.agent.tools import ToolBox
from ds4mlx.agent.workspace import MAX_PATH_CHARS, PathRefused, Workspace
from ds4mlx.engine.chat import ToolCall

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_agent_undo_edges import git_work_tree


def _path_of(length: int) -> str:
    """A relative path of exactly ``length`` characters (names of 99 to 199 characters)."""
    folders = length // 100 - 1
    return ("a" * 99 + "/") * folders + "b" * (length - 100 * folders)


@pytest.mark.parametrize("length", [MAX_PATH_CHARS - 1, MAX_PATH_CHARS])
def test_a_path_up_to_the_length_limit_is_a_workspace_path(tmp_path: Path, length: int):
    path = _path_of(length)
    assert len(path) == length
    assert Workspace(tmp_path).resolve(path) == tmp_path.resolve() / path


def test_a_path_past_the_length_limit_is_refused(tmp_path: Path):
    with pytest.raises(PathRefused, match="longer than"):
        Workspace(tmp_path).resolve(_path_of(MAX_PATH_CHARS + 1))


# ------------------------------------------------------------------ file modes


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_a_written_new_file_gets_the_mode_a_plain_open_gives_it(tmp_path: Path, umask_022):
    box = ToolBox(Workspace(tmp_path))
    try:
        result = box.run(ToolCall("write", {"path": "new/script.sh", "content": "echo hi\n"}))
    finally:
        box.close()
    assert not result.is_error, result.output
    assert stat.S_IMODE((tmp_path / "new" / "script.sh").stat().st_mode) == 0o644


# ------------------------------------------------------------------ @path mentions


def test_a_cut_mention_names_the_first_line_it_did_not_show(tmp_path: Path):
    line = "123456789\n"  # MAX_ATTACHED_CHARS is a whole number of these lines
    assert MAX_ATTACHED_CHARS % len(line) == 0
    shown = MAX_ATTACHED_CHARS // len(line)
    (tmp_path / "big.txt").write_text(line * (shown + 50))
    result = attach_mentions("look at @big.txt", Workspace(tmp_path))
    assert f"read it from line {shown + 1} for the rest" in result.message
    assert result.message.count(line) == shown


# What ends a sentence after a mention, spelled out here (not read from the module).
SENTENCE_ENDS = ".,;:!?)]}\"'"


@given(st.sampled_from(list(SENTENCE_ENDS)), st.sampled_from(["", "(", "[", "{", '"', "'"]))
def test_punctuation_around_a_mention_is_not_part_of_the_path(end: str, opening: str):
    assert mentioned_paths(f"see {opening}@src/a.py{end} now") == ["src/a.py"]


def test_tab_offers_hidden_names_only_once_a_dot_is_typed(tmp_path: Path):
    (tmp_path / ".env").write_text("SECRET=1\n")
    (tmp_path / ".github").mkdir()
    (tmp_path / "envoy.py").write_text("")
    workspace = Workspace(tmp_path)
    assert complete_mention("read @", workspace) == "envoy.py"
    assert complete_mention("read @e", workspace) == "nvoy.py"
    assert complete_mention("read @.", workspace) is None  # .env and .github/ share only "."
    assert complete_mention("read @.g", workspace) == "ithub/"


# ------------------------------------------------------------------ compaction


def _tokens(message: dict) -> int:
    return len(str(message.get("content") or "")) // 4 + 1


def _turn(request: str, size: int = 40) -> list[dict]:
    """A user request, the assistant's call, its tool result of ``size`` characters, and the
    answer."""
    call = {"function": {"name": "read", "arguments": {"path": "a.py"}}}
    return [
        {"role": "user", "content": request},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "x" * size},
        {"role": "assistant", "content": f"done with {request}"},
    ]


SYSTEM = {"role": "system", "content": "be brief"}


def test_the_last_message_is_kept_however_large():
    huge = {"role": "user", "content": "y" * 100_000}
    plan = plan_compaction([SYSTEM, *_turn("first"), huge], Budgets(64, 64, 64), _tokens)
    assert plan.tail == [huge] and plan.task is None
    assert plan.older == _turn("first")


@given(st.integers(1, 6), st.integers(0, 3000), st.integers(32, 400))
def test_the_kept_tail_never_opens_with_a_tool_result(turns: int, size: int, budget: int):
    messages = [SYSTEM] + [m for n in range(turns) for m in _turn(f"request {n}", size)]
    plan = plan_compaction(messages, Budgets(budget, budget, budget), _tokens)
    assert plan.tail and plan.tail[0]["role"] != "tool"
    kept = 0 if plan.task is None else 1
    assert len(plan.older) + kept + len(plan.tail) == len(messages) - 1


def test_a_task_that_opens_the_tail_is_not_repeated():
    messages = [SYSTEM, *_turn("first"), *_turn("second")]
    plan = plan_compaction(messages, Budgets(64, 20, 64), _tokens)  # the last turn fits
    assert plan.tail[0] == {"role": "user", "content": "second"}
    assert plan.task is None
    assembled = assemble(plan, summary_message("s", plan.older, ""))
    assert [m["content"] for m in assembled].count("second") == 1


def test_an_earlier_summary_is_not_listed_as_a_user_request():
    older = [
        {"role": "user", "content": f"{SUMMARY_HEADER}\n\nwhat happened before"},
        {"role": "user", "content": "fix the bug"},
    ]
    content = summary_message("the summary", older, "")["content"]
    assert "- fix the bug" in content
    assert "- " + SUMMARY_HEADER not in content


# ------------------------------------------------------------------ conversations


def test_a_conversation_name_may_have_100_characters_not_101(tmp_path: Path):
    store = ConversationStore(tmp_path)
    longest = "c" * 100
    assert store.save(Conversation([{"role": "user", "content": "hi"}]), longest) == longest
    assert store.load(longest).messages == [{"role": "user", "content": "hi"}]
    with pytest.raises(ConversationError, match="not a valid name"):
        store.save(Conversation([{"role": "user", "content": "hi"}]), "c" * 101)


# ------------------------------------------------------------------ undo and diff


def test_an_untracked_file_of_exactly_the_snapshot_limit_is_restored(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints_module, "MAX_UNTRACKED_SNAPSHOT_BYTES", 100)
    root = git_work_tree(tmp_path / "repo")
    (root / "data.bin").write_bytes(b"a" * 100)
    checkpoints = Checkpoints(root)
    checkpoints.begin_prompt()
    checkpoints.before_tool(bash=True)
    (root / "data.bin").write_bytes(b"b" * 100)  # what a bash command did
    checkpoints.end_prompt()
    assert "data.bin" in checkpoints.undo()
    assert (root / "data.bin").read_bytes() == b"a" * 100


def test_files_two_commands_made_in_one_prompt_are_both_undone(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    assert checkpoints.kind == "files"
    checkpoints.begin_prompt()
    checkpoints.before_tool(bash=True)
    (tmp_path / "first.txt").write_text("made by the first command\n")
    checkpoints.before_tool(bash=True)
    (tmp_path / "second.txt").write_text("made by the second command\n")
    checkpoints.end_prompt()
    said = checkpoints.undo()
    assert "removed 2 file(s) it created: first.txt, second.txt" in said
    assert not (tmp_path / "first.txt").exists() and not (tmp_path / "second.txt").exists()


def test_a_file_edited_after_a_command_is_restored_not_named_beyond_undo(tmp_path):
    edited = tmp_path / "notes.txt"
    edited.write_text("before\n")
    checkpoints = Checkpoints(tmp_path)
    checkpoints.begin_prompt()
    checkpoints.before_tool(bash=True)
    checkpoints.before_file_change(edited)
    edited.write_text("after the edit, longer\n")
    checkpoints.end_prompt()
    said = checkpoints.undo()
    assert "restored 1 file(s)" in said and "not restored" not in said
    assert edited.read_text() == "before\n"


@pytest.mark.parametrize("lines", [MAX_DIFF_LINES - 3, MAX_DIFF_LINES - 2])
def test_the_session_diff_is_clipped_only_past_its_line_limit(tmp_path, lines: int):
    # A new file's diff: two file lines, one hunk line, then one line per line of the file.
    created = tmp_path / "new.txt"
    checkpoints = Checkpoints(tmp_path)
    checkpoints.begin_prompt()
    checkpoints.before_file_change(created)
    created.write_text("".join(f"line {n}\n" for n in range(lines)))
    checkpoints.end_prompt()
    diff = checkpoints.diff().splitlines()
    if lines + 3 <= MAX_DIFF_LINES:
        assert len(diff) == lines + 3 and diff[-1] == f"+line {lines - 1}"
    else:
        assert len(diff) == MAX_DIFF_LINES + 1 and diff[-1] == "... 1 more lines"
