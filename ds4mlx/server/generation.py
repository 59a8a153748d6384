"""What every endpoint shares: request validation, server defaults, and the generation a request
asks the ChatService for."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, TypeVar

from ds4mlx.generation import (
    ChatFormat,
    GrammarError,
    JsonFormat,
    NamedTool,
    SamplingOptions,
    ScheduledEvent,
    TextTokenizer,
    ToolChoice,
    check_json_format,
)
from ds4mlx.server.errors import APIError

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ServedModel(Protocol):
    """The part of a loaded model the server reads: its tokenizer and chat template."""

    @property
    def tokenizer(self) -> TextTokenizer: ...

    @property
    def chat_format(self) -> ChatFormat | None: ...


class GenerationService(Protocol):
    """The part of ``ChatService`` the server uses."""

    @property
    def model(self) -> ServedModel: ...

    @property
    def max_context(self) -> int: ...

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        max_tokens: int = ...,
        sampling: SamplingOptions | None = None,
        stop: Sequence[str] = (),
        thinking: bool = False,
        reasoning_effort: str | None = None,
        tool_choice: ToolChoice = "auto",
        prompt_tokens: Sequence[int] | None = None,
        stream_arguments: bool = False,
        output_format: JsonFormat | None = None,
        parallel_tool_calls: bool = True,
    ) -> Generator[ScheduledEvent, Any, None]: ...

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        thinking: bool = False,
        reasoning_effort: str | None = None,
        tool_choice: ToolChoice = "auto",
    ) -> list[int]: ...

    def complete(
        self,
        prompt: str,
        *,
        max_tokens: int = ...,
        sampling: SamplingOptions | None = None,
        stop: Sequence[str] = (),
        output_format: JsonFormat | None = None,
    ) -> Generator[ScheduledEvent, Any, None]: ...


@dataclass(frozen=True)
class GenerationDefaults:
    """What a request gets for the options it leaves out (from the server's flags)."""

    max_tokens: int
    sampling: SamplingOptions = SamplingOptions()
    thinking: bool = False


@dataclass(frozen=True)
class GenerationCall:
    """One request translated into a ChatService call: ``messages`` for a chat, ``prompt`` for
    a raw completion. ``prompt_tokens``: the chat's prompt, tokenized before it was queued."""

    max_tokens: int
    sampling: SamplingOptions
    stop: tuple[str, ...] = ()
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = "auto"
    thinking: bool = False
    reasoning_effort: str | None = None  # a REASONING_EFFORT_ORDER name, for thinking turns
    prompt: str | None = None
    prompt_tokens: list[int] | None = None
    output_format: JsonFormat | None = None  # response_format's JSON, by constrained decoding
    parallel_tool_calls: bool = True  # False: at most one call in the turn

    def run(self, service: GenerationService) -> Generator[ScheduledEvent, Any, None]:
        if self.messages is not None:
            return service.chat(
                self.messages,
                self.tools,
                max_tokens=self.max_tokens,
                sampling=self.sampling,
                stop=self.stop,
                **self._chat_options(),
                prompt_tokens=self.prompt_tokens,
                stream_arguments=True,
                output_format=self.output_format,
                parallel_tool_calls=self.parallel_tool_calls,
            )
        assert self.prompt is not None
        return service.complete(
            self.prompt,
            max_tokens=self.max_tokens,
            sampling=self.sampling,
            stop=self.stop,
            output_format=self.output_format,
        )

    def chat_prompt(self, service: GenerationService) -> list[int]:
        """The prompt tokens of this chat (tokenizing is the caller's thread's work)."""
        assert self.messages is not None
        return service.chat_prompt(self.messages, self.tools, **self._chat_options())

    def _chat_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"thinking": self.thinking}
        if self.reasoning_effort is not None:
            options["reasoning_effort"] = self.reasoning_effort
        if self.tool_choice != "auto":
            options["tool_choice"] = self.tool_choice
        return options

    @property
    def text_characters(self) -> int:
        """Characters of the request's text that every rendering of its prompt contains (a
        template may leave out earlier reasoning and strip an assistant's answer, so those
        count only as far as they surely appear)."""
        if self.prompt is not None:
            return len(self.prompt)
        total = 0
        for message in self.messages or ():
            content = message.get("content")
            if not isinstance(content, str):
                continue
            if message.get("role") in ("system", "user", "tool"):
                total += len(content)
            elif message.get("role") == "assistant":
                total += len(content.strip())
        return total


def tool_choice_for(
    tools: Sequence[Any] | None, choice: str | None, named: str | None, offered_names: Sequence[str]
) -> ToolChoice:
    """The engine's tool choice: "none" without tools (the template renders none and the output
    is not parsed for calls), else the API's mode ("auto", "none", "required") or a named
    function, which must be one of ``offered_names``."""
    if named is not None:
        if named not in offered_names:
            offered = ", ".join(f"'{name}'" for name in offered_names) or "none"
            raise APIError(
                400,
                f"invalid 'tool_choice': the function '{named}' is not among "
                f"the tools offered ({offered})",
                param="tool_choice",
            )
        return NamedTool(named)
    if choice == "required" and not tools:
        raise APIError(
            400,
            "invalid 'tool_choice': 'required' needs at least one tool in 'tools'",
            param="tool_choice",
        )
    if not tools or choice == "none":
        return "none"
    return "required" if choice == "required" else "auto"


# --------------------------------------------------------------------------- request models


# A penalty window longer than any context: the server cuts it to its own.
WHOLE_CONTEXT = 2**31 - 1


class RequestModel(BaseModel):
    """Base of every request body: JSON types are checked strictly (no "3" for 3), NaN and
    infinities are refused, and fields the server does not use are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class ThinkingControl(RequestModel):
    """DeepSeek/Anthropic style ``{"type": "enabled" | "disabled"}``."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None  # Anthropic's; accepted, not enforced


class SamplingFields(RequestModel):
    """Sampling options every API accepts (top_k, min_p, seed and the penalties as extensions
    where the API has none, with llama.cpp's server names: ``repeat_penalty``,
    ``repeat_last_n``)."""

    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, lt=1.0)
    # llama.cpp's -1 (and 0xFFFFFFFF) draws a random seed; MLX seeds are unsigned 64-bit.
    seed: int | None = Field(None, ge=-1, le=2**64 - 1)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    repeat_last_n: int | None = Field(None, ge=-1)  # llama.cpp's -1: the whole context
    # OpenAI's: token id (a JSON object key, so a string) -> bias added to its logit.
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None

    def sampling(self, defaults: GenerationDefaults) -> SamplingOptions:
        overrides = {
            name: getattr(self, name)
            for name in (
                "temperature",
                "top_p",
                "top_k",
                "min_p",
                "seed",
                "frequency_penalty",
                "presence_penalty",
                "repeat_penalty",
                "repeat_last_n",
            )
            if getattr(self, name) is not None
        }
        if self.seed in (-1, 0xFFFFFFFF):
            overrides["seed"] = None
        if self.repeat_last_n == -1:
            overrides["repeat_last_n"] = WHOLE_CONTEXT
        if self.logit_bias:
            overrides["logit_bias"] = tuple(self._token_biases())
        try:
            return dataclasses.replace(defaults.sampling, **overrides)
        except ValueError as exc:  # a combination the sampler refuses; its message names it
            raise APIError(400, f"invalid sampling options: {exc}") from None

    def _token_biases(self) -> Iterator[tuple[int, float]]:
        for key, bias in (self.logit_bias or {}).items():
            if not key.isdigit():
                raise APIError(
                    400, f"invalid 'logit_bias': key '{key}' is not a token id", param="logit_bias"
                )
            yield int(key), bias


class APIRequest(SamplingFields):
    """Fields every endpoint's request has."""

    model: str
    stream: bool = False


Model = TypeVar("Model", bound=RequestModel)


def parse_request(model: type[Model], body: bytes) -> Model:
    """Validate a JSON body; every problem becomes a 400 naming the offending field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    if errors[0]["type"] == "json_invalid":
        raise APIError(400, f"the body is not valid JSON: {errors[0]['msg']}")
    if not errors[0]["loc"]:
        raise APIError(400, f"the body must be a JSON object: {errors[0]['msg']}")
    # A value that fits no member of a union fails once per member: report the deepest field
    # reached (the most specific problem) with what each member wanted there.
    named = [(_param_name(error["loc"]), error) for error in errors]
    deepest = max(named, key=lambda pair: len(pair[1]["loc"]))[0]
    messages = dict.fromkeys(error["msg"] for param, error in named if param == deepest)
    raise APIError(400, f"invalid '{deepest}': {'; or '.join(messages)}", param=deepest)


# The names pydantic gives union members in error locations; they name no field.
_UNION_MEMBER_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _param_name(loc: Sequence[int | str]) -> str:
    """``("messages", 0, "content", "str")`` as ``messages[0].content``."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif not (part in _UNION_MEMBER_TAGS or "[" in part or part[:1].isupper()):
            name += f".{part}" if name else part
    return name


class JsonSchemaFormat(RequestModel):
    """OpenAI's ``json_schema`` response format (the Responses API has these fields on the
    format itself)."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


def output_format(
    kind: str, schema_format: JsonSchemaFormat | None, param: str
) -> JsonFormat | None:
    """The JSON output a ``response_format`` (or Responses ``text.format``) of type ``kind``
    asks for: None for "text"; a schema is held to whether ``strict`` or not (decoding is
    constrained either way). A schema the grammar engine cannot compile is a 400."""
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonFormat()
    if kind != "json_schema":
        raise APIError(
            400,
            f"invalid '{param}.type': '{kind}' (expected 'text', 'json_object' or 'json_schema')",
            param=f"{param}.type",
        )
    if schema_format is None or schema_format.schema_ is None:
        raise APIError(400, f"'{param}' of type 'json_schema' needs a schema", param=param)
    requested = JsonFormat(schema_format.schema_)
    try:
        check_json_format(requested)
    except GrammarError as exc:
        raise APIError(400, f"invalid '{param}' schema: {exc}", param=param) from None
    return requested


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


# OpenAI's reasoning efforts, plus "max" for chat templates with a maximum-effort mode.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


def template_effort(effort: ReasoningEffort | None) -> str | None:
    """The effort to render a thinking prompt with ("none" turns thinking off instead)."""
    return None if effort in (None, "none") else effort


def resolve_thinking(
    control: bool | ThinkingControl | None, effort: str | None, default: bool
) -> bool:
    """Thinking mode from the request's ``thinking`` switch, else its reasoning effort (any
    effort but "none" asks for reasoning), else the server default."""
    if isinstance(control, bool):
        return control
    if control is not None:
        return control.type != "disabled"
    if effort is not None:
        return effort != "none"
    return default


def token_limit(requested: int | None, defaults: GenerationDefaults) -> int:
    return requested if requested is not None else defaults.max_tokens


class TextPart(Protocol):
    """A content part or block: only those of a text type are understood."""

    @property
    def type(self) -> str: ...

    @property
    def text(self) -> str | None: ...


def joined_text(
    content: str | Sequence[TextPart] | None, param: str, text_types: Sequence[str] = ("text",)
) -> str:
    """Content as text: a string, or the text parts of a list joined by newlines (anything else,
    such as images, is refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for index, part in enumerate(content):
        if part.type not in text_types or part.text is None:
            raise unsupported_content(f"{param}[{index}]", part.type)
        texts.append(part.text)
    return "\n".join(texts)


def unsupported(param: str, reason: str) -> APIError:
    return APIError(
        400, f"'{param}' is not supported: {reason}", param=param, code="unsupported_parameter"
    )


def unsupported_content(param: str, content_type: str) -> APIError:
    return unsupported(param, f"content of type '{content_type}' (only text is understood)")


def json_arguments(arguments: Mapping[str, Any]) -> str:
    """Tool-call arguments as the JSON string OpenAI's APIs carry."""
    return json.dumps(arguments, ensure_ascii=False)
