"""Which tool calls need the user's consent, and what the user already allowed."""

from __future__ import annotations

from enum import Enum

from ds4mlx.agent.tools import TOOLS_NEEDING_PERMISSION
from ds4mlx.engine.chat import ToolCall


class Decision(Enum):
    ALLOW_ONCE = "once"
    ALLOW_ALWAYS = "always"  # this tool, for the rest of the session
    DENY = "deny"


class Permissions:
    def __init__(self, yolo: bool = False):
        self.yolo = yolo
        self.always_allowed: set[str] = set()

    def must_ask(self, call: ToolCall) -> bool:
        return (call.name in TOOLS_NEEDING_PERMISSION and not self.yolo
                and call.name not in self.always_allowed)

    def record(self, call: ToolCall, decision: Decision) -> None:
        if decision is Decision.ALLOW_ALWAYS:
            self.always_allowed.add(call.name)
