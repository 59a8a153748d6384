"""The one-line notes both faces (the UI's log, --print's stderr) give for agent events that
need only telling: malformed calls, compaction, attached files."""

from __future__ import annotations

from ds4mlx.agent.loop import (
    AgentEvent,
    CompactionFinished,
    CompactionStarted,
    FilesAttached,
    MalformedToolCall,
)


def event_notes(event: AgentEvent) -> list[tuple[str, bool]]:
    """(text, is an error) for each line ``event`` calls for; none for other events."""
    if isinstance(event, MalformedToolCall):
        return [(f"malformed tool call ({event.error.reason}); reported to the model", True)]
    if isinstance(event, CompactionStarted):
        return [(f"compacting the context ({event.reason}; {event.tokens} tokens)", False)]
    if isinstance(event, CompactionFinished):
        if event.compacted:
            text = f"compacted the context: {event.tokens_before} -> {event.tokens_after} tokens"
        else:
            text = f"context not compacted: {event.note}"
        return [(text, False)]
    if isinstance(event, FilesAttached):
        attached = [("attached " + ", ".join(event.attached), False)] if event.attached else []
        return attached + [(f"not attached: {refused}", True) for refused in event.refused]
    return []
