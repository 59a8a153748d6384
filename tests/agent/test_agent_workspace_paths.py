"""Workspace.resolve's limits at their literal values, and its quiet cases."""

from __future__ import annotations

from ds4mlx.agent.workspace import PathRefused, Workspace

import pytest


def path_of(length: int) -> str:
    """A relative path of ``length`` characters in names of at most 200."""
    parts, left = [], length
    while left > 0:
        take = min(200, left)
        parts.append("d" * take)
        left -= take + 1  # the separator
    text = "/".join(parts)
    return text[:length]


@pytest.mark.parametrize(("length", "refused"), [(1023, False), (1024, False), (1025, True)])
def test_paths_up_to_1024_characters_are_accepted(tmp_path, length, refused):
    text = path_of(length)
    assert len(text) == length
    if refused:
        with pytest.raises(PathRefused, match="longer than 1024 characters"):
            Workspace(tmp_path).resolve(text)
    else:
        assert Workspace(tmp_path).resolve(text) == tmp_path.resolve() / text


@pytest.mark.parametrize(("name_bytes", "refused"), [(255, False), (256, True)])
def test_names_up_to_255_bytes_are_accepted(tmp_path, name_bytes, refused):
    name = "é" * (name_bytes // 2) + "x" * (name_bytes % 2)  # two bytes a character
    assert len(name.encode()) == name_bytes
    if refused:
        with pytest.raises(PathRefused, match="longer than 255 bytes"):
            Workspace(tmp_path).resolve(f"src/{name}")
    else:
        assert Workspace(tmp_path).resolve(f"src/{name}").name == name


def test_an_empty_path_is_the_workspace_itself(tmp_path):
    workspace = Workspace(tmp_path)
    assert workspace.resolve("") == tmp_path.resolve()
    assert workspace.relative(workspace.resolve(".")) == "."
    assert workspace.relative(workspace.resolve("a/b")) == "a/b"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "must be a string, not NoneType"),
        (3, "must be a string, not int"),
        ("a\x00b", "NUL byte"),
        ("~/x", "'~' is not expanded"),
        ("~", "'~' is not expanded"),
        ("~root/x", "'~' is not expanded"),
        ("/etc/passwd", "absolute paths are refused"),
        ("a/../../x", "'..' is refused"),
        ("a/..", "'..' is refused"),
        ("\ud800", "lone surrogate"),
    ],
)
def test_refusals_say_why(tmp_path, raw, reason):
    with pytest.raises(PathRefused, match=reason):
        Workspace(tmp_path).resolve(raw)


@pytest.mark.parametrize("raw", ["a~", "x/~y", "..a", "a..", "a/.../b", " a", "./a"])
def test_names_that_only_look_special_are_ordinary(tmp_path, raw):
    assert Workspace(tmp_path).resolve(raw).is_relative_to(tmp_path.resolve())


def test_a_workspace_must_be_a_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        Workspace(tmp_path / "file")


def test_a_gitignore_above_the_workspace_does_not_hide_its_files(tmp_path):
    (tmp_path / ".gitignore").write_text("*.txt\n")
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / ".gitignore").write_text("*.log\n")
    for name in ("a.txt", "sub/b.txt", "sub/c.log", "sub/d.py"):
        (root / name).write_text(name)
    workspace = Workspace(root)
    walked = [(workspace.relative(path), folder) for path, folder in workspace.walk(root)]
    assert walked == [
        ("a.txt", False),
        ("sub", True),
        ("sub/.gitignore", False),
        ("sub/b.txt", False),
        ("sub/d.py", False),
    ]
    # From a subfolder too: the rules of the folders between it and the root apply, none above.
    started = [workspace.relative(path) for path, _ in workspace.walk(root / "sub" / "inner")]
    assert started == []  # a folder that does not exist lists nothing
    (root / "sub" / "inner").mkdir()
    (root / "sub" / "inner" / "e.log").write_text("e")
    (root / "sub" / "inner" / "f.txt").write_text("f")
    assert [workspace.relative(p) for p, _ in workspace.walk(root / "sub" / "inner")] == [
        "sub/inner/f.txt"
    ]
