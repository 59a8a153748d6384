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
from collections.abc import Callable, Mapping, Sequence
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


def callable_tools(
    tools: Sequence[Mapping[str, Any]], tool_choice: Any
) -> tuple[Sequence[Mapping[str, Any]], bool]:
    """The tools a call may name (only the named one for a NamedTool, any object with a
    ``name``), and whether the choice forces a call."""
    names = [tool_name(tool) for tool in tools]
    if not all(names) or len(set(names)) != len(names):
        raise ValueError(f"tools need distinct non-empty names, got {names}")
    named = getattr(tool_choice, "name", None)
    if named is None:
        return tools, tool_choice == "required"
    chosen = [tool for tool in tools if tool_name(tool) == named]
    if not chosen:
        raise ValueError(f"tool_choice names {named!r}, which is not offered")
    return chosen, True


def argument_rules(
    tools: Sequence[Mapping[str, Any]],
    forced: bool,
    parameter_rule: Callable[[Parameter, bool], str],
    free_arguments: str,
) -> list[str]:
    """Rules ``t<i>_arguments``: tool i's parameters in declared order, each written by
    ``parameter_rule(parameter, schema_bound)`` and optional unless required under a schema;
    ``free_arguments`` for a tool that declares none."""
    rules = []
    for index, tool in enumerate(tools):
        declared = parameters(tool)
        bound = forced or is_strict(tool)
        if declared is None:
            rules.append(f"t{index}_arguments: {free_arguments}")
            continue
        items = []
        for position, parameter in enumerate(declared):
            rule = f"t{index}_{position}"
            rules.append(f"{rule}: {parameter_rule(parameter, bound)}")
            items.append((rule, parameter.required and bound))
        rules.append(f"t{index}_arguments: {parameter_sequence(items)}")
    return rules
