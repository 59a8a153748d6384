"""Each tool's behaviour on a small workspace: results as the model reads them, and errors."""

from __future__ import annotations

import threading
import time

from ds4mlx.agent.tools import ToolBox
from ds4mlx.agent.workspace import Workspace
from ds4mlx.engine.chat import ToolCall

import pytest


def run(toolbox: ToolBox, tool: str, **arguments):
    return toolbox.run(ToolCall(tool, arguments))


def test_list_shows_sizes_and_skips_gitignored_files(toolbox):
    result = run(toolbox, "list", path=".")
    assert not result.is_error
    lines = result.output.splitlines()
    assert "      23  README.md" in lines
    assert "       -  src/" in lines
    assert any(line.endswith("src/app.py") for line in lines)
    assert "build" not in result.output and "debug.log" not in result.output
    assert ".gitignore" in result.output


def test_nested_gitignore_and_negation(toolbox, workspace):
    (workspace / "src" / ".gitignore").write_text("*.js\n!keep.js\n")
    (workspace / "src" / "keep.js").write_text("x\n")
    listing = run(toolbox, "list", path="src").output
    assert "util.js" not in listing and "keep.js" in listing and "app.py" in listing


def test_read_numbers_lines_and_more_continues(workspace):
    (workspace / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 26)))
    box = ToolBox(Workspace(workspace), read_lines=10)
    first = run(box, "read", path="long.txt")
    assert first.output.splitlines()[0] == "    1  line 1"
    assert "15 more lines; call more" in first.output
    second = run(box, "more")
    assert second.output.splitlines()[0] == "   11  line 11"
    assert run(box, "more", count=100).output.splitlines()[-1] == "   25  line 25"
    assert "end of long.txt" in run(box, "more").output
    ranged = run(box, "read", path="long.txt", start=3, end="4")  # numbers as strings are fine
    assert ranged.output == "    3  line 3\n    4  line 4\n... 21 more lines; call more to continue"
    box.close()


def test_read_errors(toolbox, workspace):
    (workspace / "blob.bin").write_bytes(b"\x00\x01\x02")
    assert "binary" in run(toolbox, "read", path="blob.bin").output
    assert "past the end" in run(toolbox, "read", path="README.md", start=50).output
    assert "does not exist" in run(toolbox, "read", path="nope.txt").output
    assert "folder" in run(toolbox, "read", path="src").output
    assert "nothing to continue" in ToolBox(Workspace(workspace)).run(ToolCall("more", {})).output


def test_write_creates_folders_and_reports_a_diff(toolbox, workspace):
    result = run(toolbox, "write", path="pkg/new.py", content="x = 1\ny = 2\n")
    assert result.output == "wrote pkg/new.py: 2 lines, 12 bytes"
    assert (workspace / "pkg" / "new.py").read_text() == "x = 1\ny = 2\n"
    assert "+x = 1" in result.diff
    rewrite = run(toolbox, "write", path="pkg/new.py", content="x = 1\ny = 3\n")
    assert "-y = 2" in rewrite.diff and "+y = 3" in rewrite.diff
    assert run(toolbox, "write", path="src", content="x").is_error
    assert toolbox.changed_files == {"pkg/new.py"}


def test_edit_replaces_one_unique_occurrence(toolbox, workspace):
    result = run(toolbox, "edit", path="src/app.py", old="return a + b", new="return b + a")
    assert not result.is_error
    assert result.output.splitlines() == [
        "edited src/app.py: 1 replacement",
        "-    return a + b",
        "+    return b + a",
    ]
    assert result.diff.startswith("--- a/src/app.py\n+++ b/src/app.py\n@@")
    assert "return b + a" in (workspace / "src" / "app.py").read_text()


def test_edit_refuses_missing_and_repeated_text(toolbox, workspace):
    before = (workspace / "src" / "app.py").read_text()
    missing = run(toolbox, "edit", path="src/app.py", old="return a - b", new="x")
    assert missing.is_error and "not found" in missing.output
    repeated = run(toolbox, "edit", path="src/app.py", old="return", new="yield")
    assert repeated.is_error and "occurs 2 times" in repeated.output
    assert run(toolbox, "edit", path="src/app.py", old="", new="x").is_error
    assert (workspace / "src" / "app.py").read_text() == before


def test_edit_keeps_windows_line_endings(toolbox, workspace):
    (workspace / "dos.txt").write_bytes(b"one\r\ntwo\r\n")
    run(toolbox, "edit", path="dos.txt", old="two", new="three")
    assert (workspace / "dos.txt").read_bytes() == b"one\r\nthree\r\n"


def test_search_finds_regex_matches_outside_ignored_files(toolbox):
    result = run(toolbox, "search", pattern=r"def \w+\(")
    assert result.output.splitlines() == [
        "src/app.py:5: def greet(self, name):",
        "src/app.py:9: def add(a, b):",
    ]
    everywhere = run(toolbox, "search", pattern="add").output
    assert "build/out.txt" not in everywhere and "debug.log" not in everywhere
    assert "src/util.js:1: export function add(a, b) {" in everywhere
    assert (
        run(toolbox, "search", pattern="add", path="src/point.c").output
        == "src/point.c:9: int add(int a, int b) {"
    )
    assert "no match" in run(toolbox, "search", pattern="zebra").output
    bad = run(toolbox, "search", pattern="(unclosed")
    assert bad.is_error and "bad regular expression" in bad.output


def test_bash_runs_in_the_workspace(toolbox, workspace):
    result = run(toolbox, "bash", command="pwd && ls src")
    assert result.output.splitlines()[0] == str(workspace)
    assert "app.py" in result.output and not result.is_error
    failing = run(toolbox, "bash", command="echo oops; exit 3")
    assert failing.is_error and failing.output == "oops\n(exit code 3)"


def test_bash_timeout_stops_the_command(workspace):
    box = ToolBox(Workspace(workspace), bash_timeout=0.5)
    started = time.monotonic()
    result = run(box, "bash", command="echo begun; sleep 30; echo never")
    assert time.monotonic() - started < 20  # stopped, not the 30 s run (slack for a load)
    assert "begun" in result.output and "never" not in result.output
    assert "timed out after 0.5s" in result.output and result.is_error
    box.close()


def test_bash_is_cancelled_by_the_user(toolbox):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    result = toolbox.run(ToolCall("bash", {"command": "sleep 30"}), cancel)
    assert time.monotonic() - started < 20  # stopped, not the 30 s run (slack for a load)
    assert "stopped by the user" in result.output  # not the toolbox's 5 s timeout


def test_background_jobs_status_and_stop(toolbox):
    started = run(toolbox, "bash", command="echo first; sleep 30 &")
    assert started.output.startswith("started background job 1: echo first; sleep 30")
    deadline = time.monotonic() + 30  # only bounds a hang: a loaded machine starts it late
    status = run(toolbox, "status", job=1).output
    while "first" not in status and time.monotonic() < deadline:
        time.sleep(0.05)
        status += run(toolbox, "status", job=1).output
    assert "job 1 running" in status and "first" in status
    assert "job 1 running" in toolbox.open_state()
    stopped = run(toolbox, "stop", job=1)
    assert stopped.output.startswith("stopped job 1")
    assert "exited" in run(toolbox, "status").output
    assert "there is no job 7" in run(toolbox, "stop", job=7).output
    quick = run(toolbox, "bash", command="echo hi &")
    assert "job 2" in quick.output


def test_bad_calls_become_error_results(toolbox):
    assert "unknown tool 'fly'" in run(toolbox, "fly").output
    assert "needs 'path'" in run(toolbox, "read").output
    assert "no parameter 'colour'" in run(toolbox, "list", colour="red").output
    assert "must be an integer" in run(toolbox, "read", path="README.md", start="ten").output
    assert "must be an integer" in run(toolbox, "read", path="README.md", start=True).output
    assert "must be a string" in run(toolbox, "bash", command=["ls"]).output


def test_symbols_outline_python_c_and_javascript(toolbox):
    python = run(toolbox, "symbols", path="src/app.py").output.splitlines()
    assert python == [
        "    4-6     class Greeter",
        "    5-6       function greet",
        "    9-10    function add",
    ]
    c = run(toolbox, "symbols", path="src/point.c").output
    assert "struct point" in c and "function find" in c and "function add" in c
    js = run(toolbox, "symbols", path="src/util.js").output
    for expected in ("function add", "class Counter", "method increment", "function double"):
        assert expected in js


def test_symbols_finds_a_definition_across_the_workspace(toolbox):
    found = run(toolbox, "symbols", name="add").output.splitlines()
    assert found == [
        "src/app.py:9-10: function add",
        "src/point.c:9-11: function add",
        "src/util.js:1-3: function add",
    ]
    assert "no definition" in run(toolbox, "symbols", name="missing").output
    assert run(toolbox, "symbols", path="README.md").is_error
    assert run(toolbox, "symbols").is_error


@pytest.mark.parametrize("limit", [50])
def test_long_results_are_clipped(workspace, limit):
    box = ToolBox(Workspace(workspace), max_output_chars=limit)
    result = run(box, "bash", command="seq 1 1000")
    assert len(result.output) < limit + 60 and "characters cut" in result.output
    assert result.output.endswith("1000")
    box.close()


def test_text_that_cannot_be_written_is_an_error(toolbox, workspace):
    result = run(toolbox, "write", path="README.md", content="lone surrogate \ud800")
    assert result.is_error and "encode" in result.output
    assert (workspace / "README.md").read_text().startswith("# demo")  # left as it was


def test_edit_keeps_bytes_that_are_not_utf8(toolbox, workspace):
    (workspace / "latin1.txt").write_bytes(b"caf\xe9\nold line\n")
    result = run(toolbox, "edit", path="latin1.txt", old="old line", new="new line")
    assert not result.is_error
    assert (workspace / "latin1.txt").read_bytes() == b"caf\xe9\nnew line\n"
    assert "caf\ufffd" in result.diff
