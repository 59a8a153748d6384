"""Where the agent's model turns come from: the in-process engine, or an OpenAI-compatible server.

Both backends speak the generation API's event vocabulary (``TextDelta``, ``ReasoningDelta``,
``ToolCallComplete``, ``ToolCallError``, then ``Finished``; the local one also
``PrefillProgress`` while it prefills), so the agent loop does not know which one it talks to.
Closing a backend's event iterator stops the generation (a local prefill at its next chunk).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ds4mlx.generation import (
    MAX_CUT,
    ChatEvent,
    ChatService,
    Finished,
    GenerationStats,
    PrefillProgress,
    ReasoningDelta,
    SamplingOptions,
    SnapshotFileError,
    TextDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallError,
    common_prefix,
    model_fingerprint,
    read_snapshot,
    write_snapshot,
)

BackendEvent = ChatEvent | PrefillProgress | Finished
Message = Mapping[str, Any]
Tools = Sequence[Mapping[str, Any]]

# Without a tokenizer, the OpenAI backend estimates tokens from characters: about 4 per token
# for English and code with BPE vocabularies until the server's usage report of a request gives
# the ratio of this conversation.
_CHARS_PER_TOKEN = 4.0
# Fields in which servers report a model's context size in /v1/models (vLLM, LM Studio,
# OpenRouter, llama.cpp's "meta").
_CONTEXT_FIELDS = (
    "context_length",
    "max_model_len",
    "context_window",
    "n_ctx",
    "max_context_length",
)


class BackendError(Exception):
    """The model could not produce a turn (prompt too long, server unreachable, ...)."""


class ModelBackend(Protocol):
    name: str
    context_size: int

    def chat(
        self, messages: Sequence[Message], tools: Tools, *, max_tokens: int, thinking: bool
    ) -> Iterator[BackendEvent]:
        """The assistant's next turn as events, ending with Finished; BackendError when the
        request cannot be served."""
        ...

    def count_tokens(self, messages: Sequence[Message], tools: Tools, *, thinking: bool) -> int:
        """How many context tokens the prompt for ``messages`` takes."""
        ...

    def expert_hit_rate(self) -> float | None:
        """The streamed expert cache's hit rate so far (the status bar shows it); None when
        there is none to show."""
        ...


class LocalBackend:
    """The in-process engine through ChatService (speculation included)."""

    def __init__(
        self, service: ChatService, sampling: SamplingOptions | None = None, name: str | None = None
    ):
        if service.model.chat_format is None:
            raise BackendError(f"{service.model.path.name} has no chat template")
        self.service = service
        self.sampling = sampling
        self.name = name or service.model.path.stem
        self.context_size = service.max_context
        self._fingerprint: str | None = None

    @property
    def keeps_states(self) -> bool:
        """Whether conversations' model states can be saved and restored (the service has a
        prompt cache to hand them to)."""
        return self.service.prompt_cache is not None

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.service.model)
        return self._fingerprint

    def _next_prompt(self, messages: Sequence[Message], tools: Tools, thinking: bool) -> list[int]:
        """The start of the prompt of the conversation's next turn: a user message follows."""
        return self.service.chat_prompt(
            [*messages, {"role": "user", "content": ""}], tools, thinking=thinking
        )

    def save_state(
        self, path: Path, messages: Sequence[Message], tools: Tools, *, thinking: bool
    ) -> int:
        """Write to ``path`` the longest model state the conversation's next turn can start
        from; returns its tokens (0: none is held, nothing written). OSError when it cannot be
        written."""
        snapshot = self.service.cached_state(self._next_prompt(messages, tools, thinking))
        if snapshot is None:
            return 0
        write_snapshot(path, snapshot, self.fingerprint)
        return snapshot.n_tokens

    def restore_state(
        self, path: Path, messages: Sequence[Message], tools: Tools, *, thinking: bool
    ) -> int:
        """Hand the state saved in ``path`` to the service, so that the conversation's next
        turn starts from it; returns how many of its tokens the turn will reuse.
        SnapshotFileError when the file cannot be used: another model, damaged, or stale (the
        conversation changed since, e.g. by compaction)."""
        snapshot = read_snapshot(path, self.fingerprint)
        share = common_prefix(snapshot.tokens, self._next_prompt(messages, tools, thinking)[:-1])
        if snapshot.n_tokens - share > MAX_CUT:
            raise SnapshotFileError(f"{path}: stale (the conversation changed after it was saved)")
        self.service.adopt(snapshot)
        return share

    def chat(
        self, messages: Sequence[Message], tools: Tools, *, max_tokens: int, thinking: bool
    ) -> Iterator[BackendEvent]:
        # Chunked, with progress: the agent shows it and can stop between chunks.
        stream = self.service.chat(
            messages,
            tools,
            max_tokens=max_tokens,
            sampling=self.sampling,
            thinking=thinking,
            report_prefill=True,
        )
        try:
            yield from stream
        except ValueError as exc:  # the prompt does not fit the context
            raise BackendError(str(exc)) from exc
        finally:
            stream.close()

    def count_tokens(self, messages: Sequence[Message], tools: Tools, *, thinking: bool) -> int:
        prompt = self.service.model.chat_format.render(messages, tools, thinking=thinking)
        return self.service.count_tokens(prompt)

    def expert_hit_rate(self) -> float | None:
        """The streamed expert cache's hit rate so far; None when experts are resident."""
        stats = self.service.model.expert_stats()
        return None if stats is None or stats.kind == "resident" else stats.hit_rate


class OpenAIBackend:
    """Any server with an OpenAI-compatible ``/v1/chat/completions`` (ds4-server, llama.cpp,
    vLLM, ...), streamed with the official client."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "none",
        context_size: int = 4096,
        sampling: SamplingOptions | None = None,
        timeout: float = 600.0,
    ):
        import openai  # imported here: the local engine path does not need it

        self._openai = openai
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout)
        self.name = model
        self.context_size = context_size
        self.sampling = sampling or SamplingOptions()
        self.chars_per_token = _CHARS_PER_TOKEN
        self._request_chars = 0  # the size of the last request, to calibrate the estimate

    def server_context_size(self) -> int | None:
        """The model's context size as the server reports it in /v1/models, if it does."""
        try:
            card = self.client.with_options(timeout=5.0, max_retries=0).models.retrieve(self.name)
        except self._openai.OpenAIError:
            return None
        fields = dict(card.model_extra or {})
        fields.update(fields.get("meta") or {})
        for name in _CONTEXT_FIELDS:
            value = fields.get(name)
            if isinstance(value, int) and value > 0:
                return value
        return None

    def chat(
        self, messages: Sequence[Message], tools: Tools, *, max_tokens: int, thinking: bool
    ) -> Iterator[BackendEvent]:
        options: dict[str, Any] = {
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
        }
        if self.sampling.seed is not None:
            options["seed"] = self.sampling.seed
        if tools:  # an explicit null is refused by some servers
            options["tools"] = list(tools)
        if thinking:
            # DeepSeek's switch; servers that do not know it ignore unknown fields.
            options["extra_body"] = {"thinking": {"type": "enabled"}}
        started = time.perf_counter()
        self._request_chars = self._chars(messages, tools)
        try:
            stream = self.client.chat.completions.create(
                model=self.name,
                messages=openai_messages(messages),
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
                **options,
            )
        except self._openai.OpenAIError as exc:
            raise BackendError(f"{self.client.base_url}: {exc}") from exc
        try:
            yield from self._events(stream, started)
        except self._openai.OpenAIError as exc:
            raise BackendError(f"{self.client.base_url}: {exc}") from exc
        finally:
            stream.close()

    def _events(self, stream, started: float) -> Iterator[BackendEvent]:
        calls: dict[int, dict[str, str]] = {}  # tool calls arrive in pieces, by index
        finish_reason, usage, chunks = "stop", None, 0
        first_token_at: float | None = None
        last_token_at = 0.0
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                delta = choice.delta
                reasoning = (delta.model_extra or {}).get("reasoning_content")
                if reasoning:
                    yield ReasoningDelta(reasoning)
                if delta.content:
                    yield TextDelta(delta.content)
                for piece in delta.tool_calls or ():
                    call = calls.setdefault(piece.index, {"name": "", "arguments": ""})
                    if piece.function is not None:
                        call["name"] += piece.function.name or ""
                        call["arguments"] += piece.function.arguments or ""
                if reasoning or delta.content or delta.tool_calls:
                    chunks += 1
                    last_token_at = time.perf_counter()
                    first_token_at = first_token_at or last_token_at
                finish_reason = choice.finish_reason or finish_reason
        for index in sorted(calls):
            yield _tool_call_event(calls[index])
        ended = time.perf_counter()
        completion = usage.completion_tokens if usage else chunks
        prompt = usage.prompt_tokens if usage else 0
        if prompt > 0 and self._request_chars:
            # The server's count of this very request: estimates from now on use its ratio, so
            # the context shown does not jump between usage reports and estimates.
            self.chars_per_token = self._request_chars / prompt
        details = getattr(usage, "prompt_tokens_details", None)
        stats = GenerationStats(
            prompt_tokens=prompt,
            prefill_seconds=(first_token_at or ended) - started,
            generated_tokens=completion,
            # A rate needs tokens that arrived apart: an answer sent in one chunk has none (0
            # here, which the status bar shows as no rate rather than thousands of t/s).
            decode_seconds=last_token_at - first_token_at if first_token_at and chunks > 1 else 0,
            stop_reason=finish_reason,
        )
        yield Finished(
            finish_reason,
            prompt,
            completion,
            getattr(details, "cached_tokens", None) or 0,
            stats,
            ended - started,
        )

    def count_tokens(self, messages: Sequence[Message], tools: Tools, *, thinking: bool) -> int:
        return round(self._chars(messages, tools) / self.chars_per_token)

    @staticmethod
    def _chars(messages: Sequence[Message], tools: Tools) -> int:
        return len(json.dumps([openai_messages(messages), list(tools)], ensure_ascii=False))

    def expert_hit_rate(self) -> float | None:
        return None  # the server's experts are not visible through the OpenAI API


def _tool_call_event(call: dict[str, str]) -> ToolCallComplete | ToolCallError:
    raw = f"{call['name']}({call['arguments']})"
    if not call["name"]:
        return ToolCallError(raw, "tool call without a name")
    try:
        arguments = json.loads(call["arguments"] or "{}")
    except json.JSONDecodeError as exc:
        return ToolCallError(raw, f"arguments are not valid JSON: {exc}")
    if not isinstance(arguments, dict):
        return ToolCallError(raw, "arguments are not a JSON object")
    return ToolCallComplete(ToolCall(call["name"], arguments))


def openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation in the shape OpenAI servers accept: arguments as JSON strings, no
    reasoning fields, and tool results without a matching call (reports about malformed calls)
    sent as user messages, which strict servers require."""
    converted: list[dict[str, Any]] = []
    open_call_ids: set[str] = set()
    for message in messages:
        role = message["role"]
        if role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": message.get("content", "")}
            calls = message.get("tool_calls") or []
            if calls:
                entry["tool_calls"] = [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["function"]["name"],
                            "arguments": json.dumps(
                                call["function"]["arguments"], ensure_ascii=False
                            ),
                        },
                    }
                    for call in calls
                ]
            open_call_ids = {call["id"] for call in calls}
            converted.append(entry)
        elif role == "tool" and message.get("tool_call_id") not in open_call_ids:
            converted.append({"role": "user", "content": message.get("content", "")})
        else:
            converted.append(
                {key: message[key] for key in ("role", "content", "tool_call_id") if key in message}
            )
    return converted
