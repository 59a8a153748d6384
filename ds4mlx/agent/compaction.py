"""Context compaction: old turns become a summary written by the model, so the session goes on.

The compacted conversation is: the system prompt, one summary message (the model's summary,
the user's earlier requests and the open tool state: running jobs, changed files), the current
task if it would otherwise be lost, and the most recent messages verbatim. Compaction runs at
85% of the context and never earlier; it is refused when it would not make the context smaller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

COMPACT_AT = 0.85

SUMMARY_INSTRUCTIONS = (
    "You are compacting the transcript of a coding session so that it can continue in a "
    "smaller context. Summarise the transcript below as durable task state: the user's goals "
    "and constraints, files read or changed, commands run and their important results, "
    "decisions taken and the next steps. Keep exact paths, names and numbers. Do not invent "
    "anything, do not call tools and do not continue the task. Write only the summary."
)

SUMMARY_HEADER = "[Summary of the earlier conversation, written when the context was compacted]"

Message = dict[str, Any]

# Per-message limits when earlier turns are written out for the model to summarise.
_TRANSCRIPT_MESSAGE_CHARS = 1500
# A tool result kept verbatim after compaction may use at most this share of the tail budget.
_TAIL_TOOL_SHARE = 0.5


def should_compact(tokens: int, context_size: int) -> bool:
    """Compact at 85% of the context, never before (early compaction throws away context the
    user paid for)."""
    return tokens >= COMPACT_AT * context_size


@dataclass(frozen=True)
class Budgets:
    """Token budgets of a compacted conversation, from the context size."""

    summary: int
    tail: int
    task: int

    @classmethod
    def for_context(cls, context_size: int) -> Budgets:
        return cls(
            summary=max(context_size // 16, 32),
            tail=max(context_size // 10, 32),
            task=max(context_size // 20, 32),
        )


@dataclass
class CompactionPlan:
    system: list[Message]
    older: list[Message]  # summarised
    task: Message | None  # the latest user request, kept verbatim when not in the tail
    tail: list[Message]  # kept verbatim (tool outputs clipped)


def plan_compaction(
    messages: Sequence[Message], budgets: Budgets, count: Callable[[Message], int]
) -> CompactionPlan:
    """Split ``messages`` into what is kept and what is summarised; ``count`` gives a message's
    size in tokens."""
    system = [m for m in messages[:1] if m["role"] == "system"]
    body = list(messages[len(system) :])
    tail_start = len(body)
    used = 0
    for index in range(len(body) - 1, -1, -1):
        used += count(_clipped_for_tail(body[index], budgets))
        # The last turn is kept whatever its size (back to the message that opens it: tool
        # results stay with their call); earlier messages while they fit.
        if used > budgets.tail and tail_start < len(body):
            break
        if body[index]["role"] != "tool":
            tail_start = index
    older, tail = body[:tail_start], body[tail_start:]
    task_index = max((i for i, m in enumerate(body) if m["role"] == "user"), default=None)
    task = body[task_index] if task_index is not None and task_index < tail_start else None
    if task is not None:
        older = [m for m in older if m is not task]
        task = {**task, "content": _clip(task["content"], budgets.task * 4)}
    return CompactionPlan(system, older, task, [_clipped_for_tail(m, budgets) for m in tail])


def transcript(messages: Sequence[Message]) -> str:
    """Earlier turns as plain text for the summariser (long contents clipped)."""
    lines = []
    for message in messages:
        role = message["role"]
        content = _clip(message.get("content") or "", _TRANSCRIPT_MESSAGE_CHARS)
        if role == "tool":
            lines.append(f"Tool result: {content}")
        elif role == "assistant":
            if content:
                lines.append(f"Assistant: {content}")
            for call in message.get("tool_calls") or ():
                function = call["function"]
                arguments = ", ".join(
                    f"{k}={_clip(str(v), 200)!r}" for k, v in function["arguments"].items()
                )
                lines.append(f"Assistant called {function['name']}({arguments})")
        else:
            lines.append(f"{role.capitalize()}: {content}")
    return "\n".join(lines)


def summary_message(summary: str, older: Sequence[Message], open_state: str) -> Message:
    """The message standing for the summarised turns. The user's own requests and the open
    tool state are listed mechanically, so they survive even a poor summary."""
    requests = [
        _clip(m["content"], 300)
        for m in older
        if m["role"] == "user" and not m["content"].startswith(SUMMARY_HEADER)
    ]
    parts = [SUMMARY_HEADER, summary.strip() or "(the model wrote no summary)"]
    if requests:
        parts.append("Earlier requests from the user:\n" + "\n".join(f"- {r}" for r in requests))
    if open_state:
        parts.append("Open state:\n" + open_state)
    return {"role": "user", "content": "\n\n".join(parts)}


def assemble(plan: CompactionPlan, summary: Message) -> list[Message]:
    task = [plan.task] if plan.task is not None else []
    return [*plan.system, summary, *task, *plan.tail]


def _clipped_for_tail(message: Message, budgets: Budgets) -> Message:
    if message["role"] != "tool":
        return message
    limit = int(budgets.tail * _TAIL_TOOL_SHARE) * 4  # about four characters a token
    return {**message, "content": _clip(message["content"], limit)}


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f" [... {len(text) - limit} characters dropped at compaction]"
