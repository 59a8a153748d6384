"""What the workspace walk lists, what a stopped command reports, how tools read their
arguments, the prompt history and the markup filter: behaviours the fifth blind mutation run
(scripts/mutation_sets/fresh5.py) found untested. Each test says which one-line change it fails
on."""

from __future__ import annotations

import threading
from pathlib import Path

from ds4mlx.agent import jobs
from ds4mlx.agent.markup import MarkupFilter
from ds4mlx.agent.prompt_input import MAX_HISTORY, PromptHistory
from ds4mlx.agent.tools import ToolBox, describe_call
from ds4mlx.agent.workspace import Workspace
from ds4mlx.engine.chat import TextDelta, ToolCall
from ds4mlx.engine.chat.deepseek4 import DSML


def _listed(workspace: Workspace, start: Path) -> set[str]:
    return {workspace.relative(path) for path, _ in workspace.walk(start)}


def test_the_walk_leaves_out_a_link_to_nothing(tmp_path):
    """A symbolic link inside the workspace whose target does not exist is not listed (fails
    when only the target's place is checked, not that it exists)."""
    (tmp_path / "real.txt").write_text("x")
    (tmp_path / "to_real").symlink_to(tmp_path / "real.txt")
    (tmp_path / "to_nothing").symlink_to(tmp_path / "missing.txt")
    listed = _listed(Workspace(tmp_path), tmp_path)
    assert "to_real" in listed and "real.txt" in listed
    assert "to_nothing" not in listed


def test_a_deeper_gitignore_overrides_the_ones_above_a_walks_start(tmp_path):
    """Rules above the walk's start apply outermost first, so a nearer folder's negation wins
    (fails when the folders above are read innermost first)."""
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".gitignore").write_text("!keep.log\n")
    start = tmp_path / "a" / "b"
    start.mkdir()
    (start / "keep.log").write_text("kept")
    (start / "drop.log").write_text("ignored")
    listed = _listed(Workspace(tmp_path), start)
    assert "a/b/keep.log" in listed
    assert "a/b/drop.log" not in listed


def test_a_cancelled_command_has_no_exit_code(tmp_path):
    """A command stopped by the user reports no exit code, as a timed-out one does (fails when
    only a timeout clears it: the killed shell's -15 or -9 would read as the command's)."""
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    outcome = jobs.JobRunner(tmp_path).run("sleep 30", 20.0, cancel)
    assert outcome.cancelled and not outcome.timed_out
    assert outcome.exit_code is None


def test_a_timed_out_command_does_not_also_report_leftovers(tmp_path):
    """A child that escaped every stop (no process group, no marker: ``env -i setsid``) holds
    the output of a command that timed out: the outcome says it timed out, not that leftovers
    were stopped as well (fails when leftovers are reported whatever ended the command)."""
    outcome = jobs.JobRunner(tmp_path).run(
        "env -i setsid sleep 3 & sleep 30", 0.5, threading.Event()
    )
    assert outcome.timed_out and outcome.exit_code is None
    assert not outcome.stopped_leftovers


def test_an_empty_file_reads_from_its_first_line(tmp_path):
    """Reading an empty file from line 1 is not an error (fails when a start past the end is
    refused also for a file without lines)."""
    (tmp_path / "empty.txt").write_text("")
    box = ToolBox(Workspace(tmp_path))
    try:
        result = box.run(ToolCall("read", {"path": "empty.txt"}))
    finally:
        box.close()
    assert not result.is_error, result.output
    assert "past the end" not in result.output


def test_a_negative_integer_written_as_text_reaches_the_tool(tmp_path):
    """A model's "-2" for an integer is converted like "2", so the tool's own check answers
    (fails when the conversion accepts unsigned digits only: "must be an integer")."""
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    box = ToolBox(Workspace(tmp_path))
    try:
        result = box.run(ToolCall("read", {"path": "a.txt", "start": "-2"}))
        shown = box.run(ToolCall("read", {"path": "a.txt", "start": " 2 "}))
    finally:
        box.close()
    assert result.is_error and "at least 1" in result.output, result.output
    assert not shown.is_error and "two" in shown.output and "one" not in shown.output


def test_a_boolean_is_not_taken_for_a_string(tmp_path):
    """A string parameter given true is refused, where a number is taken as its text (fails when
    a bool, an int to Python, passes as "True")."""
    (tmp_path / "True").write_text("a file named True")
    (tmp_path / "7").write_text("a file named 7")
    box = ToolBox(Workspace(tmp_path))
    try:
        flag = box.run(ToolCall("read", {"path": True}))
        number = box.run(ToolCall("read", {"path": 7}))
    finally:
        box.close()
    assert flag.is_error and "must be a string" in flag.output, flag.output
    assert not number.is_error and "a file named 7" in number.output


def test_a_call_described_in_exactly_its_width_is_not_cut():
    """A description as long as the width is shown whole; one character more is cut with "…"
    (fails when a line that fits is cut too)."""
    fits = ToolCall("read", {"path": "x" * 75})  # "read " + 75 = 80 characters
    assert describe_call(fits, 80) == "read " + "x" * 75
    longer = ToolCall("read", {"path": "x" * 76})
    assert describe_call(longer, 80) == "read " + "x" * 74 + "…"


def test_more_with_a_count_below_one_shows_the_usual_page(tmp_path):
    """``more`` with count 0 or a negative count continues by the usual number of lines (fails
    when a negative count is used as given: it showed every line but the last)."""
    (tmp_path / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 301)))
    box = ToolBox(Workspace(tmp_path))
    try:
        box.run(ToolCall("read", {"path": "long.txt", "start": 1, "end": 2}))
        page = box.run(ToolCall("more", {"count": -3}))
    finally:
        box.close()
    last = 2 + box.read_lines
    assert "line 3\n" in page.output + "\n" and f"line {last}\n" in page.output + "\n"
    assert f"line {last + 1}\n" not in page.output + "\n"


def test_the_history_file_keeps_the_newest_prompts(tmp_path):
    """A history file longer than MAX_HISTORY loads its newest prompts (fails when the oldest
    are kept)."""
    path = tmp_path / "history.jsonl"
    path.write_text("".join(f'"prompt {n}"\n' for n in range(MAX_HISTORY + 3)))
    entries = PromptHistory(path).entries
    assert len(entries) == MAX_HISTORY
    assert entries[0] == "prompt 3" and entries[-1] == f"prompt {MAX_HISTORY + 2}"


def test_a_closing_tag_streamed_a_character_at_a_time_never_shows():
    """The filter holds back as much of the text's end as could still become the longest opener
    (a closing tag's), so none of a stray closing tag leaks when it arrives a character at a
    time (fails when one character less is held back: its "<" showed)."""
    whole = f"Done.</{DSML}tool_calls> Bye."
    markup = MarkupFilter()
    events = [event for char in whole for event in markup.feed(char)] + markup.finish()
    shown = "".join(event.text for event in events if isinstance(event, TextDelta))
    assert shown == "Done. Bye."
