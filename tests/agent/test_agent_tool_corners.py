"""The tools at their corners: a write into folders that do not exist yet, the outline size
limit met exactly, a name search the user stopped, previews and the reason a call would fail,
what bash, status and stop add to a command's output, and the context an edit's diff shows."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from ds4mlx.agent import tools
from ds4mlx.agent.jobs import BackgroundJob, CommandOutcome
from ds4mlx.agent.tools import ToolBox
from ds4mlx.agent.workspace import Workspace
from ds4mlx.engine.chat import ToolCall

import pytest
from test_agent_jobs import wait_for

SOURCE = "def found():\n    return 1\n"


def finished(job: BackgroundJob) -> bool:
    """The job exited and all it printed was read (the reader outlives the process)."""
    return not job.running and not job.handle.reader.is_alive()


@pytest.fixture
def box(tmp_path: Path):
    toolbox = ToolBox(Workspace(tmp_path))
    yield toolbox
    toolbox.close()


def test_a_write_creates_the_folders_it_needs(box, tmp_path):
    result = box.run(ToolCall("write", {"path": "new/deeper/file.txt", "content": "x\n"}))
    assert result.output == "wrote new/deeper/file.txt: 1 lines, 2 bytes" and not result.is_error
    assert (tmp_path / "new" / "deeper" / "file.txt").read_text() == "x\n"


@pytest.mark.parametrize("room, expected", [(0, "m.py:1-2: function found"), (-1, "no definition")])
def test_a_name_search_reads_files_of_exactly_the_outline_limit(
    box, tmp_path, monkeypatch, room, expected
):
    (tmp_path / "m.py").write_text(SOURCE)
    monkeypatch.setattr(tools, "MAX_OUTLINE_FILE_BYTES", len(SOURCE) + room)
    output = box.run(ToolCall("symbols", {"path": ".", "name": "found"})).output
    assert output.startswith(expected)


def test_a_name_search_stopped_by_the_user_says_so(box, tmp_path):
    (tmp_path / "m.py").write_text(SOURCE)
    cancelled = threading.Event()
    cancelled.set()
    output = box.run(ToolCall("symbols", {"path": ".", "name": "found"}), cancelled).output
    assert output == "no definition of 'found'\n(stopped by the user; the result is incomplete)"


def test_a_write_preview_shows_the_new_content(box, tmp_path):
    (tmp_path / "n.txt").write_text("old\n")
    call = ToolCall("write", {"path": "n.txt", "content": "new\n"})
    assert box.preview(call) == "--- a/n.txt\n+++ b/n.txt\n@@ -1 +1 @@\n-old\n+new"


@pytest.fixture
def unreadable(tmp_path, monkeypatch) -> None:
    """n.txt exists, and reading any file fails as a file without read permission does."""
    (tmp_path / "n.txt").write_text("old\n")

    def refuse(*_args) -> bytes:
        raise PermissionError(errno.EACCES, "Permission denied", "n.txt")

    monkeypatch.setattr(tools, "read_regular", refuse)


def test_a_call_that_would_fail_on_a_system_error_gives_its_reason(box, unreadable):
    """The reason, not Python's spelling of the exception ("[Errno 13] ...: 'path'")."""
    call = ToolCall("edit", {"path": "n.txt", "old": "old", "new": "new"})
    assert box.would_fail(call) == tools.ToolResult("error: Permission denied", is_error=True)
    assert box.preview(call) == "(this call would fail: Permission denied)"


def test_leftovers_are_reported_after_a_command_that_succeeded(box, monkeypatch):
    outcome = CommandOutcome("done\n", 0, stopped_leftovers=True)
    monkeypatch.setattr(box.jobs, "run", lambda *_args: outcome)
    result = box.run(ToolCall("bash", {"command": "serve"}))
    assert result.output == (
        "done\n(processes it left running held its output open and were stopped; "
        "end a command with & to run it as a background job)"
    )
    assert not result.is_error


def test_status_leaves_room_for_the_state_line_within_the_result_limit(tmp_path):
    """A job's output is cut to the result limit less room for its state line, so that the
    result needs no clipping on top (which would cut the state's neighbourhood too)."""
    box = ToolBox(Workspace(tmp_path), max_output_chars=1000)
    try:
        box.run(ToolCall("bash", {"command": "seq 1 2000 &"}))
        job = box.jobs.jobs[1]
        wait_for(lambda: finished(job), "the job's end")
        output = box.run(ToolCall("status", {})).output
    finally:
        box.close()
    assert output.startswith("job 1 exited with code 0: seq 1 2000\n")
    # seq's 8893 bytes less the 800 shown: 1000 less 200 for the state line.
    assert output.endswith("\n[... 8093 bytes omitted ...]")
    assert "characters cut" not in output and len(output) <= 1000


def test_stop_gives_what_the_job_printed(box):
    box.run(ToolCall("bash", {"command": "echo hello; sleep 30 &"}))
    job = box.jobs.jobs[1]
    wait_for(lambda: "hello" in job.output.text_since(0)[0], "the job's first line")
    assert box.run(ToolCall("stop", {"job": 1})).output == "stopped job 1\nhello"


def test_an_edit_diff_shows_two_lines_of_context(box, tmp_path):
    (tmp_path / "f.txt").write_text("".join(f"{n}\n" for n in range(1, 10)))
    result = box.run(ToolCall("edit", {"path": "f.txt", "old": "5\n", "new": "five\n"}))
    assert result.diff == "--- a/f.txt\n+++ b/f.txt\n@@ -3,5 +3,5 @@\n 3\n 4\n-5\n+five\n 6\n 7"


def test_a_system_error_is_given_by_its_reason(box, unreadable):
    result = box.run(ToolCall("read", {"path": "n.txt"}))
    assert result == tools.ToolResult("error: Permission denied", is_error=True)


def test_status_of_job_zero_is_no_job_and_each_job_is_its_own_paragraph(box):
    box.run(ToolCall("bash", {"command": "echo a &"}))
    box.run(ToolCall("bash", {"command": "echo b &"}))
    wait_for(lambda: all(map(finished, box.jobs.jobs.values())), "the jobs' end")
    assert box.run(ToolCall("status", {"job": 0})).output == "error: there is no job 0"
    assert box.run(ToolCall("status", {})).output == (
        "job 1 exited with code 0: echo a\na\n\njob 2 exited with code 0: echo b\nb"
    )


def test_a_name_search_passes_over_a_fifo(box, tmp_path):
    """A FIFO named like source is no file to outline: the search passes over it instead of
    failing on it."""
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "m.py").write_text(SOURCE)
    output = box.run(ToolCall("symbols", {"path": ".", "name": "found"})).output
    assert output == "m.py:1-2: function found"
