"""A ModelBackend test double: each model turn plays back a scripted list of events."""

from __future__ import annotations

import copy
import json
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from ds4mlx.engine.chat import ChatEvent, TextDelta, ToolCall, ToolCallComplete, ToolCallError
from ds4mlx.generation import Finished

# A scripted turn is a list of events; a callable in it is called instead of yielded (to act
# at that moment, e.g. press Ctrl+C), and a threading.Event is waited for.
Step = ChatEvent | Callable[[], None] | threading.Event


def call(name: str, **arguments) -> ToolCallComplete:
    return ToolCallComplete(ToolCall(name, arguments))


def text(value: str) -> TextDelta:
    return TextDelta(value)


def malformed(raw: str = "<｜DSML｜invoke>", reason: str = "invoke tag without a name"):
    return ToolCallError(raw, reason)


class ScriptedBackend:
    name = "scripted"

    def __init__(
        self,
        turns: Sequence[Sequence[Step]] = (),
        context_size: int = 8192,
        default_answer: str = "done",
    ):
        self.turns = deque(list(turn) for turn in turns)
        self.context_size = context_size
        self.default_answer = default_answer
        self.requests: list[list[dict]] = []  # the messages of every chat request
        self.max_tokens: list[int] = []  # and the tokens each asked for at most
        self.thinking: list[bool] = []  # and whether each asked the model to reason
        self.closed = 0  # event streams closed before their end

    def chat(self, messages, tools, *, max_tokens: int, thinking: bool) -> Iterator:
        self.requests.append(copy.deepcopy(list(messages)))
        self.max_tokens.append(max_tokens)
        self.thinking.append(thinking)
        turn = self.turns.popleft() if self.turns else [text(self.default_answer)]
        finished = False
        try:
            for step in turn:
                if isinstance(step, threading.Event):
                    step.wait(10)
                elif callable(step):
                    step()
                else:
                    yield step
            prompt = self.count_tokens(messages, tools, thinking=thinking)
            finished = True
            yield Finished("stop", prompt, 5, 0)
        finally:
            if not finished:
                self.closed += 1

    def count_tokens(self, messages, tools, *, thinking: bool) -> int:
        # Four characters a token, like the OpenAI backend's estimate.
        return len(json.dumps([list(messages), list(tools)], ensure_ascii=False)) // 4

    def expert_hit_rate(self) -> float | None:
        return None


class SizedBackend(ScriptedBackend):
    """A backend whose every prompt counts ``size`` tokens, to place a conversation exactly
    at the end of the context."""

    def __init__(self, turns=(), *, size: int, context_size: int):
        super().__init__(turns, context_size=context_size)
        self.size = size

    def count_tokens(self, messages, tools, *, thinking: bool) -> int:
        return self.size
