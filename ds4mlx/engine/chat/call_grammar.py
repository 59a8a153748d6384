"""Grammars for tool calls, in llguidance's Lark dialect (text only: ``engine.constraints``
compiles them): what a chat format's call syntax allows once the model has opened a call.

A format describes its syntax with ``CallSyntax``: the marker whose token opens a call, the text
the output must end with for that token to open one, and a grammar for what follows the opening
(or what follows the prompt of a forced ``tool_choice``). The pieces here turn a tool's JSON
schema into rules: parameter names restricted to the declared ones, values held to their
schemas when the call is ``strict`` (always for a forced choice), else to anything that parses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NEWLINE = "\n"

#: What llguidance's JSON compiler is told inside every ``%json`` lexeme: the separators the
#: templates render with, and no free whitespace (a small model would pad with it forever).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# Keywords that narrow a string beyond "any text": such a value is held to its schema as JSON.
_STRING_CONSTRAINTS = ("enum", "const", "pattern", "format", "minLength", "maxLength")


@dataclass(frozen=True)
class CallSyntax:
    """How a chat format's tool calls open and what may follow, for one request.

    ``marker``: the text of the token that opens a call (a token that contains it any other way
    is never sampled); ``opens_after``: what the output must end with for that token to open a
    call ("" when it may come anywhere), else it is banned too; ``grammar``: Lark text whose
    ``start`` is what follows the marker, or, when ``forced``, what follows the prompt (which
    already opened the call)."""

    marker: str
    opens_after: str
    grammar: str
    forced: bool = False


def literal(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def json_lexeme(schema: Mapping[str, Any] | None) -> str:
    """A ``%json`` lexeme for ``schema`` (None: any JSON value)."""
    options = dict(schema or {})
    options["x-guidance"] = JSON_LAYOUT
    return "%json " + json.dumps(options, ensure_ascii=False)


def function_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("function", tool)


def tool_name(tool: Mapping[str, Any]) -> str:
    return str(function_of(tool).get("name", ""))


def is_strict(tool: Mapping[str, Any]) -> bool:
    return bool(function_of(tool).get("strict"))


@dataclass(frozen=True)
class Parameter:
    name: str
    schema: Mapping[str, Any]
    required: bool

    @property
    def plain_string(self) -> bool:
        """A string the template writes as raw text, with nothing to hold it to."""
        return self.schema.get("type") == "string" and not any(
            key in self.schema for key in _STRING_CONSTRAINTS
        )

    @property
    def is_string(self) -> bool:
        return self.schema.get("type") == "string"


def parameters(tool: Mapping[str, Any]) -> list[Parameter] | None:
    """A tool's declared parameters in order; None when its schema declares none (any names)."""
    schema = function_of(tool).get("parameters") or {}
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return None
    required = set(schema.get("required") or ())
    return [
        Parameter(str(name), sub if isinstance(sub, Mapping) else {}, name in required)
        for name, sub in properties.items()
    ]


def parameter_sequence(items: Sequence[tuple[str, bool]]) -> str:
    """Rule references in order, each optional unless required: ``a b? c``."""
    return " ".join(rule if required else f"{rule}?" for rule, required in items) or '""'


def rule_name(prefix: str, index: int) -> str:
    return f"{prefix}{index}"


def check_tools(tools: Sequence[Mapping[str, Any]]) -> None:
    names = [tool_name(tool) for tool in tools]
    if not all(names) or len(set(names)) != len(names):
        raise ValueError(f"tools need distinct non-empty names, got {names}")
