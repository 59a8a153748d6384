"""The agent loop, independent of any UI: a prompt in, a stream of events out.

One run: the user's prompt is added to the conversation, then the model takes turns; each turn's
tool calls run (after the user's permission where needed) and their results go back to the
model, until it answers without calling a tool, the step limit is reached, the user cancels, or
the backend fails. The TUI, ``--print`` mode and the tests all consume the same events.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ds4mlx.agent import compaction
from ds4mlx.agent.backend import BackendError, ModelBackend
from ds4mlx.agent.checkpoints import CheckpointError, Checkpoints
from ds4mlx.agent.conversations import Conversation
from ds4mlx.agent.instructions import project_instructions
from ds4mlx.agent.kv_state import ConversationStates
from ds4mlx.agent.markup import MarkupFilter
from ds4mlx.agent.mentions import attach_mentions
from ds4mlx.agent.permissions import Decision, Permissions
from ds4mlx.agent.tool_schemas import SYSTEM_PROMPT
from ds4mlx.agent.tools import TOOLS_NEEDING_PERMISSION, ToolBox, ToolResult
from ds4mlx.generation import (
    Finished,
    PrefillProgress,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallError,
)

# ------------------------------------------------------------------------------ events


@dataclass(frozen=True)
class TurnStarted:
    step: int


@dataclass(frozen=True)
class TurnFinished:
    finished: Finished
    context_tokens: int  # the conversation's size after this turn


@dataclass(frozen=True)
class ToolStarted:
    call_id: str
    call: ToolCall


@dataclass
class PermissionRequest:
    """The consumer answers with ``answer()`` before asking for the next event; no answer
    means deny."""

    call_id: str
    call: ToolCall
    decision: Decision | None = None
    reason: str = ""  # given with a denial, for the model

    def answer(self, decision: Decision, reason: str = "") -> None:
        self.decision = decision
        self.reason = reason


@dataclass(frozen=True)
class ToolFinished:
    call_id: str
    call: ToolCall
    result: ToolResult


@dataclass(frozen=True)
class MalformedToolCall:
    call_id: str
    error: ToolCallError


@dataclass(frozen=True)
class CompactionStarted:
    tokens: int
    reason: str


@dataclass(frozen=True)
class CompactionFinished:
    tokens_before: int
    tokens_after: int
    note: str = ""  # why nothing changed, when nothing did

    @property
    def compacted(self) -> bool:
        return self.tokens_after < self.tokens_before


@dataclass(frozen=True)
class FilesAttached:
    """The files the prompt's ``@path`` mentions put into it, and the mentions refused."""

    attached: list[str]
    refused: list[str]


@dataclass(frozen=True)
class RunFinished:
    reason: str  # "answer", "step_limit", "cancelled", "context_full" or "error"
    answer: str = ""  # the last assistant text
    error: str = ""


AgentEvent = (
    TextDelta
    | ReasoningDelta
    | PrefillProgress
    | TurnStarted
    | TurnFinished
    | ToolStarted
    | PermissionRequest
    | ToolFinished
    | MalformedToolCall
    | CompactionStarted
    | CompactionFinished
    | FilesAttached
    | RunFinished
)


# ------------------------------------------------------------------------------ the agent


@dataclass
class AgentSettings:
    max_steps: int = 20  # model turns per prompt
    max_tokens: int = 1024  # per model turn
    thinking: bool = False
    system_prompt: str = SYSTEM_PROMPT


@dataclass
class _Turn:
    """What one model turn produced, in the order it produced it."""

    content: str = ""
    reasoning: str = ""
    actions: list[tuple[str, ToolCall | ToolCallError]] = field(default_factory=list)
    finished: Finished | None = None


class Agent:
    def __init__(
        self,
        backend: ModelBackend,
        toolbox: ToolBox,
        permissions: Permissions | None = None,
        settings: AgentSettings | None = None,
        conversation: Conversation | None = None,
    ):
        self.backend = backend
        self.toolbox = toolbox
        self.permissions = permissions or Permissions()
        self.settings = settings or AgentSettings()
        # Read once: a conversation started later in the session gets the same instructions.
        self.instructions = project_instructions(toolbox.workspace)
        self.conversation = conversation or self.new_conversation()
        # Where the conversation's model state is kept beside it (``kv_state``), if anywhere.
        self.states: ConversationStates | None = None
        self.running = False  # a run is under way (in some thread)
        self.cancel = threading.Event()
        self._call_ids = itertools.count(1)
        self.checkpoints = Checkpoints(toolbox.workspace.root)
        toolbox.before_change = self.checkpoints.before_file_change

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.conversation.messages

    def new_conversation(self) -> Conversation:
        system = self.settings.system_prompt
        if self.instructions is not None:
            system += self.instructions.system_section()
        return Conversation(
            [{"role": "system", "content": system}],
            workspace=str(self.toolbox.workspace.root),
        )

    def stop(self) -> None:
        """Stop the current generation or tool (from any thread); the run ends 'cancelled'."""
        self.cancel.set()

    def context_tokens(self) -> int:
        return self.backend.count_tokens(
            self.messages, self.toolbox.schemas, thinking=self.settings.thinking
        )

    # -------------------------------------------------------------------- a run

    def run(self, prompt: str) -> Iterator[AgentEvent]:
        """The events of one prompt; files it changes are checkpointed for /undo."""
        self.checkpoints.begin_prompt()
        self.running = True
        try:
            yield from self._run(prompt)
        finally:
            self.running = False
            self._checkpoint(self.checkpoints.end_prompt)

    def _checkpoint(self, step: Callable[[], None]) -> None:
        try:
            step()
        except (CheckpointError, OSError) as exc:  # the work goes on; /undo will say why
            self.checkpoints.problem = str(exc)

    def _run(self, prompt: str) -> Iterator[AgentEvent]:
        self.cancel.clear()
        attachments = attach_mentions(prompt, self.toolbox.workspace)
        if attachments.attached or attachments.refused:
            yield FilesAttached(attachments.attached, attachments.refused)
        self.messages.append({"role": "user", "content": attachments.message})
        answer = ""
        for step in range(1, self.settings.max_steps + 1):
            tokens = self.context_tokens()
            if compaction.should_compact(tokens, self.backend.context_size):
                yield from self.compact("the context is 85% full")
                if self.cancel.is_set():
                    yield RunFinished("cancelled", answer)
                    return
                tokens = self.context_tokens()
            room = self.backend.context_size - tokens - 1
            if room <= 0:
                # What frees room differs between the faces (/compact, a larger --ctx): the
                # reason tells them apart.
                yield RunFinished(
                    "context_full",
                    answer,
                    f"the conversation ({tokens} tokens) leaves no room in the context of "
                    f"{self.backend.context_size} tokens",
                )
                return
            yield TurnStarted(step)
            turn = _Turn()
            try:
                yield from self._model_turn(turn, room)
            except BackendError as exc:
                yield RunFinished("error", answer, str(exc))
                return
            answer = turn.content
            if self.cancel.is_set() or turn.finished is None:
                turn.actions.clear()  # calls that will never run must not look pending
                self._record_turn(turn)
                yield (
                    RunFinished("cancelled", answer)
                    if self.cancel.is_set()
                    else RunFinished("error", answer, "the model's stream ended unfinished")
                )
                return
            self._record_turn(turn)
            yield TurnFinished(
                turn.finished, turn.finished.prompt_tokens + turn.finished.completion_tokens
            )
            if not turn.actions:
                yield RunFinished("answer", answer)
                return
            for call_id, action in turn.actions:
                if self.cancel.is_set():
                    self._add_tool_result(call_id, "error: not run; the user stopped the agent")
                elif isinstance(action, ToolCallError):
                    yield MalformedToolCall(call_id, action)
                    self._add_tool_result(call_id, _malformed_call_report(action))
                else:
                    yield from self._run_tool(call_id, action)
            if self.cancel.is_set():
                yield RunFinished("cancelled", answer)
                return
        yield RunFinished(
            "step_limit", answer, f"stopped after {self.settings.max_steps} model turns"
        )

    def _model_turn(self, turn: _Turn, room: int) -> Iterator[AgentEvent]:
        """One model turn, of at most ``room`` tokens (what the context has left)."""
        events = self.backend.chat(
            self.messages,
            self.toolbox.schemas,
            max_tokens=min(self.settings.max_tokens, room),
            thinking=self.settings.thinking,
        )
        markup = MarkupFilter()
        with contextlib.closing(events):
            for event in events:
                if self.cancel.is_set():
                    return
                if isinstance(event, TextDelta):
                    yield from self._answer_text(turn, markup.feed(event.text))
                    continue
                if isinstance(event, Finished):  # what the filter held back comes first
                    yield from self._answer_text(turn, markup.finish())
                if isinstance(event, ReasoningDelta):
                    turn.reasoning += event.text
                    yield event
                elif isinstance(event, PrefillProgress):
                    yield event
                elif isinstance(event, ToolCallComplete):
                    turn.actions.append((self._new_call_id(), event.call))
                elif isinstance(event, ToolCallError):
                    turn.actions.append((self._new_call_id(), event))
                elif isinstance(event, Finished):
                    turn.finished = event

    def _answer_text(
        self, turn: _Turn, pieces: list[TextDelta | ToolCallError]
    ) -> Iterator[AgentEvent]:
        for piece in pieces:
            if isinstance(piece, TextDelta):
                turn.content += piece.text
                yield piece
            else:
                turn.actions.append((self._new_call_id(), piece))

    def _record_turn(self, turn: _Turn) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.reasoning:
            message["reasoning_content"] = turn.reasoning
        calls = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": action.name, "arguments": action.arguments},
            }
            for call_id, action in turn.actions
            if isinstance(action, ToolCall)
        ]
        if calls:
            message["tool_calls"] = calls
        self.messages.append(message)

    def _run_tool(self, call_id: str, call: ToolCall) -> Iterator[AgentEvent]:
        yield ToolStarted(call_id, call)
        failure = self.toolbox.would_fail(call)
        if failure is not None:  # nothing to allow: the model learns why at once
            self._add_tool_result(call_id, failure.output, is_error=True)
            yield ToolFinished(call_id, call, failure)
            return
        if self.permissions.must_ask(call):
            request = PermissionRequest(call_id, call)
            yield request
            decision = request.decision or Decision.DENY
            self.permissions.record(call, decision)
            if decision is Decision.DENY:
                why = f"; the user's reason: {request.reason}" if request.reason else ""
                result = ToolResult(
                    f"error: the user did not allow this {call.name} call{why}", is_error=True
                )
                self._add_tool_result(call_id, result.output, is_error=True)
                yield ToolFinished(call_id, call, result)
                return
        if call.name in TOOLS_NEEDING_PERMISSION:
            self._checkpoint(partial(self.checkpoints.before_tool, bash=call.name == "bash"))
        result = self.toolbox.run(call, self.cancel)
        self._add_tool_result(call_id, result.output, result.is_error)
        yield ToolFinished(call_id, call, result)

    def _add_tool_result(self, call_id: str, output: str, is_error: bool = True) -> None:
        message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": output}
        if is_error:  # kept so that a conversation drawn again shows the call as failed
            message["is_error"] = True
        self.messages.append(message)

    def _new_call_id(self) -> str:
        return f"call_{len(self.messages)}_{next(self._call_ids)}"

    # -------------------------------------------------------------------- context

    def compact(self, reason: str = "requested") -> Iterator[AgentEvent]:
        """Summarise older turns with the model; the conversation is left as it was when that
        would not make it smaller, or when the user cancels."""
        before = self.context_tokens()
        yield CompactionStarted(before, reason)
        budgets = compaction.Budgets.for_context(self.backend.context_size)
        plan = compaction.plan_compaction(self.messages, budgets, self._message_tokens)
        summary = ""
        if plan.older:
            try:
                summary = self._summarise(plan.older, budgets.summary)
            except BackendError as exc:
                yield CompactionFinished(before, before, f"the summary failed: {exc}")
                return
        if self.cancel.is_set():
            yield CompactionFinished(before, before, "cancelled")
            return
        compacted = compaction.assemble(
            plan, compaction.summary_message(summary, plan.older, self.toolbox.open_state())
        )
        after = self.backend.count_tokens(
            compacted, self.toolbox.schemas, thinking=self.settings.thinking
        )
        if after >= before:
            yield CompactionFinished(before, before, "nothing to compact")
            return
        self.messages[:] = compacted
        if self.states is not None:
            self.states.invalidate(self)
        yield CompactionFinished(before, after)

    def _summarise(self, older: list[dict[str, Any]], max_tokens: int) -> str:
        """The model's summary of ``older``."""
        text = compaction.transcript(older)
        # Cut the oldest part of the transcript until the request fits the context.
        while True:
            request = [
                {"role": "system", "content": compaction.SUMMARY_INSTRUCTIONS},
                {"role": "user", "content": text},
            ]
            size = self.backend.count_tokens(request, (), thinking=False)
            if size + max_tokens < self.backend.context_size or len(text) < 200:
                break
            text = text[len(text) - int(len(text) * 0.8) :]
        summary = ""
        events = self.backend.chat(request, (), max_tokens=max_tokens, thinking=False)
        with contextlib.closing(events):
            for event in events:
                if self.cancel.is_set():
                    break
                if isinstance(event, TextDelta):
                    summary += event.text
        return summary

    def _message_tokens(self, message: dict[str, Any]) -> int:
        return self.backend.count_tokens([message], (), thinking=False)

    def strip_tool_outputs(self) -> int:
        """Replace every tool result in the conversation by a placeholder; returns how many."""
        stripped = 0
        for message in self.messages:
            if message["role"] == "tool" and message["content"] != _STRIPPED:
                message["content"] = _STRIPPED
                stripped += 1
        return stripped


_STRIPPED = "[output removed from the context by /strip]"


def _malformed_call_report(error: ToolCallError) -> str:
    raw = error.raw if len(error.raw) <= 400 else error.raw[:400] + "..."
    return (
        f"error: the tool call could not be understood ({error.reason}); nothing was run. "
        f"Write the call again in the exact tool-call format. The call was:\n{raw}"
    )
