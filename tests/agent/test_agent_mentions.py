"""``@path`` mentions called directly: what is attached, how it is counted and cut, what is
refused and why, and what Tab completes."""

from __future__ import annotations

import errno
from pathlib import Path

from ds4mlx.agent import mentions
from ds4mlx.agent.mentions import MAX_ATTACHED_CHARS, attach_mentions, complete_mention
from ds4mlx.agent.workspace import Workspace

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    return root


def attach(root: Path, prompt: str):
    return attach_mentions(prompt, Workspace(root))


def test_two_files_are_appended_in_order_each_in_its_block(root):
    (root / "a.txt").write_text("one\n")
    (root / "src" / "b.py").write_text("x = 1\ny = 2")  # no newline at the end
    result = attach(root, "see @a.txt and @src/b.py")
    assert result.message == (
        "see @a.txt and @src/b.py\n\n"
        '<file path="a.txt">\none\n</file>\n\n'
        '<file path="src/b.py">\nx = 1\ny = 2\n</file>'
    )
    assert result.attached == ["a.txt (1 line)", "src/b.py (2 lines)"]
    assert result.refused == []


def test_an_empty_file_has_no_lines(root):
    (root / "empty.txt").write_text("")
    assert attach(root, "@empty.txt").attached == ["empty.txt (0 lines)"]


def test_a_prompt_without_files_is_left_alone(root):
    result = attach(root, "@missing.txt please")
    assert result.message == "@missing.txt please"
    assert result.refused == ["@missing.txt: no such file in the workspace"]
    assert result.attached == []


def test_a_folder_is_refused(root):
    assert attach(root, "@src").refused == ["@src: is a folder; mention files"]


def test_an_unreadable_file_gives_its_error(root, monkeypatch):
    (root / "locked.txt").write_text("x")

    def refuse(path, limit, shown):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(mentions, "read_regular", refuse)
    assert attach(root, "@locked.txt").refused == ["@locked.txt: Permission denied"]


def test_a_nul_in_the_first_8_kib_makes_the_file_binary(root):
    (root / "head.bin").write_bytes(b"x" * 8191 + b"\x00")
    (root / "tail.txt").write_bytes(b"x" * 8192 + b"\x00")
    result = attach(root, "@head.bin @tail.txt")
    assert result.refused == ["@head.bin: a binary file"]
    assert result.attached == ["tail.txt (1 line)"]


def test_a_file_of_exactly_the_limit_is_whole_and_one_more_is_cut(root):
    (root / "exact.txt").write_text("x" * MAX_ATTACHED_CHARS)
    (root / "over.txt").write_text("x" * MAX_ATTACHED_CHARS + "\nmore")
    result = attach(root, "@exact.txt @over.txt")
    assert result.attached == [
        "exact.txt (1 line)",
        f"over.txt (2 lines, cut to {MAX_ATTACHED_CHARS} characters)",
    ]
    assert "x" * MAX_ATTACHED_CHARS + "\n</file>" in result.message
    assert result.message.endswith(
        "x" * MAX_ATTACHED_CHARS
        + "\n[... cut: over.txt goes on; read it from line 1 for the rest ...]\n</file>"
    )


@pytest.fixture
def names(root: Path) -> Workspace:
    for name in ("alpha.py", "alpine.py", "beta.py"):
        (root / "src" / name).write_text("")
    return Workspace(root)


@pytest.mark.parametrize(
    ("typed", "completion"),
    [
        ("read @src/al", "p"),  # alpha.py and alpine.py share "alp"
        ("read @src/alpi", "ne.py"),
        ("@src/b", "eta.py"),  # at the very start of the prompt
        ("read @s", "rc/"),  # a folder gets its slash
        ("read @src/alpha.py", None),  # nothing left to add
        ("read @src/z", None),  # no match
        ("read @src/eta", None),  # a name's middle is no match
        ("read @nowhere/a", None),  # no such folder
        ("mail a@src/b", None),  # not a mention
        ("read src/b", None),  # no @ at all
        ("read @src/beta.py now", None),  # the cursor is past the mention
    ],
)
def test_tab_completes_what_the_matches_share(names, typed, completion):
    assert complete_mention(typed, names) == completion
