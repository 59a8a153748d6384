"""``@path`` in a prompt: the file goes into the message, as Claude Code's mentions and aider's
``/add`` do, so the model need not spend a turn reading it.

A mention is ``@`` at the start of the prompt, after a space or an opening bracket or quote,
followed by a workspace path (``a@b.com`` is no mention); punctuation that ends a sentence is
not part of it. The workspace's rules apply as they do to the tools (``@../x``, absolute paths
and links out of the workspace are refused), a binary or unreadable file is not attached, and
a long file is cut with a marker that says how to read the rest. Tab in the prompt completes
the path after an ``@``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ds4mlx.agent.files import read_regular
from ds4mlx.agent.workspace import ToolError, Workspace

MENTION = re.compile(r"(?:(?<=[\s(\[{\"'])|^)@(\S+)")
# Characters that end a sentence after a mention rather than belong to the path.
_TRAILING = ".,;:!?)]}\"'"
MAX_ATTACHED_CHARS = 16_000
MAX_ATTACHED_FILE_BYTES = 4 * 2**20


@dataclass
class Attachments:
    """A prompt with its mentioned files appended, and what happened to each mention."""

    message: str
    attached: list[str] = field(default_factory=list)  # "src/a.py (12 lines)"
    refused: list[str] = field(default_factory=list)  # "@../x: '..' is refused ..."


def mentioned_paths(prompt: str) -> list[str]:
    """The paths mentioned in ``prompt``, in order, each once."""
    paths = [match.group(1).rstrip(_TRAILING) for match in MENTION.finditer(prompt)]
    return list(dict.fromkeys(path for path in paths if path))


def attach_mentions(prompt: str, workspace: Workspace) -> Attachments:
    """``prompt`` followed by the files it mentions (see the module notes)."""
    result = Attachments(prompt)
    blocks = []
    for raw in mentioned_paths(prompt):
        try:
            path = workspace.resolve(raw)
            if path.is_dir():
                raise ToolError("is a folder; mention files")
            data = read_regular(path, MAX_ATTACHED_FILE_BYTES, raw)
        except FileNotFoundError:
            result.refused.append(f"@{raw}: no such file in the workspace")
            continue
        except (ToolError, OSError) as exc:
            result.refused.append(f"@{raw}: {getattr(exc, 'strerror', None) or exc}")
            continue
        if b"\x00" in data[:8192]:
            result.refused.append(f"@{raw}: a binary file")
            continue
        text = data.decode("utf-8", errors="replace")
        relative = workspace.relative(path)
        lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
        note = f"{relative} ({lines} line{'s' * (lines != 1)}"
        if len(text) > MAX_ATTACHED_CHARS:
            shown = text[:MAX_ATTACHED_CHARS].count("\n") + 1
            text = (
                text[:MAX_ATTACHED_CHARS]
                + f"\n[... cut: {relative} goes on; read it from line {shown} for the rest ...]"
            )
            note += f", cut to {MAX_ATTACHED_CHARS} characters"
        result.attached.append(note + ")")
        blocks.append(f'<file path="{relative}">\n{text.rstrip(chr(10))}\n</file>')
    if blocks:
        result.message = prompt + "\n\n" + "\n\n".join(blocks)
    return result


def complete_mention(before_cursor: str, workspace: Workspace) -> str | None:
    """What Tab inserts after ``before_cursor`` when it ends in ``@`` and part of a path: the
    rest of the only match (``/`` after a folder), or what all matches share; None otherwise."""
    match = re.search(r"(?:(?<=\s)|^)@(\S*)$", before_cursor)
    if match is None:
        return None
    typed = match.group(1)
    folder_part, _, name_part = typed.rpartition("/")
    try:
        folder = workspace.resolve(folder_part or ".")
        names = sorted(
            entry.name + ("/" if entry.is_dir() else "")
            for entry in os.scandir(folder)
            if entry.name.startswith(name_part)
            and (name_part.startswith(".") or not entry.name.startswith("."))
        )
    except (ToolError, OSError):
        return None
    if not names:
        return None
    shared = os.path.commonprefix(names)
    return shared[len(name_part) :] or None
