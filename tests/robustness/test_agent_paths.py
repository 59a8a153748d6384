"""Generated tool paths against the agent's workspace: every path is either refused with
PathRefused or resolves inside the workspace, and the file tools never touch what lies outside.
Part of the robustness suite (issue 10); test_agent_security keeps the hand-written escapes."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.agent.tools import ToolBox
from ds4mlx.agent.workspace import PathRefused, Workspace
from ds4mlx.engine.chat import ToolCall

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

# Pieces an attacker (or a confused model) builds paths from: climbs, roots, home, links that
# lead out and in, separators of other systems, NUL, long and non-ASCII names.
FRAGMENTS = [
    "..",
    ".",
    "",
    "src",
    "app.py",
    "link_out",
    "up",
    "inside_link",
    "dangling_out",
    "~",
    "~root",
    "/",
    "//",
    "\\",
    "..\\..",
    "\x00",
    " ",
    "\t",
    "é",
    "名前",
    "a" * 256,
    "secret.txt",
    "outside",
    ".git",
    "%2e%2e",
    "$HOME",
    "*",
    "\ud800",
]
PATHS = st.one_of(
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8).map("/".join),
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=5).map("".join),
    st.text(max_size=40),
)
NOT_STRINGS = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.booleans(),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("paths")
    root, outside = base / "workspace", base / "outside"
    (root / "src").mkdir(parents=True)
    outside.mkdir()
    (root / "src" / "app.py").write_text("print('hi')\n")
    (outside / "secret.txt").write_text("top secret\n")
    (root / "link_out").symlink_to(outside)
    (root / "up").symlink_to(base)
    (root / "dangling_out").symlink_to(outside / "not-yet.txt")
    (root / "inside_link").symlink_to("src/app.py")
    return root.resolve(), outside


@settings(max_examples=4500, deadline=None, database=None)
@given(raw=st.one_of(PATHS, NOT_STRINGS))
@example(raw="up/outside/secret.txt")  # fixed cases: a link to the parent, then down again
@example(raw="src/\ud800")  # a lone surrogate in a file name
@example(raw="a" * 256 + "/x")
def test_resolve_refuses_or_stays_inside(sandbox, raw):
    root, _ = sandbox
    try:
        resolved = Workspace(root).resolve(raw)
    except PathRefused:
        return
    assert resolved.is_relative_to(root)
    assert resolved == resolved.resolve()  # links already followed: nothing left to escape by


@settings(max_examples=500, deadline=None, database=None)
@given(tool=st.sampled_from(["read", "list", "write", "edit", "search", "symbols"]), path=PATHS)
def test_file_tools_answer_and_leave_the_outside_alone(sandbox, tool, path):
    root, outside = sandbox
    arguments = {
        "read": {},
        "list": {},
        "symbols": {},
        "search": {"pattern": "secret"},
        "write": {"content": "pwned\n"},
        "edit": {"old": "top secret", "new": "x"},
    }
    toolbox = ToolBox(Workspace(root))
    try:
        result = toolbox.run(ToolCall(tool, {"path": path, **arguments[tool]}))
    finally:
        toolbox.close()
    assert isinstance(result.output, str)
    assert "top secret" not in result.output
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
