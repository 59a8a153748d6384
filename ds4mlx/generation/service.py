"""The chat service: messages or a prompt in, a stream of events out.

``ChatService`` owns one loaded model, its drafter and its sessions (one unless the server
batches), which it reuses across requests when a new prompt extends what a session already
holds (a conversation growing turn by turn), so only the new tokens are prefilled. It renders
messages with the model's chat format, decodes tokens to text without splitting characters,
cuts at stop strings, and parses the model's reasoning and tool calls while streaming. The agent
and the server both drive it, from one thread; no more generations may run at once than it has
sessions (the server's engine thread admits that many). With a ``PromptCache`` the state after
each prompt's prefill is kept (in memory, and on disk when the cache has a disk tier), and a
prompt that starts with a kept state restores it instead of prefilling those tokens again.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ds4mlx.engine.chat import (
    ChatEvent,
    ChatFormat,
    NamedTool,
    ReasoningDelta,
    StreamParser,
    TextDelta,
    ToolCallComplete,
    ToolChoice,
)
from ds4mlx.engine.constraints import (
    CallConstraint,
    Constraint,
    JsonConstraint,
    JsonFormat,
    markup_ban,
)
from ds4mlx.engine.generate import DecodeStep, DoneEvent, GenerationStats
from ds4mlx.engine.kvcache import MAX_CUT, PromptCache, common_prefix
from ds4mlx.engine.sampling import SamplingOptions, TokenLogprob
from ds4mlx.engine.session import Session, Snapshot, supports_batched_decode
from ds4mlx.generation.events import (
    Finished,
    GenerationCancelled,
    ScheduledEvent,
    TokenLogprobs,
)
from ds4mlx.generation.tokens import stepped
from ds4mlx.speculation.config import SpeculationConfig
from ds4mlx.speculation.drafter import Drafter
from ds4mlx.speculation.loop import DrafterLease

import mlx.core as mx

# Prompt tokens fed per step when a request asks for prefill progress: a step is what a
# cancellation waits for at most (the consumer closes the stream between steps).
PREFILL_CHUNK = 512


@dataclass(frozen=True)
class PrefillProgress:
    """Yielded after each chunk of a chunked prefill (``ChatService.chat(report_prefill=True)``):
    ``done`` of the ``total`` prompt tokens not taken from a cache, in ``seconds``. Closing the
    stream here stops the prefill; the session keeps the chunks done, so the same prompt sent
    again goes on from them."""

    done: int
    total: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0


class _StopMatcher:
    """Cuts a text stream at the first stop string; holds back text that may start one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def feed(self, text: str) -> str:
        self.pending += text
        hits = [(at, stop) for stop in self.stops if (at := self.pending.find(stop)) >= 0]
        if hits:
            at, self.matched = min(hits)  # the stop string that appears first
            out, self.pending = self.pending[:at], ""
            return out
        hold = max(
            (k for s in self.stops for k in range(1, len(s)) if self.pending.endswith(s[:k])),
            default=0,
        )
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
        return out

    def finish(self) -> str:
        out, self.pending = self.pending, ""
        return out


@dataclass(frozen=True)
class _ChunkedPrefill:
    """The prompt tokens fed in chunks before a generation, and how long they took."""

    tokens: int = 0
    seconds: float = 0.0


@dataclass
class _Slot:
    """One session of the service and the restore point after its last prompt's prefill."""

    session: Session
    busy: bool = False
    # The session right after the previous prompt's prefill: a conversation whose next prompt
    # re-renders the assistant's turn differently still reuses the prompt before it.
    prompt_snapshot: tuple[list[int], Snapshot] | None = None
    last_used: int = 0  # when a request last took it (the service's request count)


class ChatService:
    """See the module notes. ``sessions`` > 1 serves that many requests at once (the server's
    ``--batched-session``): each gets a session of its own, and its generation yields a
    DecodeStep before every decode step so that the scheduler can decode the steps of all
    running requests in one batched pass (``engine.session.feed_batch``). A step the scheduler
    answers with None is decoded alone, speculatively when the drafter still follows it.
    ``prompt_cache``: where prompt states are kept beyond the sessions (see the module notes)."""

    def __init__(
        self,
        model,
        drafter: Drafter | None = None,
        speculation: SpeculationConfig | None = None,
        max_context: int = 4096,
        sessions: int = 1,
        prompt_cache: PromptCache | None = None,
    ):
        if sessions < 1:
            raise ValueError(f"sessions must be at least 1, got {sessions}")
        if sessions > 1 and not supports_batched_decode(model.network):
            raise ValueError(
                f"{model.path.name} ({model.gguf.arch}) has no batched decode: "
                "serve it one session at a time"
            )
        self.model = model
        self.drafter = drafter
        self.speculation = speculation or SpeculationConfig()
        self.max_context = max_context
        self.sessions = sessions
        self.prompt_cache = prompt_cache
        self._slots: list[_Slot] = []
        self._requests = 0
        self._lease = DrafterLease()

    # ------------------------------------------------------------------ requests

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        max_tokens: int = 512,
        sampling: SamplingOptions | None = None,
        stop: Sequence[str] = (),
        thinking: bool = False,
        reasoning_effort: str | None = None,
        tool_choice: ToolChoice = "auto",
        prompt_tokens: Sequence[int] | None = None,
        stream_arguments: bool = False,
        report_prefill: bool = False,
        output_format: JsonFormat | None = None,
        parallel_tool_calls: bool = True,
    ) -> Generator[ScheduledEvent | PrefillProgress, mx.array | None, None]:
        """Generate the assistant's next turn: text, reasoning and tool-call events, then
        Finished. ``reasoning_effort`` is mapped onto the efforts the chat template knows
        (``ChatFormat.template_effort``); ``tool_choice`` as ``ChatFormat.prompt``.
        ``prompt_tokens``: the prompt already tokenized by :meth:`chat_prompt` with the same
        arguments (a server does that before queueing the request). ``stream_arguments``: tool
        calls are also reported while they are written (``ChatFormat.stream_parser``).
        ``report_prefill``: a long prompt is prefilled in chunks of ``PREFILL_CHUNK`` tokens,
        with a ``PrefillProgress`` after each (a point to stop at, see there).

        Decoding is constrained (``engine.constraints``): a call the model opens is held to
        the template's syntax, naming an offered tool, its arguments held to the tool's schema
        when it is ``strict`` or the choice forced; without tools (or with "none") call markup
        is never sampled; ``output_format`` holds the answer to JSON (after the reasoning);
        without ``parallel_tool_calls`` a turn makes at most one call."""
        tokens = (
            list(prompt_tokens)
            if prompt_tokens is not None
            else self.chat_prompt(
                messages,
                tools,
                thinking=thinking,
                reasoning_effort=reasoning_effort,
                tool_choice=tool_choice,
            )
        )
        parser = self._chat_format().stream_parser(
            thinking=thinking,
            tools=tools,
            tool_choice=tool_choice,
            stream_arguments=stream_arguments,
        )
        constraint = self._chat_constraint(
            tools, tool_choice, thinking, output_format, parallel_tool_calls
        )
        yield from self._run(tokens, max_tokens, sampling, stop, parser, report_prefill, constraint)

    def _chat_constraint(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: ToolChoice,
        thinking: bool,
        output_format: JsonFormat | None,
        parallel_tool_calls: bool,
    ) -> Constraint | None:
        """The constraint of a chat turn (see ``chat``). A forced tool choice wins over an
        output format: the prompt has opened the call; a named one makes that one call."""
        chat_format = self._chat_format()
        forced = bool(chat_format.forced_call_prefix(tool_choice))
        reasoning_end = chat_format.reasoning_end if thinking and not forced else None
        tokenizer = self.model.tokenizer
        if output_format is not None and not forced:
            return JsonConstraint(tokenizer, output_format.schema, reasoning_end)
        if not tools or tool_choice == "none":
            return markup_ban(tokenizer, chat_format.call_marker)
        parallel = parallel_tool_calls and not isinstance(tool_choice, NamedTool)
        syntax = chat_format.call_syntax(tools, tool_choice, parallel)
        return CallConstraint(tokenizer, chat_format.call_marker, syntax, reasoning_end)

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        thinking: bool = False,
        reasoning_effort: str | None = None,
        tool_choice: ToolChoice = "auto",
    ) -> list[int]:
        """The prompt tokens ``chat`` generates after; touches no MLX state, so any thread
        may call it."""
        chat_format = self._chat_format()
        options = {}
        effort = (
            chat_format.template_effort(reasoning_effort)
            if thinking and reasoning_effort is not None
            else None
        )
        if effort is not None:
            options["reasoning_effort"] = effort
        return chat_format.tokenize(
            self.model.tokenizer,
            messages,
            tools,
            thinking=thinking,
            tool_choice=tool_choice,
            **options,
        )

    def _chat_format(self) -> ChatFormat:
        chat_format = self.model.chat_format
        if chat_format is None:
            raise ValueError(f"{self.model.path.name} has no chat template")
        return chat_format

    def complete(
        self,
        prompt: str,
        *,
        max_tokens: int = 256,
        sampling: SamplingOptions | None = None,
        stop: Sequence[str] = (),
        output_format: JsonFormat | None = None,
    ) -> Generator[ScheduledEvent, mx.array | None, None]:
        """Continue raw ``prompt`` text (no chat template): TextDelta events, then Finished;
        ``output_format`` holds the continuation to JSON."""
        tokens = self.model.tokenizer.encode(prompt, add_special=True)
        constraint = (
            JsonConstraint(self.model.tokenizer, output_format.schema)
            if output_format is not None
            else None
        )
        yield from self._run(tokens, max_tokens, sampling, stop, None, constraint=constraint)

    def count_tokens(self, text: str) -> int:
        return len(self.model.tokenizer.encode(text, add_special=False))

    # ------------------------------------------------------------------ internals

    def _run(
        self,
        tokens: list[int],
        max_tokens: int,
        sampling: SamplingOptions | None,
        stop: Sequence[str],
        parser: StreamParser | None,
        report_prefill: bool = False,
        constraint: Constraint | None = None,
    ) -> Generator[ScheduledEvent | PrefillProgress, mx.array | None, None]:
        if not tokens:
            raise ValueError("the prompt is empty")
        if len(tokens) >= self.max_context:
            raise ValueError(
                f"the prompt has {len(tokens)} tokens; the context is {self.max_context}"
            )
        started = time.perf_counter()
        slot = self._slot_for(tokens)
        before = slot.prompt_snapshot
        try:
            if self.prompt_cache is not None:
                self._restore_longest(slot.session, tokens)
            cached = slot.session.n_tokens
            prefill = _ChunkedPrefill()
            if report_prefill:
                prefill = yield from self._prefill_chunks(slot.session, tokens)
            yield from self._generate(
                slot,
                tokens,
                max_tokens,
                sampling,
                stop,
                parser,
                started,
                cached,
                prefill,
                constraint,
            )
        finally:
            slot.busy = False
            # Written after the answer, so the disk costs the request no time to first token.
            if self.prompt_cache is not None and slot.prompt_snapshot is not before:
                assert slot.prompt_snapshot is not None
                self.prompt_cache.persist(slot.prompt_snapshot[1])

    @staticmethod
    def _prefill_chunks(
        session: Session, tokens: list[int]
    ) -> Generator[PrefillProgress, None, _ChunkedPrefill]:
        """Feed all but the last chunk of the prompt's new tokens, reporting each; the last
        chunk is left to the generation (its logits give the first token, and the drafter
        observes it)."""
        begin = session.n_tokens
        total = len(tokens) - begin
        started = time.perf_counter()
        while len(tokens) - session.n_tokens > PREFILL_CHUNK:
            at = session.n_tokens
            logits = session.feed_mx(tokens[at : at + PREFILL_CHUNK], all_logits=False)
            mx.eval(logits[-1])  # the chunk is computed here, not queued for the next one
            yield PrefillProgress(session.n_tokens - begin, total, time.perf_counter() - started)
        return _ChunkedPrefill(session.n_tokens - begin, time.perf_counter() - started)

    def _generate(
        self,
        slot: _Slot,
        tokens: list[int],
        max_tokens: int,
        sampling: SamplingOptions | None,
        stop: Sequence[str],
        parser: StreamParser | None,
        started: float,
        cached: int,
        prefill: _ChunkedPrefill,
        constraint: Constraint | None = None,
    ) -> Generator[ScheduledEvent, mx.array | None, None]:
        """The generation after the prompt's first ``cached`` tokens came from a cache and
        ``prefill`` fed some more in chunks."""
        session = slot.session
        tokenizer = self.model.tokenizer
        detokenizer = tokenizer.streaming_detokenizer(skip_special=True)
        stops = _StopMatcher(stop)
        saw_tool_call = False
        stats = GenerationStats()
        completion = reasoning = 0

        def emit(text: str) -> list[ChatEvent]:
            nonlocal saw_tool_call
            events = parser.feed(text) if parser is not None else [TextDelta(text)]
            saw_tool_call |= any(isinstance(e, ToolCallComplete) for e in events)
            return [
                e for e in events if not (isinstance(e, (TextDelta, ReasoningDelta)) and not e.text)
            ]

        stream = stepped(
            session,
            tokens[session.n_tokens :],
            max_tokens,
            sampling,
            self.drafter,
            self.speculation,
            stop_tokens=tokenizer.stop_ids,
            max_context=self.max_context,
            lease=self._lease,
            constraint=constraint,
        )
        reply: mx.array | None = None
        cancelled = False
        try:
            while True:
                event = stream.send(reply)
                reply = None
                if isinstance(event, DecodeStep):
                    if self.sessions > 1:
                        reply = yield event
                    continue
                if isinstance(event, DoneEvent):
                    stats = event.stats
                    # The whole prefill, the chunks fed before the generation included.
                    stats.prompt_tokens += prefill.tokens
                    stats.prefill_seconds += prefill.seconds
                    break
                if completion == 0:
                    self._remember_prompt(slot)
                completion += 1
                # The parser's state before this token's text: a token that closes the
                # reasoning block still belongs to it.
                reasoning += parser is not None and parser.reasoning
                if event.token in tokenizer.stop_ids:
                    continue
                if event.logprob is not None:
                    yield self._logprobs_event(event.logprob)
                yield from emit(stops.feed(detokenizer.add(event.token)))
                if stops.stopped:
                    stats.stop_reason = "stop"
                    break
        except GenerationCancelled:
            cancelled = True
        finally:
            stream.close()
        if cancelled:  # the client went away: nothing more to show, only what it cost
            reason = "cancelled"
        else:
            tail = stops.feed(detokenizer.finish()) + stops.finish() if not stops.stopped else ""
            yield from emit(tail)
            if parser is not None:
                for event in parser.finish():
                    saw_tool_call |= isinstance(event, ToolCallComplete)
                    yield event
            reason = stats.stop_reason or "stop"
            if saw_tool_call and reason == "stop":
                reason = "tool_calls"
        yield Finished(
            reason,
            len(tokens),
            completion,
            cached,
            stats,
            time.perf_counter() - started,
            stops.matched,
            reasoning,
        )

    def _remember_prompt(self, slot: _Slot) -> None:
        """At the first token, right after the prefill, the session holds exactly the prompt:
        the best restore point for the next request."""
        slot.prompt_snapshot = (list(slot.session.tokens), slot.session.snapshot())
        if self.prompt_cache is not None:
            self.prompt_cache.remember(slot.prompt_snapshot[1])

    def _logprobs_event(self, logprob: TokenLogprob) -> TokenLogprobs:
        tokenizer = self.model.tokenizer

        def spelled(token: int) -> tuple[str, bytes]:
            piece = tokenizer.token_bytes(token)
            return piece.decode("utf-8", "replace"), piece

        text, piece = spelled(logprob.token)
        return TokenLogprobs(
            text, piece, logprob.logprob, tuple((*spelled(t), value) for t, value in logprob.top)
        )

    def _slot_for(self, tokens: list[int]) -> _Slot:
        """The slot to run ``tokens`` on (leaving at least one token to feed):

        * a free slot whose whole cache is a prefix of ``tokens``, the longest one (a
          conversation continued, or an empty slot);
        * else a new slot while fewer than ``sessions`` exist: a conversation that shares only
          a system prompt with a cached one must not wipe it while room is left (ds4's
          #765/#1069);
        * else the free slot sharing the longest prefix, cut back to it (of slots sharing as
          much, the least recently used)."""
        free = [slot for slot in self._slots if not slot.busy]
        shares = [common_prefix(slot.session.tokens, tokens[:-1]) for slot in free]
        extending = [i for i, slot in enumerate(free) if shares[i] == slot.session.n_tokens]
        if extending:
            slot = free[max(extending, key=shares.__getitem__)]
        elif len(self._slots) < self.sessions:
            slot = _Slot(self.model.new_session())
            self._slots.append(slot)
        elif free:
            best = max(range(len(free)), key=lambda i: (shares[i], -free[i].last_used))
            slot = free[best]
            self._rewind(slot, tokens, shares[best])
        else:
            raise RuntimeError(f"all {self.sessions} sessions are busy")
        slot.busy = True
        self._requests += 1
        slot.last_used = self._requests
        return slot

    def _rewind(self, slot: _Slot, tokens: list[int], shared: int) -> None:
        """Cut ``slot``'s session back to the ``shared`` tokens it has in common with
        ``tokens``: by rollback when that is short, else from the prompt snapshot, else from
        scratch."""
        session = slot.session
        if shared >= session.n_tokens:
            return
        try:
            session.truncate(shared)
            return
        except ValueError:
            pass
        if slot.prompt_snapshot is not None:
            prompt, snapshot = slot.prompt_snapshot
            if common_prefix(prompt, tokens[:-1]) == len(prompt):
                session.restore(snapshot)
                return
        slot.session = self.model.new_session()

    def _restore_longest(
        self, session: Session, tokens: list[int], live: Sequence[Snapshot] = ()
    ) -> None:
        """Restore into ``session`` the longest state usable for ``tokens`` that the prompt
        cache (or ``live``) holds, when it shares more than the session does; a state that
        holds a few tokens past the shared prefix is rolled back to it where the model can."""
        assert self.prompt_cache is not None
        have = session.n_tokens
        found: list[tuple[int, int, Any]] = []
        for snapshot in live:
            share = common_prefix(snapshot.tokens, tokens[:-1])
            if share > have and snapshot.n_tokens - share <= MAX_CUT:
                found.append((share, snapshot.n_tokens - share, snapshot))
        for candidate in self.prompt_cache.candidates(tokens, longer_than=have):
            found.append((candidate.share, candidate.cut, candidate))
        found.sort(key=lambda item: (-item[0], item[1]))
        for share, cut, source in found:
            snapshot = source if isinstance(source, Snapshot) else self.prompt_cache.load(source)
            if snapshot is None:
                continue
            previous = session.snapshot()
            session.restore(snapshot)
            if not cut:
                return
            try:
                session.truncate(share)
                return
            except ValueError:  # the model cannot roll this state back that far
                session.restore(previous)

    def cached_state(self, tokens: Sequence[int]) -> Snapshot | None:
        """The longest state, of the idle sessions and the prompt cache, that a prompt of
        ``tokens`` can continue (a conversation's state to keep beside it); None when nothing
        is held."""
        if self.prompt_cache is None:
            return None
        live = [slot.session.snapshot() for slot in self._slots if not slot.busy]
        session = self.model.new_session()
        self._restore_longest(
            session,
            list(tokens),
            [s for s in live if getattr(s.state, "pos", s.n_tokens) == s.n_tokens],
        )
        return session.snapshot() if session.n_tokens else None

    def adopt(self, snapshot: Snapshot) -> None:
        """Keep a state restored from elsewhere (a conversation's saved state) in the prompt
        cache, so that the next prompt that continues it starts from it."""
        if self.prompt_cache is None:
            raise ValueError("this service has no prompt cache")
        self.prompt_cache.remember(snapshot)
