"""The generation API the faces use: messages or a prompt in, a stream of events out.

``ChatService`` owns one loaded model, its drafter and one session that it reuses across
requests when a new prompt extends what the session already holds (a conversation growing turn
by turn), so only the new tokens are prefilled. It renders messages with the model's chat
format, decodes tokens to text without splitting characters, cuts at stop strings, and parses
the model's reasoning and tool calls while streaming. The agent and the server both drive it;
it serves one request at a time (callers serialise).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ds4mlx.engine.chat import ChatEvent, ReasoningDelta, TextDelta, ToolCallComplete
from ds4mlx.engine.generate import DoneEvent, GenerationStats
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.session import Session, Snapshot
from ds4mlx.speculation import generate
from ds4mlx.speculation.config import SpeculationConfig
from ds4mlx.speculation.drafter import Drafter


@dataclass(frozen=True)
class Finished:
    """The last event of a request."""

    finish_reason: str  # "stop", "length", "tool_calls" or "context"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens reused from the session instead of prefilled
    stats: GenerationStats = field(default_factory=GenerationStats)
    seconds: float = 0.0


ServiceEvent = ChatEvent | Finished


class _StopMatcher:
    """Cuts a text stream at the first stop string; holds back text that may start one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        self.pending += text
        for stop in self.stops:
            at = self.pending.find(stop)
            if at >= 0:
                self.stopped = True
                out, self.pending = self.pending[:at], ""
                return out
        hold = max((k for s in self.stops for k in range(1, len(s))
                    if self.pending.endswith(s[:k])), default=0)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def finish(self) -> str:
        out, self.pending = self.pending, ""
        return out


class ChatService:
    def __init__(self, model, drafter: Drafter | None = None,
                 speculation: SpeculationConfig | None = None, max_context: int = 4096):
        self.model = model
        self.drafter = drafter
        self.speculation = speculation or SpeculationConfig()
        self.max_context = max_context
        self._session: Session | None = None
        # The session right after the previous prompt's prefill: a conversation whose next
        # prompt re-renders the assistant's turn differently still reuses the prompt before it.
        self._prompt_snapshot: tuple[list[int], Snapshot] | None = None

    # ------------------------------------------------------------------ requests

    def chat(self, messages: Sequence[Mapping[str, Any]],
             tools: Sequence[Mapping[str, Any]] | None = None, *, max_tokens: int = 512,
             sampling: SamplingOptions | None = None, stop: Sequence[str] = (),
             thinking: bool = False) -> Iterator[ServiceEvent]:
        """Generate the assistant's next turn: text, reasoning and tool-call events, then
        Finished."""
        chat_format = self.model.chat_format
        if chat_format is None:
            raise ValueError(f"{self.model.path.name} has no chat template")
        prompt = chat_format.render(messages, tools, thinking=thinking)
        tokens = self.model.tokenizer.encode(prompt, add_special=False)
        parser = chat_format.stream_parser(thinking=thinking)
        yield from self._run(tokens, max_tokens, sampling, stop, parser)

    def complete(self, prompt: str, *, max_tokens: int = 256,
                 sampling: SamplingOptions | None = None,
                 stop: Sequence[str] = ()) -> Iterator[ServiceEvent]:
        """Continue raw ``prompt`` text (no chat template): TextDelta events, then Finished."""
        tokens = self.model.tokenizer.encode(prompt, add_special=True)
        yield from self._run(tokens, max_tokens, sampling, stop, None)

    def count_tokens(self, text: str) -> int:
        return len(self.model.tokenizer.encode(text, add_special=False))

    # ------------------------------------------------------------------ internals

    def _run(self, tokens: list[int], max_tokens: int, sampling: SamplingOptions | None,
             stop: Sequence[str], parser) -> Iterator[ServiceEvent]:
        if not tokens:
            raise ValueError("the prompt is empty")
        if len(tokens) >= self.max_context:
            raise ValueError(f"the prompt has {len(tokens)} tokens; the context is "
                             f"{self.max_context}")
        started = time.perf_counter()
        session, cached = self._session_for(tokens)
        tokenizer = self.model.tokenizer
        detokenizer = tokenizer.streaming_detokenizer(skip_special=True)
        stops = _StopMatcher(stop)
        saw_tool_call = False
        stats = GenerationStats()
        completion = 0

        def emit(text: str) -> list[ChatEvent]:
            nonlocal saw_tool_call
            events = parser.feed(text) if parser is not None else [TextDelta(text)]
            saw_tool_call |= any(isinstance(e, ToolCallComplete) for e in events)
            return [e for e in events if not (isinstance(e, (TextDelta, ReasoningDelta))
                                              and not e.text)]

        stream = generate(session, tokens[cached:], max_tokens, sampling, self.drafter,
                          self.speculation, stop_tokens=tokenizer.stop_ids,
                          max_context=self.max_context)
        try:
            for event in stream:
                if isinstance(event, DoneEvent):
                    stats = event.stats
                    break
                if completion == 0:
                    # The first token comes right after the prefill: the session holds exactly
                    # the prompt now, the best restore point for the next request.
                    self._prompt_snapshot = (list(session.tokens), session.snapshot())
                completion += 1
                if event.token in tokenizer.stop_ids:
                    continue
                yield from emit(stops.feed(detokenizer.add(event.token)))
                if stops.stopped:
                    stats.stop_reason = "stop"
                    break
        finally:
            stream.close()
        tail = stops.feed(detokenizer.finish()) + stops.finish() if not stops.stopped else ""
        yield from emit(tail)
        if parser is not None:
            for event in parser.finish():
                saw_tool_call |= isinstance(event, ToolCallComplete)
                yield event
        reason = stats.stop_reason or "stop"
        if saw_tool_call and reason == "stop":
            reason = "tool_calls"
        yield Finished(reason, len(tokens), completion, cached, stats,
                       time.perf_counter() - started)

    def _session_for(self, tokens: list[int]) -> tuple[Session, int]:
        """A session holding a prefix of ``tokens`` (and how long it is), leaving at least one
        token to feed; a snapshot of it after the prompt is kept for the next request."""
        session = self._session
        if session is not None:
            shared = _common_prefix(session.tokens, tokens[:-1])
            if shared < session.n_tokens:
                try:
                    session.truncate(shared)
                except ValueError:
                    session = self._restore_prompt_snapshot(tokens)
        if session is None:
            session = self.model.new_session()
        self._session = session
        return session, session.n_tokens

    def _restore_prompt_snapshot(self, tokens: list[int]) -> Session | None:
        if self._prompt_snapshot is None or self._session is None:
            return None
        prompt, snapshot = self._prompt_snapshot
        if _common_prefix(prompt, tokens[:-1]) < len(prompt):
            return None
        self._session.restore(snapshot)
        return self._session


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
