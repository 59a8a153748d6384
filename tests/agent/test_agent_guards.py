"""The agent's guards at their edges: confinement beside a look-alike sibling folder, prefix
rules against every way of chaining a second command, bounded output around its kept tail, the
head/tail split of long results, undo of a file edited twice in one prompt, name lengths at
the limit, .gitignore negations, files bash deleted without git, and the prompt history file.

Each test here was checked against a one-character mutation of the code it guards (see
``scripts/mutation_run.py``, the ``agent_*`` mutations).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ds4mlx.agent import jobs
from ds4mlx.agent.checkpoints import Checkpoints
from ds4mlx.agent.permissions import Decision, Permissions, Rule, command_prefix, rule_for
from ds4mlx.agent.prompt_input import MAX_HISTORY, PromptHistory
from ds4mlx.agent.tools import ToolBox, _clip
from ds4mlx.agent.workspace import PathRefused, Workspace
from ds4mlx.engine.chat import ToolCall

import pytest
from hypothesis import given
from hypothesis import strategies as st

# ------------------------------------------------------------------ confinement


@pytest.fixture
def lookalike(tmp_path: Path) -> Path:
    """``ws`` with links into ``ws-secrets``: a sibling whose name starts with the workspace's
    (a string prefix test on the paths would take it for the inside)."""
    root, secrets = tmp_path / "ws", tmp_path / "ws-secrets"
    root.mkdir()
    secrets.mkdir()
    (secrets / "key.txt").write_text("top secret\n")
    (root / "link").symlink_to(secrets)
    (root / "file_link").symlink_to(secrets / "key.txt")
    (root / "plain.txt").write_text("visible\n")
    return root


@pytest.mark.parametrize("path", ["link", "link/key.txt", "file_link"])
def test_a_link_into_a_lookalike_sibling_is_refused(lookalike, path):
    with pytest.raises(PathRefused, match="symbolic link"):
        Workspace(lookalike).resolve(path)


def test_listing_and_reading_never_reach_the_lookalike_sibling(lookalike):
    box = ToolBox(Workspace(lookalike))
    try:
        listing = box.run(ToolCall("list", {"path": "."})).output
        assert "plain.txt" in listing and "link" not in listing
        found = box.run(ToolCall("search", {"pattern": "secret"})).output
        assert "top secret" not in found
        read = box.run(ToolCall("read", {"path": "file_link"}))
        assert read.is_error and "top secret" not in read.output
    finally:
        box.close()


# ------------------------------------------------------------------ permission prefix rules

GIT_DIFF = Rule("bash", prefix="git diff")

# A second command, or a redirection, after an allowed prefix: never covered by the rule.
CHAINED = [
    "git diff ;touch X",
    "git diff ; rm x",
    "git diff;rm x",
    "git diff | sh",
    "git diff|sh",
    "git diff && x",
    "git diff || x",
    "git diff & rm x",
    "git diff &",
    "git diff\nrm x",
    "git diff\rrm x",
    "git diff > out.txt",
    "git diff >> out.txt",
    "git diff 2> err",
    "git diff < in",
    "git diff $(rm x)",
    "git diff `rm x`",
    "git diff ${HOME}",
    "git diff $HOME",  # an expansion: the words run are not the words the rule saw
    "git diff {a,b}",
    "git diff *",
    "git diff ?",
    "git diff [ab]",
    "git diff ~",
    "git diff !!",
    "git diff # hidden",
    "git diff \\; rm x",
]


def bash(command: str) -> ToolCall:
    return ToolCall("bash", {"command": command})


@pytest.mark.parametrize("command", CHAINED)
def test_a_prefix_rule_never_covers_a_chained_command(command):
    assert not GIT_DIFF.allows(bash(command))
    permissions = Permissions()
    permissions.record(bash("git diff --stat"), Decision.ALLOW_PREFIX)
    assert permissions.must_ask(bash(command))
    # Nor does answering "prefix" for such a command create a rule.
    assert command_prefix(command) is None


SHELL_OPERATORS = [";", "|", "||", "&", "&&", "\n", ">", ">>", "<", "2>", "$(", "`", "(", "$"]
words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_./=", min_size=1, max_size=8)


@given(
    operator=st.sampled_from(SHELL_OPERATORS),
    before=st.sampled_from(["", " ", "  ", "\t"]),
    after=st.sampled_from(["", " ", "\t"]),
    arguments=st.lists(words, max_size=2),
    second=st.lists(words, min_size=1, max_size=3),
)
def test_no_spelling_of_a_second_command_passes_a_prefix_rule(
    operator, before, after, arguments, second
):
    command = " ".join(["git", "diff", *arguments]) + before + operator + after + " ".join(second)
    assert not GIT_DIFF.allows(bash(command))


@given(arguments=st.lists(words, max_size=4))
def test_a_simple_command_with_the_prefix_is_allowed(arguments):
    assert GIT_DIFF.allows(bash(shlex.join(["git", "diff", *arguments])))


@pytest.mark.parametrize(
    ("command", "allowed"),
    [
        ("git diff", True),
        ("  git diff --stat  ", True),
        ("git difftool", False),  # words are compared, not characters
        ("git", False),
        ("git log", False),
        ("gitdiff", False),
        ("", False),
    ],
)
def test_a_prefix_matches_whole_words(command, allowed):
    assert GIT_DIFF.allows(bash(command)) is allowed


def test_the_prefix_an_answer_records():
    assert command_prefix("git diff --stat src") == "git diff"
    assert command_prefix("python -m pytest -q tests") == "python -m pytest"
    assert command_prefix("git diff") is None  # its own prefix: "always" covers it
    assert rule_for(bash("git diff --stat"), Decision.ALLOW_PREFIX) == GIT_DIFF
    assert rule_for(bash("ls; rm x"), Decision.ALLOW_PREFIX) is None
    exact = rule_for(bash(" ls -l "), Decision.ALLOW_ALWAYS)
    assert exact == Rule("bash", command="ls -l")
    assert exact.allows(bash("ls -l")) and not exact.allows(bash("ls -l; rm x"))
    assert not exact.allows(bash("ls -la"))
    # A rule for one tool never covers another.
    assert not Rule("write").allows(ToolCall("edit", {"path": "x"}))
    assert rule_for(ToolCall("write", {"path": "x"}), Decision.ALLOW_ONCE) is None
    assert rule_for(ToolCall("write", {"path": "x"}), Decision.DENY) is None


@pytest.mark.parametrize("tool", ["write", "edit", "bash"])
def test_tools_that_change_files_or_run_commands_ask_first(tool):
    call = ToolCall(tool, {"path": "x", "content": "x", "command": "ls"})
    assert Permissions().must_ask(call)
    assert not Permissions(yolo=True).must_ask(call)


@pytest.mark.parametrize("tool", ["list", "read", "more", "search", "status", "stop", "symbols"])
def test_tools_that_only_look_never_ask(tool):
    assert not Permissions().must_ask(ToolCall(tool, {"path": "x"}))


# ------------------------------------------------------------------ bounded output


def flooded(head: int = 4, tail: int = 8) -> jobs.BoundedOutput:
    """A stream of 40 bytes whose first ``head`` and last ``tail`` are kept."""
    output = jobs.BoundedOutput(head_limit=head, tail_limit=tail)
    output.append(b"HEAD" + b"-" * 28 + b"tail+end")
    return output


@pytest.mark.parametrize("back", [1, 2, 10])
def test_reading_from_shortly_before_the_kept_tail_returns_the_whole_tail(back):
    output = flooded()
    tail_start = output.total - 8
    text, position = output.text_since(tail_start - back)
    assert text == f"\n[... {back} bytes omitted ...]\ntail+end" and position == 40


def test_reading_from_inside_the_tail_returns_the_rest_of_it():
    output = flooded()
    assert output.text_since(40 - 3) == ("end", 40)
    assert output.text_since(40) == ("", 40)
    assert output.text_since(2) == ("AD\n[... 28 bytes omitted ...]\ntail+end", 40)


def test_the_kept_bytes_are_the_first_and_the_last():
    output = jobs.BoundedOutput(head_limit=4, tail_limit=8)
    for chunk in (b"HE", b"AD--", b"-" * 26, b"tail", b"+end"):
        output.append(chunk)
    assert bytes(output.head) == b"HEAD" and bytes(output.tail) == b"tail+end"
    assert output.total == 40 and output.stored == 12 and output.overflowing


def test_the_tail_is_not_overflowing_until_full():
    output = jobs.BoundedOutput(head_limit=2, tail_limit=4)
    output.append(b"ab" + b"xyz")
    assert not output.overflowing
    output.append(b"w")
    assert output.overflowing


def test_a_limited_read_keeps_a_third_from_the_start_and_the_rest_from_the_end():
    output = jobs.BoundedOutput(head_limit=30, tail_limit=30)
    output.append(bytes(range(65, 65 + 26)) + b"." * 100 + bytes(range(97, 97 + 26)))
    text, _ = output.text_since(0, limit=12)
    first, _, last = text.partition("\n[... ")
    assert first == "ABCD" and last.endswith("\nstuvwxyz")
    assert "[... 140 bytes omitted ...]" in text


def test_a_limited_read_gives_the_start_what_the_end_leaves():
    # 10 bytes of head and 5 of tail fit in 12: the tail whole, 7 bytes of the head.
    output = jobs.BoundedOutput(head_limit=10, tail_limit=5)
    output.append(b"0123456789abcde")
    assert output.text_since(0, limit=12) == ("0123456\n[... 3 bytes omitted ...]\nabcde", 15)


# ------------------------------------------------------------------ long tool results


def test_a_long_result_keeps_a_third_from_the_start_and_the_rest_from_the_end():
    text = "".join(f"{i:03d}\n" for i in range(300))  # 1200 characters
    clipped = _clip(text, 120)
    head, cut, tail = clipped.split("\n[... ")[0], clipped, clipped.rsplit("...]\n", 1)[1]
    assert text.startswith(head) and len(head) == 40
    assert text.endswith(tail) and len(tail) == 80
    assert f"[... {1200 - 120} characters cut ...]" in cut
    assert _clip(text, 1200) == text


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_a_tiny_limit_never_returns_more_than_the_text(limit):
    clipped = _clip("abcdefghij", limit)
    kept = clipped.replace(f"\n[... {10 - limit} characters cut ...]\n", "")
    assert len(kept) == limit and kept.endswith("j")


# ------------------------------------------------------------------ undo without git


def test_two_edits_in_one_prompt_undo_to_the_content_before_the_prompt(tmp_path):
    root = tmp_path / "plain"
    root.mkdir()
    target = root / "notes.txt"
    target.write_text("original\n")
    checkpoints = Checkpoints(root)
    assert checkpoints.kind == "files"
    checkpoints.begin_prompt()
    for version in ("middle\n", "final\n"):
        checkpoints.before_file_change(target)
        target.write_text(version)
    created = root / "new.txt"
    for version in ("one\n", "two\n"):
        checkpoints.before_file_change(created)
        created.write_text(version)
    checkpoints.end_prompt()
    diff = checkpoints.diff()
    assert "-original" in diff and "+final" in diff and "middle" not in diff
    said = checkpoints.undo()
    assert "restored 1 file(s)" in said and "removed 1 file(s) it created: new.txt" in said
    assert target.read_text() == "original\n" and not created.exists()
    assert "nothing to undo" in checkpoints.undo()


def test_the_diff_without_git_names_an_empty_file_created_or_removed(tmp_path):
    """An empty file has no lines for a unified diff: the diff says what happened to it
    (fresh6's checkpoints_created_empty_file_called_removed)."""
    root = tmp_path / "plain"
    root.mkdir()
    doomed = root / "doomed.txt"
    doomed.touch()
    checkpoints = Checkpoints(root)
    checkpoints.begin_prompt()
    checkpoints.before_file_change(root / "made.txt")
    (root / "made.txt").touch()
    checkpoints.before_file_change(doomed)
    doomed.unlink()
    checkpoints.end_prompt()
    assert checkpoints.diff().splitlines() == [
        "--- a/doomed.txt",
        "+++ b/doomed.txt",
        "(empty file removed)",
        "--- a/made.txt",
        "+++ b/made.txt",
        "(empty file created)",
    ]


def test_undo_goes_back_one_prompt_at_a_time(tmp_path):
    root = tmp_path / "plain"
    root.mkdir()
    target = root / "notes.txt"
    target.write_text("v0\n")
    checkpoints = Checkpoints(root)
    for version in ("v1\n", "v2\n"):
        checkpoints.begin_prompt()
        checkpoints.before_file_change(target)
        target.write_text(version)
        checkpoints.end_prompt()
    checkpoints.begin_prompt()
    checkpoints.end_prompt()  # changed nothing: no checkpoint
    checkpoints.undo()
    assert target.read_text() == "v1\n"
    # The session diff still starts from before the first prompt.
    assert "-v0" in checkpoints.diff()
    checkpoints.undo()
    assert target.read_text() == "v0\n"


@pytest.mark.parametrize(("name_bytes", "refused"), [(255, False), (256, True)])
def test_a_name_may_use_every_byte_of_the_limit(tmp_path, name_bytes, refused):
    # Bytes, not characters: "é" is two of them.
    name = "é" * (name_bytes // 2) + "x" * (name_bytes % 2)
    workspace = Workspace(tmp_path)
    if refused:
        with pytest.raises(PathRefused, match="longer than 255 bytes"):
            workspace.resolve(f"sub/{name}")
    else:
        assert workspace.resolve(f"sub/{name}") == workspace.root / "sub" / name


def test_a_deeper_gitignore_can_bring_back_what_a_higher_one_ignores(tmp_path):
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".gitignore").write_text("!keep.log\n")
    for path in ("top.log", "sub/keep.log", "sub/drop.log"):
        (tmp_path / path).write_text("x\n")
    workspace = Workspace(tmp_path)
    listed = {workspace.relative(path) for path, _ in workspace.walk(workspace.root)}
    assert "sub/keep.log" in listed
    assert not listed & {"top.log", "sub/drop.log"}


def test_a_file_bash_deleted_without_git_is_named_as_beyond_undo(tmp_path):
    root = tmp_path / "plain"
    root.mkdir()
    (root / "kept.txt").write_text("kept\n")
    (root / "gone.txt").write_text("gone\n")
    checkpoints = Checkpoints(root)
    checkpoints.begin_prompt()
    checkpoints.before_tool(bash=True)
    (root / "gone.txt").unlink()  # what a bash command did
    checkpoints.end_prompt()
    said = checkpoints.undo()
    assert "not restored" in said and "gone.txt" in said and "kept.txt" not in said


def test_the_prompt_history_is_private_and_keeps_the_newest_prompts(tmp_path):
    path = tmp_path / "data" / "history.jsonl"
    history = PromptHistory(path)
    for index in range(MAX_HISTORY + 3):
        history.add(f"prompt {index}")
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    again = PromptHistory(path).entries
    assert len(again) == MAX_HISTORY
    assert (again[0], again[-1]) == ("prompt 3", f"prompt {MAX_HISTORY + 2}")
