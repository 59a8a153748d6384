"""The one-line notes for agent events that need only telling."""

from __future__ import annotations

from ds4mlx.agent.event_notes import event_notes
from ds4mlx.agent.loop import (
    CompactionFinished,
    CompactionStarted,
    FilesAttached,
    MalformedToolCall,
    TextDelta,
)
from ds4mlx.engine.chat.events import ToolCallError


def test_a_malformed_call_is_an_error_note_with_its_reason():
    event = MalformedToolCall("c1", ToolCallError("<x", "no closing tag"))
    assert event_notes(event) == [
        ("malformed tool call (no closing tag); reported to the model", True)
    ]


def test_compaction_started_names_the_reason_and_the_tokens():
    assert event_notes(CompactionStarted(31000, "/compact")) == [
        ("compacting the context (/compact; 31000 tokens)", False)
    ]


def test_compaction_finished_gives_the_counts_or_the_note():
    assert event_notes(CompactionFinished(30000, 4000)) == [
        ("compacted the context: 30000 -> 4000 tokens", False)
    ]
    # The same count before and after is no compaction.
    assert event_notes(CompactionFinished(4000, 4000, "nothing old enough")) == [
        ("context not compacted: nothing old enough", False)
    ]


def test_files_attached_then_each_refusal_as_an_error():
    event = FilesAttached(["a.py (2 lines)", "b.py (1 line)"], ["@x: no such file", "@y: binary"])
    assert event_notes(event) == [
        ("attached a.py (2 lines), b.py (1 line)", False),
        ("not attached: @x: no such file", True),
        ("not attached: @y: binary", True),
    ]


def test_only_refusals_give_no_attached_line():
    assert event_notes(FilesAttached([], ["@x: no such file"])) == [
        ("not attached: @x: no such file", True)
    ]
    assert event_notes(FilesAttached([], [])) == []


def test_other_events_need_no_note():
    assert event_notes(TextDelta("hello")) == []
