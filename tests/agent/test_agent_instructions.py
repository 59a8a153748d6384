"""Which project instructions file is used, and what of it reaches the system prompt."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.agent.instructions import (
    MAX_INSTRUCTION_CHARS,
    MAX_INSTRUCTION_FILE_BYTES,
    ProjectInstructions,
    project_instructions,
)
from ds4mlx.agent.loop import Agent
from ds4mlx.agent.tool_schemas import SYSTEM_PROMPT
from ds4mlx.agent.tools import ToolBox
from ds4mlx.agent.workspace import Workspace

import pytest
from scripted_backend import ScriptedBackend


@pytest.fixture
def root(workspace: Path) -> Path:
    (workspace / "CLAUDE.md").write_text("fallback\n")
    return workspace


def found(root: Path) -> ProjectInstructions | None:
    return project_instructions(Workspace(root))


def test_the_text_is_stripped_and_kept_whole_below_the_limit(root):
    (root / "AGENTS.md").write_text("\n  Use make.\nNo pip.  \n\n")
    assert found(root) == ProjectInstructions("AGENTS.md", "Use make.\nNo pip.", cut=False)


def test_a_file_of_exactly_the_limit_is_whole_and_one_more_character_is_cut(root):
    text = "a" * (MAX_INSTRUCTION_CHARS - 1) + "b"
    (root / "AGENTS.md").write_text(text)
    assert found(root) == ProjectInstructions("AGENTS.md", text)
    (root / "AGENTS.md").write_text(text + "c")
    assert found(root) == ProjectInstructions(
        "AGENTS.md", text + "\n[... AGENTS.md cut here ...]", cut=True
    )


@pytest.mark.parametrize(
    "content",
    [b"", b"  \n\t\n", b"text\x00more", b"x" * (MAX_INSTRUCTION_FILE_BYTES + 1)],
    ids=["empty", "blank", "binary", "over-a-mib"],
)
def test_an_unusable_agents_md_gives_way_to_claude_md(root, content):
    (root / "AGENTS.md").write_bytes(content)
    assert found(root) == ProjectInstructions("CLAUDE.md", "fallback")


def test_a_file_of_exactly_a_mib_is_used(root):
    (root / "AGENTS.md").write_bytes(b"x" * MAX_INSTRUCTION_FILE_BYTES)
    assert found(root).name == "AGENTS.md"


def test_an_agents_md_folder_or_a_link_out_gives_way_to_claude_md(root, outside):
    (root / "AGENTS.md").mkdir()
    assert found(root).name == "CLAUDE.md"
    (root / "AGENTS.md").rmdir()
    (root / "AGENTS.md").symlink_to(outside / "secret.txt")
    assert found(root) == ProjectInstructions("CLAUDE.md", "fallback")


def test_neither_file_gives_none(root):
    (root / "CLAUDE.md").unlink()
    assert found(root) is None


def test_bytes_that_are_not_utf8_are_replaced(root):
    (root / "AGENTS.md").write_bytes(b"caf\xe9 ok")
    assert found(root).text == "caf\ufffd ok"


def test_the_description_counts_lines_and_says_when_the_file_was_cut():
    assert ProjectInstructions("AGENTS.md", "one").describe() == (
        "project instructions from AGENTS.md (1 line) are in the context"
    )
    assert ProjectInstructions("CLAUDE.md", "one\ntwo", cut=True).describe() == (
        f"project instructions from CLAUDE.md (2 lines, cut to {MAX_INSTRUCTION_CHARS} "
        "characters) are in the context"
    )


def test_the_system_section_names_the_file_before_the_text():
    assert ProjectInstructions("AGENTS.md", "Use make.").system_section() == (
        "\n\n# Project instructions (from AGENTS.md in the workspace)\n\nUse make."
    )


def test_every_new_conversation_starts_with_the_instructions_read_at_start(root):
    (root / "AGENTS.md").write_text("Use make.\n")
    agent = Agent(ScriptedBackend(), ToolBox(Workspace(root)))
    section = "\n\n# Project instructions (from AGENTS.md in the workspace)\n\nUse make."
    assert agent.messages == [{"role": "system", "content": SYSTEM_PROMPT + section}]
    assert agent.conversation.workspace == str(root)
    (root / "AGENTS.md").write_text("Use ninja.\n")  # read once: later conversations agree
    assert agent.new_conversation().messages[0]["content"] == SYSTEM_PROMPT + section


def test_without_instructions_the_system_prompt_is_the_agents_own(root):
    (root / "CLAUDE.md").unlink()
    agent = Agent(ScriptedBackend(), ToolBox(Workspace(root)))
    assert agent.instructions is None
    assert agent.messages == [{"role": "system", "content": SYSTEM_PROMPT}]


def test_without_an_agents_md_claude_md_is_used(root):
    assert found(root) == ProjectInstructions("CLAUDE.md", "fallback")
