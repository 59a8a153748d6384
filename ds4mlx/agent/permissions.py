"""Which tool calls need the user's consent, and what the user already allowed.

"Always" is never "all of bash": it is this exact command, or commands starting with a prefix
(like Claude Code's ``Bash(git diff:*)``), or for write and edit the tool. A prefix rule only
matches a simple command (one program with its arguments): ``git diff; rm -rf x`` or
``git diff > f`` is not ``git diff`` and is asked about again.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from enum import Enum

from ds4mlx.agent.tools import TOOLS_NEEDING_PERMISSION
from ds4mlx.generation import ToolCall


class Decision(Enum):
    ALLOW_ONCE = "once"
    ALLOW_ALWAYS = "always"  # bash: this exact command; write/edit: the tool, this session
    ALLOW_PREFIX = "prefix"  # bash: simple commands starting with the call's prefix
    DENY = "deny"


# Characters that chain, redirect, substitute or group commands: a command with any of them is
# not "simple" and no prefix rule covers it.
_SHELL_SYNTAX = re.compile(r"[;&|<>`$(){}\n\r\\*?\[\]!#~]")
# A prefix keeps this many words that are not options (``git diff``, ``python -m pytest``).
_PREFIX_WORDS = 2


def _simple_words(command: str) -> list[str] | None:
    """The words of a command without shell syntax; None for anything else."""
    if _SHELL_SYNTAX.search(command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    return words or None


def command_prefix(command: str) -> str | None:
    """The prefix an "always" rule for ``command`` would allow, e.g. ``git diff`` for
    ``git diff --stat src``; None when the command is not simple or is its own prefix."""
    words = _simple_words(command.strip())
    if words is None:
        return None
    prefix: list[str] = []
    plain = 0
    for word in words:
        prefix.append(word)
        plain += not word.startswith("-")
        if plain == _PREFIX_WORDS:
            break
    return shlex.join(prefix) if len(prefix) < len(words) else None


@dataclass(frozen=True)
class Rule:
    tool: str
    command: str | None = None  # bash: the exact command
    prefix: str | None = None  # bash: the allowed prefix

    def allows(self, call: ToolCall) -> bool:
        if call.name != self.tool:
            return False
        command = str(call.arguments.get("command", "")).strip()
        if self.command is not None:
            return command == self.command
        if self.prefix is not None:
            words = _simple_words(command)
            allowed = shlex.split(self.prefix)
            return words is not None and words[: len(allowed)] == allowed
        return True

    def describe(self) -> str:
        if self.command is not None:
            return f"{self.tool}({self.command})"
        if self.prefix is not None:
            return f"{self.tool}({self.prefix}:*)"
        return self.tool


def rule_for(call: ToolCall, decision: Decision) -> Rule | None:
    """The rule an answer creates; None for once and deny."""
    if decision is Decision.ALLOW_ALWAYS:
        if call.name == "bash":
            return Rule("bash", command=str(call.arguments.get("command", "")).strip())
        return Rule(call.name)
    if decision is Decision.ALLOW_PREFIX and call.name == "bash":
        prefix = command_prefix(str(call.arguments.get("command", "")))
        return Rule("bash", prefix=prefix) if prefix else None
    return None


class Permissions:
    def __init__(self, yolo: bool = False):
        self.yolo = yolo
        self.rules: list[Rule] = []

    def must_ask(self, call: ToolCall) -> bool:
        return (
            call.name in TOOLS_NEEDING_PERMISSION
            and not self.yolo
            and not any(rule.allows(call) for rule in self.rules)
        )

    def record(self, call: ToolCall, decision: Decision) -> None:
        rule = rule_for(call, decision)
        if rule is not None and rule not in self.rules:
            self.rules.append(rule)
