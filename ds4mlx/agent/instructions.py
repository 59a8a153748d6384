"""Project instructions: ``AGENTS.md`` at the workspace root (the name Codex and many agents
read), else ``CLAUDE.md`` (Claude Code's), put into the system prompt of new conversations so
that a session does not start from nothing about the repository. A very long file is cut, with
a marker, so that it cannot take the context over."""

from __future__ import annotations

from dataclasses import dataclass

from ds4mlx.agent.files import read_regular
from ds4mlx.agent.workspace import ToolError, Workspace

INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md")
# About 4,000 tokens: a tenth of a 40k context, and what a useful instructions file needs.
MAX_INSTRUCTION_CHARS = 16_000
MAX_INSTRUCTION_FILE_BYTES = 2**20


@dataclass(frozen=True)
class ProjectInstructions:
    name: str  # the file's name
    text: str  # as it goes into the system prompt (cut when too long)
    cut: bool = False

    def system_section(self) -> str:
        return f"\n\n# Project instructions (from {self.name} in the workspace)\n\n{self.text}"

    def describe(self) -> str:
        lines = self.text.count("\n") + 1
        cut = f", cut to {MAX_INSTRUCTION_CHARS} characters" if self.cut else ""
        return (
            f"project instructions from {self.name} ({lines} line{'s' * (lines != 1)}{cut}) "
            "are in the context"
        )


def project_instructions(workspace: Workspace) -> ProjectInstructions | None:
    """The first instructions file the workspace root holds; None when there is none. One that
    cannot be used (unreadable, binary, over a MiB, a link out of the workspace) is passed
    over: the session goes on without it."""
    for name in INSTRUCTION_FILES:
        try:
            path = workspace.resolve(name)
            if not path.exists():
                continue
            data = read_regular(path, MAX_INSTRUCTION_FILE_BYTES, name)
        except (ToolError, OSError):
            continue
        text = data.decode("utf-8", errors="replace").strip()
        if not text or "\x00" in text:
            continue
        if len(text) > MAX_INSTRUCTION_CHARS:
            return ProjectInstructions(
                name, text[:MAX_INSTRUCTION_CHARS] + f"\n[... {name} cut here ...]", cut=True
            )
        return ProjectInstructions(name, text)
    return None
