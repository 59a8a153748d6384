"""The workspace: the one directory the agent's tools may touch, and the files in it.

Every path a tool receives comes from the model, so it is treated as hostile: it must be relative,
must not climb out with ``..``, and must still be inside the workspace once symbolic links are
followed. Walking the workspace skips ``.git`` and whatever the ``.gitignore`` files exclude, so
that search and list show what a developer would consider the project.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pathspec

# Longer paths than these are refused before the file system sees them (it would fail later
# with a less helpful error, or the path is an attempt to probe limits).
MAX_PATH_CHARS = 1024
MAX_NAME_BYTES = 255


class ToolError(Exception):
    """A tool could not do what was asked; the message is shown to the model as the result."""


class PathRefused(ToolError):
    """A path that points outside the workspace, or could not be a workspace path."""


@dataclass(frozen=True)
class _IgnoreRules:
    """The patterns of one .gitignore, which apply below the folder holding it."""

    folder: Path
    spec: pathspec.GitIgnoreSpec


class Workspace:
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ValueError(f"workspace {root} is not a directory")

    def resolve(self, raw: object) -> Path:
        """The absolute path inside the workspace that ``raw`` names; PathRefused otherwise."""
        if not isinstance(raw, str):
            raise PathRefused(f"a path must be a string, not {type(raw).__name__}")
        # Not stripped: spaces are legal in names, and a different file must not be meant.
        text = raw or "."
        if "\x00" in text:
            raise PathRefused("the path contains a NUL byte")
        try:
            # JSON tool arguments can carry lone surrogates ("\ud800"), which no file system
            # name can hold; surrogateescape still admits names read back from undecodable bytes.
            text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise PathRefused(
                f"{raw!r}: the path is not valid Unicode (a lone surrogate)"
            ) from None
        if len(text) > MAX_PATH_CHARS:
            raise PathRefused(f"the path is longer than {MAX_PATH_CHARS} characters")
        if text.startswith("~"):
            raise PathRefused(f"{raw!r}: '~' is not expanded; paths are relative to the workspace")
        if os.path.isabs(text):
            raise PathRefused(
                f"{raw!r}: absolute paths are refused; give a path relative to the workspace"
            )
        parts = PurePosixPath(text).parts
        if ".." in parts:
            raise PathRefused(f"{raw!r}: '..' is refused; paths stay inside the workspace")
        if any(len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES for part in parts):
            raise PathRefused(f"{raw!r}: a path component is longer than {MAX_NAME_BYTES} bytes")
        resolved = (self.root / text).resolve()
        if not resolved.is_relative_to(self.root):
            raise PathRefused(f"{raw!r} leads outside the workspace through a symbolic link")
        return resolved

    def relative(self, path: Path) -> str:
        """``path`` as the model should write it: relative, with forward slashes."""
        relative = path.relative_to(self.root).as_posix()
        return relative or "."

    def walk(self, start: Path) -> Iterator[tuple[Path, bool]]:
        """(path, is_folder) for everything under ``start`` that git would not ignore, in
        sorted order, folders before their contents. Symbolic links are listed only when
        they point inside the workspace, and are never descended into (no loops)."""
        rules = self._rules_above(start)
        yield from self._walk(start, rules)

    def _walk(self, folder: Path, rules: list[_IgnoreRules]) -> Iterator[tuple[Path, bool]]:
        rules = rules + self._rules_in(folder)
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            return
        for entry in entries:
            path = Path(entry.path)
            is_folder = entry.is_dir(follow_symlinks=False)
            if entry.name == ".git" or self._ignored(path, is_folder, rules):
                continue
            if entry.is_symlink() and not self._points_inside(path):
                continue
            yield path, is_folder
            if is_folder:
                yield from self._walk(path, rules)

    def _points_inside(self, link: Path) -> bool:
        target = link.resolve()
        return target.exists() and target.is_relative_to(self.root)

    def _rules_above(self, start: Path) -> list[_IgnoreRules]:
        rules: list[_IgnoreRules] = []
        for folder in reversed(start.parents):
            if folder.is_relative_to(self.root):
                rules += self._rules_in(folder)
        return rules

    @staticmethod
    def _rules_in(folder: Path) -> list[_IgnoreRules]:
        try:
            lines = (folder / ".gitignore").read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [_IgnoreRules(folder, pathspec.GitIgnoreSpec.from_lines(lines))]

    @staticmethod
    def _ignored(path: Path, is_folder: bool, rules: list[_IgnoreRules]) -> bool:
        ignored = False
        for rule in rules:
            relative = path.relative_to(rule.folder).as_posix() + ("/" if is_folder else "")
            # Later (deeper) files override earlier ones, as in git, including negations.
            result = rule.spec.check_file(relative)
            if result.include is not None:
                ignored = result.include
        return ignored
