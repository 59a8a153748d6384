"""Code outlines with tree-sitter: the definitions in a file, and where a name is defined.

This lets the model read the one function it needs instead of whole files. Grammars come from
the per-language ``tree-sitter-*`` wheels, which ship compiled parsers (nothing is downloaded
at run time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ds4mlx.agent.workspace import ToolError

import tree_sitter
import tree_sitter_c
import tree_sitter_go
import tree_sitter_javascript
import tree_sitter_python
import tree_sitter_rust

_GRAMMARS: dict[str, Callable[[], object]] = {
    "python": tree_sitter_python.language,
    "c": tree_sitter_c.language,
    "javascript": tree_sitter_javascript.language,
    "go": tree_sitter_go.language,
    "rust": tree_sitter_rust.language,
}

LANGUAGE_BY_SUFFIX = {
    ".py": "python",
    ".pyi": "python",
    ".c": "c",
    ".h": "c",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".go": "go",
    ".rs": "rust",
}

# Node types that define something, per language, and what to call them.
_DEFINITIONS: dict[str, dict[str, str]] = {
    "python": {"function_definition": "function", "class_definition": "class"},
    "c": {
        "function_definition": "function",
        "struct_specifier": "struct",
        "union_specifier": "union",
        "enum_specifier": "enum",
        "type_definition": "typedef",
    },
    "javascript": {
        "function_declaration": "function",
        "generator_function_declaration": "function",
        "class_declaration": "class",
        "method_definition": "method",
        "variable_declarator": "function",
    },
    "go": {"function_declaration": "function", "method_declaration": "method", "type_spec": "type"},
    "rust": {
        "function_item": "function",
        "struct_item": "struct",
        "enum_item": "enum",
        "trait_item": "trait",
        "impl_item": "impl",
        "mod_item": "module",
    },
}

# JavaScript variables count as definitions only when they hold a function.
_JS_FUNCTION_VALUES = {"arrow_function", "function_expression", "function", "generator_function"}


@dataclass(frozen=True)
class Symbol:
    kind: str
    name: str
    start_line: int  # 1-based, inclusive
    end_line: int
    depth: int  # nesting: a method inside a class is one deeper


@cache
def _parser(language: str) -> tree_sitter.Parser:
    return tree_sitter.Parser(tree_sitter.Language(_GRAMMARS[language]()))


def language_for(path: Path) -> str | None:
    return LANGUAGE_BY_SUFFIX.get(path.suffix.lower())


def outline(
    source: bytes, language: str, cancelled: Callable[[], bool] = lambda: False
) -> list[Symbol]:
    """The definitions in ``source``, in file order; ToolError once ``cancelled()`` (walking a
    large tree takes seconds, and the user's Ctrl+C must land)."""
    tree = _parser(language).parse(source)
    return list(_definitions(tree.root_node, language, 0, cancelled))


def _definitions(
    node: tree_sitter.Node, language: str, depth: int, cancelled: Callable[[], bool]
) -> Iterator[Symbol]:
    if cancelled():
        raise ToolError("stopped by the user")
    for child in node.named_children:
        kind = _DEFINITIONS[language].get(child.type)
        name = _name(child, language) if kind else None
        if kind and name:
            yield Symbol(kind, name, child.start_point[0] + 1, child.end_point[0] + 1, depth)
            yield from _definitions(child, language, depth + 1, cancelled)
        else:
            yield from _definitions(child, language, depth, cancelled)


def _name(node: tree_sitter.Node, language: str) -> str | None:
    if language == "c":
        return _c_name(node)
    if node.type == "variable_declarator":
        value = node.child_by_field_name("value")
        if value is None or value.type not in _JS_FUNCTION_VALUES:
            return None
    if node.type == "impl_item":
        implemented = node.child_by_field_name("type")
        return f"impl {_text(implemented)}" if implemented is not None else None
    name = node.child_by_field_name("name")
    return _text(name) if name is not None else None


def _c_name(node: tree_sitter.Node) -> str | None:
    if node.type in ("struct_specifier", "union_specifier", "enum_specifier"):
        # A bare `struct P` inside a declaration is a use, not a definition.
        name = node.child_by_field_name("name")
        has_body = node.child_by_field_name("body") is not None
        return _text(name) if name is not None and has_body else None
    # Functions and typedefs name themselves at the bottom of a chain of declarators
    # (pointer, function, array, parenthesised).
    declarator = node.child_by_field_name("declarator")
    while declarator is not None and declarator.type not in (
        "identifier",
        "type_identifier",
        "field_identifier",
    ):
        if declarator.type == "parenthesized_declarator":
            # `(*handler)`: the inner declarator is a plain child there, not a field (without
            # this, function pointer typedefs and functions returning one had no name).
            declarator = next(iter(declarator.named_children), None)
        else:
            declarator = declarator.child_by_field_name("declarator")
    return _text(declarator) if declarator is not None else None


def _text(node: tree_sitter.Node) -> str:
    return (node.text or b"").decode("utf-8", errors="replace")
