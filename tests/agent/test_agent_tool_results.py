"""The exact text of tool results the model reads back: listings, reads, outlines, writes and
edits, previews, jobs, and the error for each way a call can be wrong."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ds4mlx.agent import tools
from ds4mlx.agent.tools import MAX_SEARCH_FILE_BYTES, ToolBox
from ds4mlx.agent.workspace import Workspace
from ds4mlx.generation import ToolCall

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "deep").mkdir(parents=True)
    (root / "src" / "a.py").write_text("def f():\n    return 1\n")
    (root / "src" / "deep" / "b.txt").write_text("hello\n")
    return root


@pytest.fixture
def box(root: Path):
    box = ToolBox(Workspace(root), bash_timeout=5.0, read_lines=2)
    yield box
    box.close()


def run(box: ToolBox, tool: str, **arguments):
    return box.run(ToolCall(tool, arguments))


def error(box: ToolBox, tool: str, **arguments) -> str:
    result = run(box, tool, **arguments)
    assert result.is_error, result.output
    return result.output


# ------------------------------------------------------------------ list


def test_a_listing_gives_folders_with_a_dash_and_files_with_their_size(box):
    assert run(box, "list", path="src").output == (
        "      22  a.py\n       -  deep/\n       6  deep/b.txt"
    )


def test_listing_a_file_gives_its_size_and_path(box):
    assert run(box, "list", path="src/a.py").output == "      22  src/a.py"


def test_an_empty_folder_says_so(box, root):
    (root / "empty").mkdir()
    assert run(box, "list", path="empty").output == "(empty folder)"


def test_a_fifo_is_neither_listed_nor_searched(box, root):
    os.mkfifo(root / "pipe")
    assert error(box, "list", path="pipe") == "error: pipe is not a file or folder"
    assert error(box, "search", pattern="x", path="pipe") == (
        "error: pipe is not a regular file; only regular files are searched"
    )


# ------------------------------------------------------------------ read and more


def test_read_numbers_lines_and_more_continues_to_the_end(box, root):
    (root / "five.txt").write_text("a\nb\nc\nd\ne\n")
    assert run(box, "read", path="five.txt").output == (
        "    1  a\n    2  b\n... 3 more lines; call more to continue"
    )
    assert run(box, "more", count=0).output == (
        "    3  c\n    4  d\n... 1 more lines; call more to continue"
    )
    assert run(box, "more").output == "    5  e"
    assert run(box, "more").output == "(end of five.txt)"


def test_reading_an_empty_file_says_so(box, root):
    (root / "empty.txt").write_text("")
    assert run(box, "read", path="empty.txt").output == "(empty file)"


def test_a_binary_file_is_not_read(box, root):
    (root / "blob").write_bytes(b"x" * 8191 + b"\x00")
    assert error(box, "read", path="blob") == "error: blob is a binary file"
    (root / "late").write_bytes(b"x" * 8192 + b"\x00")
    assert not run(box, "read", path="late").is_error


# ------------------------------------------------------------------ search


def test_a_file_of_exactly_the_search_limit_is_searched(box, root):
    (root / "big.txt").write_bytes(b"needle\n" + b"x" * (MAX_SEARCH_FILE_BYTES - 7))
    assert run(box, "search", pattern="needle", path="big.txt").output == "big.txt:1: needle"
    with (root / "big.txt").open("ab") as file:
        file.write(b"x")
    assert error(box, "search", pattern="needle", path="big.txt") == (
        "error: big.txt is larger than 2 MiB; search a smaller file"
    )


def test_no_match_names_the_pattern(box):
    assert run(box, "search", pattern="zz+q").output == "no match for 'zz+q'"


# ------------------------------------------------------------------ symbols


def test_an_outline_gives_line_ranges_and_nesting(box, root):
    (root / "c.py").write_text("class A:\n    def m(self):\n        pass\n")
    assert (
        run(box, "symbols", path="c.py").output == "    1-3     class A\n    2-3       function m"
    )
    assert run(box, "symbols", path="c.py", name="m").output == "c.py:2-3: function m"


def test_symbols_of_a_folder_needs_a_name_and_an_unknown_kind_is_refused(box):
    assert error(box, "symbols", path="src") == ("error: give a file to outline, or a name to find")
    assert error(box, "symbols", path="src/deep/b.txt") == (
        "error: src/deep/b.txt: no outline for this kind of file "
        "(supported: .c, .cjs, .go, .h, .js, .jsx, .mjs, .py, .pyi, .rs)"
    )


def test_a_file_without_definitions_says_so(box, root):
    (root / "plain.py").write_text("x = 1\n")
    assert run(box, "symbols", path="plain.py").output == "no definitions"


# ------------------------------------------------------------------ write and edit


def test_a_write_counts_lines_and_bytes(box, root):
    assert run(box, "write", path="new/é.txt", content="é\nlast").output == (
        "wrote new/é.txt: 2 lines, 7 bytes"  # é is two bytes
    )
    assert (root / "new" / "é.txt").read_text() == "é\nlast"
    assert run(box, "write", path="empty.txt", content="").output == (
        "wrote empty.txt: 0 lines, 0 bytes"
    )


def test_the_changed_files_are_kept_in_the_open_state_in_order(box):
    assert box.open_state() == ""
    run(box, "write", path="b.txt", content="b\n")
    run(box, "edit", path="src/a.py", old="return 1", new="return 2")
    assert box.open_state() == "files changed so far: b.txt, src/a.py"


def test_an_edit_reports_the_changed_lines_only(box):
    assert run(box, "edit", path="src/a.py", old="return 1", new="return 2").output == (
        "edited src/a.py: 1 replacement\n-    return 1\n+    return 2"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"path": " ", "old": "a", "new": "b"}, "the path is empty; give the file to edit"),
        ({"path": "src", "old": "a", "new": "b"}, "src is a folder"),
        (
            {"path": "src/a.py", "old": "", "new": "b"},
            "old is empty; give the exact text to replace",
        ),
    ],
)
def test_an_edit_that_cannot_be_made(box, arguments, message):
    assert error(box, "edit", **arguments) == f"error: {message}"


def test_writing_over_a_fifo_is_refused(box, root):
    os.mkfifo(root / "pipe")
    assert error(box, "write", path="pipe", content="x") == (
        "error: pipe exists and is not a regular file; refused"
    )


def test_an_os_error_gives_its_reason_alone(box, monkeypatch):
    def fail(target, data):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(tools, "write_atomically", fail)
    assert error(box, "write", path="x.txt", content="x") == "error: Input/output error"


def test_a_preview_shows_the_diff_or_why_there_is_none(box):
    same = ToolCall("write", {"path": "src/deep/b.txt", "content": "hello\n"})
    assert box.preview(same) == "(no change to src/deep/b.txt)"
    folder = ToolCall("write", {"path": "src", "content": "x"})
    assert box.preview(folder) == "(this call would fail: src is a folder)"
    assert box.would_fail(folder).output == "error: src is a folder"
    assert box.preview(ToolCall("read", {"path": "src/a.py"})) == ""
    assert box.would_fail(ToolCall("read", {"path": "nowhere"})) is None


# ------------------------------------------------------------------ commands and jobs


def test_an_empty_command_and_no_jobs(box):
    assert error(box, "bash", command="  ") == "error: the command is empty"
    assert run(box, "status").output == "no background jobs"


def test_a_failing_command_gives_its_output_and_exit_code(box):
    result = run(box, "bash", command="echo out; exit 3")
    assert (result.output, result.is_error) == ("out\n(exit code 3)", True)


def test_stopping_a_finished_job_gives_its_state(box):
    started = run(box, "bash", command="true &").output
    assert started.startswith("started background job 1: true\n")
    box.jobs.jobs[1].handle.process.wait(timeout=5)
    assert run(box, "stop", job=1).output == "job 1 exited with code 0: true"


# ------------------------------------------------------------------ arguments


def test_the_argument_errors_name_the_tool_and_the_parameter(box):
    assert error(box, "read", path="a", colour="red") == (
        "error: read has no parameter 'colour'; its parameters are path, start, end"
    )
    assert error(box, "edit", path="a") == "error: edit needs 'old', 'new'"
    assert error(box, "read", path=True) == "error: read: path must be a string, got True"
    assert run(box, "list", path=1.5).output == "error: 1.5 does not exist"


# What each tool's schema requires, as the model is told and as calls are checked.
REQUIRED = {
    "list": ["path"],
    "read": ["path"],
    "search": ["pattern"],
    "edit": ["path", "old", "new"],
    "bash": ["command"],
    "more": [],
    "write": ["path", "content"],
    "symbols": [],
    "status": [],
    "stop": ["job"],
}


def test_the_tools_in_the_order_the_model_learned_them():
    names = [tool["function"]["name"] for tool in ToolBox.schemas]
    assert names == list(REQUIRED)


@pytest.mark.parametrize(("tool", "required"), [(t, r) for t, r in REQUIRED.items() if r])
def test_a_call_without_its_required_arguments_is_refused(box, tool, required):
    assert error(box, tool) == f"error: {tool} needs {', '.join(map(repr, required))}"


@pytest.mark.parametrize(
    ("tool", "name", "arguments"),
    [
        ("read", "start", {"path": "src/a.py"}),
        ("read", "end", {"path": "src/a.py"}),
        ("more", "count", {}),
        ("status", "job", {}),
        ("stop", "job", {}),
    ],
)
def test_integer_parameters_refuse_words(box, tool, name, arguments):
    assert error(box, tool, **arguments, **{name: "two"}) == (
        f"error: {tool}: {name} must be an integer, got 'two'"
    )


# ------------------------------------------------------------------ blank paths, descriptions


@pytest.mark.parametrize("path", ["", "  ", "\t"])
def test_a_blank_path_is_written_nowhere(box, root, path):
    refused = error(box, "write", path=path, content="x")
    assert "the path is empty; give the file to write" in refused
    assert sorted(p.name for p in root.iterdir()) == ["src"]


def test_a_call_is_described_on_one_line_whatever_its_arguments_hold():
    call = ToolCall("bash", {"command": "make\n  test\tall", "content": "never\nshown"})
    assert tools.describe_call(call, width=None) == "bash make test all"
