"""Walks and searches that end early say so, and a search passes over what it cannot read:
the user's Ctrl+C, the time budget and the entry limit each leave their line in the result."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from types import SimpleNamespace

from ds4mlx.agent import tools
from ds4mlx.agent.tools import ToolBox
from ds4mlx.agent.workspace import Workspace
from ds4mlx.engine.chat import ToolCall

import pytest
import regex

USER_STOP = "(stopped by the user; the result is incomplete)"


@pytest.fixture
def box(tmp_path: Path):
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text("needle\n")
    toolbox = ToolBox(Workspace(tmp_path))
    yield toolbox
    toolbox.close()


def test_a_list_stopped_by_the_user_says_so(box):
    cancelled = threading.Event()
    cancelled.set()
    result = box.run(ToolCall("list", {"path": "."}), cancelled)
    assert result.output == USER_STOP and not result.is_error


def test_a_list_that_reaches_its_deadline_says_after_how_long(box, monkeypatch):
    """The walk's clock reads exactly its deadline at the first entry: the time is up (the
    deadline is inclusive)."""
    clock = itertools.chain([0.0], itertools.repeat(tools.WALK_SECONDS))
    monkeypatch.setattr(tools, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    result = box.run(ToolCall("list", {"path": "."}))
    assert result.output == "(stopped after 10s; the result is incomplete)"


def test_a_walk_with_time_left_lists_everything(box, monkeypatch):
    clock = itertools.chain([0.0], itertools.repeat(tools.WALK_SECONDS - 0.5))
    monkeypatch.setattr(tools, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    listed = box.run(ToolCall("list", {"path": "."})).output.splitlines()
    assert [line.split()[-1] for line in listed] == ["a.txt", "b.txt", "c.txt"]


def test_a_search_cut_by_the_entry_limit_says_so(box, monkeypatch):
    monkeypatch.setattr(tools, "MAX_WALK_ENTRIES", 2)
    result = box.run(ToolCall("search", {"pattern": "needle"}))
    assert result.output.splitlines() == [
        "a.txt:1: needle",
        "b.txt:1: needle",
        "(stopped after 2 entries; the result is incomplete: give a narrower path)",
    ]


def test_a_search_passes_over_a_binary_file_and_goes_on(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"needle\x00\x01")
    (tmp_path / "b.txt").write_text("needle here\n")
    toolbox = ToolBox(Workspace(tmp_path))
    result = toolbox.run(ToolCall("search", {"pattern": "needle"}))
    assert result.output == "b.txt:1: needle here" and not result.is_error


def test_a_stopped_search_reads_no_further_line(tmp_path):
    search = tools._Search(regex.compile("x"), iter([]), Workspace(tmp_path))
    search.stop(USER_STOP)
    assert search._search_lines("f.txt", ["x", "x"]) is False
    assert search.matches == []
    assert search.result("x").output == USER_STOP


def test_a_slow_pattern_in_a_stopped_search_is_no_error(tmp_path):
    """Once the user stopped the search, its result is what it found, not the slow-pattern
    error of the line it was stopped on."""
    search = tools._Search(regex.compile("x"), iter([]), Workspace(tmp_path))
    search.matches.append("f.txt:1: x")
    search.error = "the pattern took more than 0.5s of CPU"
    search.stop(USER_STOP)
    assert search.result("x").output == f"f.txt:1: x\n{USER_STOP}"


def test_the_size_of_a_file_gone_mid_walk_is_zero(tmp_path):
    assert tools._size(tmp_path / "gone.txt") == 0
    (tmp_path / "here.txt").write_text("12345")
    assert tools._size(tmp_path / "here.txt") == 5


def test_a_search_stopped_by_the_user_says_so(tmp_path):
    """Ctrl+C lands while one slow line is still being matched: the result says the search
    was stopped, whatever that line's match does later."""
    (tmp_path / "slow.txt").write_text("a" * 5000 + "!\n")  # (a+)+$ backtracks on it
    toolbox = ToolBox(Workspace(tmp_path))
    cancelled = threading.Event()
    cancelled.set()
    result = toolbox.run(ToolCall("search", {"pattern": "(a+)+$"}), cancelled)
    assert result.output == USER_STOP and not result.is_error


def test_a_stopped_walk_ends_there_and_keeps_its_reason(box, monkeypatch):
    """A walk the user stopped reads no further entry, so it never also meets the entry limit
    (whose message would then hide the user's stop)."""
    monkeypatch.setattr(tools, "MAX_WALK_ENTRIES", 2)
    cancelled = threading.Event()
    cancelled.set()
    assert box.run(ToolCall("list", {"path": "."}), cancelled).output == USER_STOP


def test_a_list_past_its_cap_counts_every_entry_left_out(box, monkeypatch):
    monkeypatch.setattr(tools, "MAX_LIST_ENTRIES", 1)
    assert box.run(ToolCall("list", {"path": "."})).output == (
        "       7  a.txt\n... 2 more entries; list a subfolder to see them"
    )
