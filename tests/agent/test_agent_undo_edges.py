"""Undo and diff in a git work tree at their edges: untracked files over the snapshot limit,
a session's diff over several prompts, and an edit git's stat cache cannot tell from the file
it recorded.

Each test was checked against a one-spot mutation of the code it guards (``scripts/
mutation_sets/fresh3.py``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ds4mlx.agent import checkpoints as checkpoints_module
from ds4mlx.agent.checkpoints import CheckpointError, Checkpoints

import pytest


def git_work_tree(root: Path) -> Path:
    root.mkdir()
    (root / "tracked.txt").write_text("v0\n")
    for command in (["init", "-q"], ["add", "tracked.txt"], ["commit", "-qm", "start"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *command], cwd=root, check=True
        )
    return root


def test_untracked_files_over_the_snapshot_limit_are_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints_module, "MAX_UNTRACKED_SNAPSHOT_BYTES", 100)
    root = git_work_tree(tmp_path / "repo")
    checkpoints = Checkpoints(root)
    assert checkpoints.kind == "git"
    checkpoints.begin_prompt()
    checkpoints.before_tool(bash=True)
    (root / "weights.bin").write_bytes(b"x" * 101)  # what a bash command made
    (root / "small.txt").write_text("small\n")
    checkpoints.end_prompt()
    said = checkpoints.undo()
    assert "removed 1 file(s) it created: small.txt" in said
    assert (root / "weights.bin").exists() and not (root / "small.txt").exists()


def test_the_session_diff_in_git_starts_before_the_first_prompt(tmp_path):
    root = git_work_tree(tmp_path / "repo")
    checkpoints = Checkpoints(root)
    for version in ("v1\n", "v2\n"):
        checkpoints.begin_prompt()
        checkpoints.before_file_change(root / "tracked.txt")
        (root / "tracked.txt").write_text(version)
        checkpoints.end_prompt()
    diff = checkpoints.diff()
    assert "-v0" in diff and "+v2" in diff and "v1" not in diff


def test_a_snapshot_sees_a_same_size_edit_dated_as_the_index(tmp_path):
    # Git trusts a file whose size and times match its index entry, unless the entry is as new
    # as the index itself ("racy git"): then it hashes the file again. A snapshot's copy of the
    # index must keep that date, or it takes a same-size edit for the recorded file.
    root = tmp_path / "repo"
    root.mkdir()
    tracked, index = root / "tracked.txt", root / ".git" / "index"
    tracked.write_text("v0\n")
    tick = tracked.stat().st_mtime_ns - 10 * 10**9
    os.utime(tracked, ns=(tick, tick))
    for command in (["init", "-q"], ["add", "tracked.txt"], ["commit", "-qm", "start"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *command], cwd=root, check=True
        )
    tracked.write_text("v1\n")  # the size of v0, dated as v0 and as the index
    for path in (tracked, index):
        os.utime(path, ns=(tick, tick))
    checkpoints = Checkpoints(root)
    checkpoints.begin_prompt()
    checkpoints.before_tool(bash=True)
    tracked.write_text("v2\n")
    checkpoints.end_prompt()
    assert "-v1" in checkpoints.diff()
    checkpoints.undo()
    assert tracked.read_text() == "v1\n"


def test_a_prompt_that_changed_nothing_leaves_nothing_to_undo_in_git(tmp_path):
    """An empty checkpoint would make the next undo
    undo nothing, and the one after it the real change."""
    root = git_work_tree(tmp_path / "repo")
    checkpoints = Checkpoints(root)
    assert checkpoints.kind == "git"
    checkpoints.begin_prompt()
    checkpoints.before_file_change(root / "tracked.txt")
    (root / "tracked.txt").write_text("v1\n")
    checkpoints.end_prompt()
    checkpoints.begin_prompt()  # a prompt that only read
    checkpoints.before_tool(bash=True)
    checkpoints.end_prompt()
    said = checkpoints.undo()
    assert "restored 1 file(s)" in said and (root / "tracked.txt").read_text() == "v0\n"
    assert checkpoints.undo().startswith("nothing to undo")


def test_a_workspace_inside_a_repository_snapshots_only_itself(tmp_path):
    root = git_work_tree(tmp_path / "repo")
    (root / "app").mkdir()
    (root / "app" / "main.py").write_text("one\n")
    checkpoints = Checkpoints(root / "app")
    assert checkpoints.git.top == root and checkpoints.git.prefix == "app"
    assert Checkpoints(root).git.prefix == "."
    assert checkpoints.diff() == ""  # nothing changed yet: no session diff
    checkpoints.begin_prompt()
    checkpoints.before_tool(bash=True)
    (root / "app" / "main.py").write_text("two\n")
    (root / "tracked.txt").write_text("outside the workspace\n")
    checkpoints.end_prompt()
    diff = checkpoints.diff()
    assert "+two" in diff and "tracked.txt" not in diff
    assert checkpoints.undo() == ("restored 1 file(s) as they were before the last change: main.py")
    assert (root / "app" / "main.py").read_text() == "one\n"
    assert (root / "tracked.txt").read_text() == "outside the workspace\n"


def test_a_failing_git_command_says_which_and_why(tmp_path):
    root = git_work_tree(tmp_path / "repo")
    git = Checkpoints(root).git
    with pytest.raises(CheckpointError, match=r"^git cat-file: fatal: Not a valid object name"):
        git.run("cat-file", "-p", "0" * 40)
    assert git.run("rev-parse", "--is-inside-work-tree") == "true\n"


def test_a_file_that_cannot_be_read_is_not_small():
    assert not checkpoints_module._small(Path("/nonexistent/ds4-agent/file"))


def test_nothing_to_undo_names_a_failed_snapshot(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    assert checkpoints.undo() == "nothing to undo: no prompt of this session changed files"
    checkpoints.problem = "git add: disk full"
    assert checkpoints.undo() == (
        "nothing to undo: no prompt of this session changed files"
        " (a snapshot failed: git add: disk full)"
    )


def test_the_manifest_before_bash_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints_module, "MAX_MANIFEST_ENTRIES", 3)
    for name in "abcd":
        (tmp_path / name).write_text(name)
    manifest = Checkpoints(tmp_path)._manifest()
    assert sorted(path.name for path in manifest) == ["a", "b", "c"]
    assert manifest[tmp_path / "a"] == (1, (tmp_path / "a").stat().st_mtime_ns)


def test_undo_keeps_a_created_folder_that_holds_other_files(tmp_path):
    (tmp_path / "old.txt").write_text("old\n")
    checkpoints = Checkpoints(tmp_path)
    checkpoints.begin_prompt()
    checkpoints.before_file_change(tmp_path / "old.txt")
    (tmp_path / "old.txt").write_text("new\n")
    checkpoints.before_file_change(tmp_path / "new" / "made.txt")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "made.txt").write_text("by the agent\n")
    (tmp_path / "new" / "mine.txt").write_text("by the user meanwhile\n")
    checkpoints.end_prompt()
    assert checkpoints.undo() == (
        "restored 1 file(s) as they were before the last change: old.txt; "
        "removed 1 file(s) it created: new/made.txt"
    )
    assert (tmp_path / "new" / "mine.txt").exists()


def test_undo_of_a_change_already_reverted_says_so(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    checkpoints.begin_prompt()
    checkpoints.before_tool(bash=True)
    (tmp_path / "made.txt").write_text("x")
    checkpoints.end_prompt()
    checkpoints.stack[-1].originals.clear()  # as if the agent had removed it again itself
    assert checkpoints.undo() == "the last change left no file to put back"
