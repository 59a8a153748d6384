"""JSON schemas of the agent's tools, as the model sees them in the system prompt.

Shared by the agent and by the corpus builder that teaches the tiny model to call them, so that
what the model learns is exactly what the agent offers.
"""

from __future__ import annotations

from typing import Any


def _tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


# The agent's system prompt; the corpus uses the same words so the tiny model recognises it.
SYSTEM_PROMPT = "You are ds4-agent, a coding assistant working in the user's workspace."

_PATH = {"type": "string", "description": "path relative to the workspace"}

AGENT_TOOLS: list[dict[str, Any]] = [
    _tool("list", "List files and folders with their sizes.", {"path": _PATH}, ["path"]),
    _tool(
        "read",
        "Read a text file, optionally a range of lines.",
        {"path": _PATH, "start": {"type": "integer"}, "end": {"type": "integer"}},
        ["path"],
    ),
    _tool(
        "search",
        "Search files for a regular expression.",
        {"pattern": {"type": "string"}, "path": _PATH},
        ["pattern"],
    ),
    _tool(
        "edit",
        "Replace one exact, unique occurrence of a string in a file.",
        {"path": _PATH, "old": {"type": "string"}, "new": {"type": "string"}},
        ["path", "old", "new"],
    ),
    _tool(
        "bash",
        "Run a shell command in the workspace.",
        {"command": {"type": "string"}},
        ["command"],
    ),
]

_JOB = {"type": "integer", "description": "background job number"}

# Tools beyond the five the tiny model's corpus teaches; the first five stay byte-identical.
AGENT_TOOLS += [
    _tool(
        "more",
        "Continue the last read: show the next lines of the same file.",
        {"count": {"type": "integer"}},
        [],
    ),
    _tool(
        "write",
        "Create a file, or replace a whole file, with the given content.",
        {"path": _PATH, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _tool(
        "symbols",
        "Outline the definitions in a file, or find where a name is defined.",
        {"path": _PATH, "name": {"type": "string"}},
        [],
    ),
    _tool(
        "status",
        "Show the state and new output of background jobs (commands started with a trailing &).",
        {"job": _JOB},
        [],
    ),
    _tool("stop", "Stop a background job.", {"job": _JOB}, ["job"]),
]
