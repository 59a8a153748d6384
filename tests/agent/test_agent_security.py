"""Escape attempts: every path that leads outside the workspace is refused by every tool, and
nothing outside is read or written."""

from __future__ import annotations

import os
from pathlib import Path

from ds4mlx.agent.workspace import PathRefused, Workspace
from ds4mlx.engine.chat import ToolCall

import pytest

# (path, words the refusal must contain)
ESCAPES = [
    ("../outside/secret.txt", "'..'"),
    ("..", "'..'"),
    ("../../etc/passwd", "'..'"),
    ("src/../../outside/secret.txt", "'..'"),
    ("./../outside/secret.txt", "'..'"),
    ("src/..", "'..'"),
    ("/etc/passwd", "absolute"),
    ("/", "absolute"),
    ("//etc//passwd", "absolute"),
    ("~", "'~'"),
    ("~/.bashrc", "'~'"),
    ("~root/.ssh/id_rsa", "'~'"),
    ("src/app.py\x00.txt", "NUL"),
    ("\x00", "NUL"),
    ("src/\ud800", "lone surrogate"),  # found by tests/robustness/test_agent_paths.py
    ("a/" * 600 + "x", "longer than"),
    ("x" * 300, "longer than 255 bytes"),
    ("link_out/secret.txt", "symbolic link"),
    ("link_out", "symbolic link"),
    ("passwd_link", "symbolic link"),
    ("chain", "symbolic link"),
    ("up/outside/secret.txt", "symbolic link"),
    ("dangling_out", "symbolic link"),
    ("src/inner_out/secret.txt", "symbolic link"),
]


@pytest.fixture
def links(workspace: Path, outside: Path) -> Path:
    """Symbolic links inside the workspace that point out of it."""
    (workspace / "link_out").symlink_to(outside)
    (workspace / "passwd_link").symlink_to("/etc/passwd")
    (workspace / "chain_step").symlink_to(outside / "secret.txt")
    (workspace / "chain").symlink_to(workspace / "chain_step")
    (workspace / "up").symlink_to(workspace.parent)
    (workspace / "dangling_out").symlink_to(outside / "not-yet.txt")
    (workspace / "src" / "inner_out").symlink_to("../../outside")
    (workspace / "inside_link").symlink_to("src/app.py")
    return workspace


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("path", "reason"), ESCAPES)
def test_workspace_refuses_escapes(links, path, reason):
    with pytest.raises(PathRefused, match=reason):
        Workspace(links).resolve(path)


def test_an_absolute_path_inside_the_workspace_is_refused_too(workspace):
    with pytest.raises(PathRefused, match="absolute"):
        Workspace(workspace).resolve(str(workspace / "README.md"))


def test_links_that_stay_inside_are_followed(links):
    assert Workspace(links).resolve("inside_link") == links / "src" / "app.py"
    assert Workspace(links).resolve("") == links.resolve()


@pytest.mark.parametrize("tool", ["read", "list", "write", "edit", "search", "symbols"])
@pytest.mark.parametrize(("path", "reason"), ESCAPES)
def test_every_file_tool_refuses_escapes(toolbox, links, outside, tool, path, reason):
    arguments = {
        "read": {},
        "list": {},
        "symbols": {},
        "write": {"content": "pwned\n"},
        "edit": {"old": "top secret", "new": "pwned"},
        "search": {"pattern": "secret"},
    }[tool]
    before = snapshot(outside)
    result = toolbox.run(ToolCall(tool, {"path": path, **arguments}))
    assert result.is_error and reason in result.output
    assert "top secret" not in result.output
    assert snapshot(outside) == before
    assert not (outside / "not-yet.txt").exists()


def test_bash_starts_in_the_workspace(toolbox, workspace):
    result = toolbox.run(ToolCall("bash", {"command": "pwd; echo $PWD"}))
    assert result.output.splitlines() == [str(workspace)] * 2


def test_walking_does_not_follow_links_out(toolbox, links):
    listing = toolbox.run(ToolCall("list", {"path": "."})).output
    assert "secret.txt" not in listing
    found = toolbox.run(ToolCall("search", {"pattern": "top secret"})).output
    assert found == "no match for 'top secret'"


def test_the_workspace_must_exist(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        Workspace(tmp_path / "missing")
    assert os.path.isdir(tmp_path)
