"""Checkpoints of the workspace, one per prompt that changed files: ``/undo`` and ``/diff``.

In a git work tree a checkpoint is a snapshot of the workspace's files (tracked and untracked,
not ignored) taken just before the first write, edit or bash of a prompt, and another after the
prompt; they are commits on a side ref (``refs/ds4-agent/<session>``) made with a temporary
index, so neither the user's index, branch nor stash is touched, and bash's changes are caught
too (untracked files over 16 MiB are left out). Elsewhere the checkpoint keeps copies of the
files write and edit touched, and a list of the workspace's files (size, time) before a bash
command: files bash created are undone, files it changed are named as beyond undo. ``/undo``
puts the files the last such prompt changed back as they were; ``/diff`` shows everything the
session changed.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ds4mlx.agent.files import write_atomically
from ds4mlx.agent.workspace import Workspace

_GIT_TIMEOUT_SECONDS = 60.0
_IDENTITY = {
    "GIT_AUTHOR_NAME": "ds4-agent",
    "GIT_AUTHOR_EMAIL": "ds4-agent@localhost",
    "GIT_COMMITTER_NAME": "ds4-agent",
    "GIT_COMMITTER_EMAIL": "ds4-agent@localhost",
}
MAX_DIFF_LINES = 400
# Files listed before a bash command outside git, at most.
MAX_MANIFEST_ENTRIES = 50_000
# Untracked files larger than this (model weights, data sets) are left out of snapshots: hashing
# them into the repository would cost more than undo is worth.
MAX_UNTRACKED_SNAPSHOT_BYTES = 16 * 2**20


class CheckpointError(Exception):
    """A snapshot or a restore failed; the message says why."""


@dataclass
class _Checkpoint:
    before: str = ""  # git: the commit before the prompt's first change
    after: str = ""  # git: the commit after the prompt
    originals: dict[Path, bytes | None] = field(default_factory=dict)  # files: None = absent
    manifest: dict[Path, tuple[int, int]] | None = None  # files: before bash, size and mtime
    beyond_undo: list[Path] = field(default_factory=list)  # files: bash changed, no copy
    new_folders: set[Path] = field(default_factory=set)  # made for the files write created


class _Git:
    def __init__(self, top: Path, prefix: str):
        self.top = top
        self.prefix = prefix or "."  # the workspace inside the repository
        self.ref = f"refs/ds4-agent/{uuid.uuid4().hex[:12]}"
        self.head = ""  # the last commit on the side ref

    def run(
        self, *arguments: str, env: dict[str, str] | None = None, stdin: str | None = None
    ) -> str:
        try:
            done = subprocess.run(
                ["git", "--literal-pathspecs", *arguments],
                cwd=self.top,
                capture_output=True,
                text=True,
                timeout=_GIT_TIMEOUT_SECONDS,
                env={**os.environ, **_IDENTITY, **(env or {})},
                input=stdin,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CheckpointError(f"git {arguments[0]}: {exc}") from exc
        if done.returncode != 0:
            raise CheckpointError(f"git {arguments[0]}: {done.stderr.strip()}")
        return done.stdout

    def snapshot(self, message: str) -> str:
        """A commit of the workspace as it is now, on the side ref."""
        index = Path(self.run("rev-parse", "--git-path", "index").strip())
        index = index if index.is_absolute() else self.top / index
        with tempfile.TemporaryDirectory(prefix="ds4-agent-index-") as folder:
            temporary = Path(folder) / "index"
            if index.exists():  # its stat cache spares hashing the unchanged files again
                # With its modification time: git re-hashes an entry recorded in the index's
                # own clock tick ("racy git"); a copy dated now would trust a same-size edit
                # made in that tick to be unchanged, and the snapshot would miss it.
                shutil.copy2(index, temporary)
            env = {"GIT_INDEX_FILE": str(temporary)}
            self.run("add", "--update", "--", self.prefix, env=env)
            untracked = [
                path
                for path in self.run(
                    "ls-files", "--others", "--exclude-standard", "-z", "--", self.prefix, env=env
                ).split("\0")
                if path and _small(self.top / path)
            ]
            if untracked:
                self.run(
                    "add",
                    "--pathspec-from-file=-",
                    "--pathspec-file-nul",
                    env=env,
                    stdin="\0".join(untracked),
                )
            tree = self.run("write-tree", env=env).strip()
        parents = ["-p", self.head] if self.head else []
        self.head = self.run("commit-tree", tree, *parents, "-m", message).strip()
        self.run("update-ref", self.ref, self.head)
        return self.head

    def changed(self, before: str, after: str) -> list[str]:
        """Repository paths that differ between two snapshots, inside the workspace."""
        out = self.run(
            "diff", "--name-only", "--no-renames", "-z", before, after, "--", self.prefix
        )
        return [path for path in out.split("\0") if path]

    def exists_in(self, commit: str, path: str) -> bool:
        return bool(self.run("ls-tree", "--name-only", commit, "--", path).strip())

    def restore(self, commit: str, paths: list[str]) -> list[str]:
        """Put ``paths`` back as they were in ``commit``; returns those that were not there
        (created after the snapshot), which are removed."""
        present = [path for path in paths if self.exists_in(commit, path)]
        if present:
            self.run("restore", f"--source={commit}", "--worktree", "--", *present)
        created = sorted(set(paths) - set(present))
        for path in created:
            (self.top / path).unlink(missing_ok=True)
        return created

    def diff(self, before: str, after: str) -> str:
        return self.run("diff", "--no-color", before, after, "--", self.prefix)


def _small(path: Path) -> bool:
    try:
        return path.stat().st_size <= MAX_UNTRACKED_SNAPSHOT_BYTES
    except OSError:
        return False


def _git_for(root: Path) -> _Git | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    top = Path(done.stdout.strip()).resolve()
    return _Git(top, root.relative_to(top).as_posix() if root != top else "")


class Checkpoints:
    def __init__(self, root: Path):
        self.root = root
        self.git = _git_for(root)
        self.stack: list[_Checkpoint] = []
        self._current: _Checkpoint | None = None
        self._session_start = ""  # git: the snapshot before the session's first change
        self.problem = ""  # why the last snapshot failed, if one did
        self._session_originals: dict[Path, bytes | None] = {}

    @property
    def kind(self) -> str:
        return "git" if self.git is not None else "files"

    def begin_prompt(self) -> None:
        self._current = None

    def before_tool(self, bash: bool = False) -> None:
        """Before a write, edit or bash runs: the prompt's snapshot, if not taken yet."""
        if self._current is None:
            self._current = _Checkpoint()
            if self.git is not None:
                self._current.before = self.git.snapshot("ds4-agent: before a prompt")
                self._session_start = self._session_start or self._current.before
        if bash and self.git is None and self._current.manifest is None:
            self._current.manifest = self._manifest()

    def before_file_change(self, path: Path) -> None:
        """Before write or edit changes ``path``: keep its content (files mode), and note the
        folders that will be made for it (an empty folder is in no snapshot)."""
        self.before_tool()
        if self._current is None:
            return
        self._current.new_folders.update(
            folder
            for folder in path.parents
            if folder.is_relative_to(self.root) and not folder.exists()
        )
        if self.git is not None:
            return
        if path not in self._current.originals:
            try:
                original: bytes | None = path.read_bytes()
            except FileNotFoundError:
                original = None
            self._current.originals[path] = original
            self._session_originals.setdefault(path, original)

    def end_prompt(self) -> None:
        """After the prompt: keep the checkpoint if the prompt changed anything."""
        current, self._current = self._current, None
        if current is None:
            return
        if self.git is not None:
            current.after = self.git.snapshot("ds4-agent: after a prompt")
            if not self.git.changed(current.before, current.after):
                return
        else:
            if current.manifest is not None:
                self._compare(current, current.manifest, self._manifest())
            if not current.originals and not current.beyond_undo:
                return
        self.stack.append(current)

    def _compare(
        self,
        checkpoint: _Checkpoint,
        before: dict[Path, tuple[int, int]],
        after: dict[Path, tuple[int, int]],
    ) -> None:
        """What bash did in files mode: new files can be undone (removed); changed or removed
        ones cannot (there is no copy)."""
        for path in after.keys() - before.keys() - checkpoint.originals.keys():
            checkpoint.originals[path] = None
            self._session_originals.setdefault(path, None)
        checkpoint.beyond_undo = sorted(
            path
            for path, state in before.items()
            if path not in checkpoint.originals and after.get(path) != state
        )

    def _manifest(self) -> dict[Path, tuple[int, int]]:
        """Size and modification time of the workspace's files (bounded)."""
        manifest = {}
        for count, (path, is_folder) in enumerate(Workspace(self.root).walk(self.root)):
            if count >= MAX_MANIFEST_ENTRIES:
                break
            if not is_folder:
                try:
                    info = path.lstat()
                except OSError:
                    continue
                manifest[path] = (info.st_size, info.st_mtime_ns)
        return manifest

    def undo(self) -> str:
        """Put back the files the last prompt that changed any changed; what was done."""
        if not self.stack:
            problem = f" (a snapshot failed: {self.problem})" if self.problem else ""
            return f"nothing to undo: no prompt of this session changed files{problem}"
        checkpoint = self.stack.pop()
        if self.git is not None:
            git = self.git
            paths = git.changed(checkpoint.before, checkpoint.after)
            removed = [git.top / path for path in git.restore(checkpoint.before, paths)]
            restored = [git.top / path for path in paths if git.top / path not in removed]
        else:
            removed, restored = [], []
            for path, original in checkpoint.originals.items():
                if original is None:
                    path.unlink(missing_ok=True)
                    removed.append(path)
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_atomically(path, original)
                    restored.append(path)
        folders = self._remove_emptied(checkpoint.new_folders)
        parts = []
        if restored:
            parts.append(
                f"restored {len(restored)} file(s) as they were before the last change: "
                + self._listed(restored)
            )
        if removed:
            parts.append(f"removed {len(removed)} file(s) it created: {self._listed(removed)}")
        if folders:
            parts.append(f"removed the folder(s) it created: {self._listed(folders)}")
        done = "; ".join(parts) or "the last change left no file to put back"
        if checkpoint.beyond_undo:
            done += (
                "\nnot restored (bash changed them, and only a git repository keeps "
                "their earlier content): "
                + ", ".join(str(path.relative_to(self.root)) for path in checkpoint.beyond_undo)
            )
        return done

    def _listed(self, paths: list[Path]) -> str:
        return ", ".join(sorted(str(path.relative_to(self.root)) for path in paths))

    @staticmethod
    def _remove_emptied(folders: set[Path]) -> list[Path]:
        """Remove those of the folders a prompt made that undo left empty; returns them, a
        removed folder's removed subfolders left out (it names them)."""
        removed: list[Path] = []
        for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):  # deepest first
            try:
                folder.rmdir()  # only when empty
            except OSError:
                continue
            removed.append(folder)
        return [f for f in removed if not any(f != o and f.is_relative_to(o) for o in removed)]

    def diff(self) -> str:
        """A unified diff of everything this session changed (clipped)."""
        if self.git is not None:
            if not self._session_start:
                return ""
            text = self.git.diff(self._session_start, self.git.snapshot("ds4-agent: /diff"))
        else:
            parts = []
            for path, original in sorted(self._session_originals.items()):
                relative = path.relative_to(self.root).as_posix()
                before = (original or b"").decode("utf-8", "replace").splitlines()
                try:
                    after: list[str] | None = (
                        path.read_bytes().decode("utf-8", "replace").splitlines()
                    )
                except FileNotFoundError:
                    after = None
                changed = list(
                    difflib.unified_diff(
                        before, after or [], f"a/{relative}", f"b/{relative}", lineterm=""
                    )
                )
                if not changed and (original is None) != (after is None):  # empty files
                    changed = [
                        f"--- a/{relative}",
                        f"+++ b/{relative}",
                        "(empty file " + ("created)" if after is not None else "removed)"),
                    ]
                parts += changed
            text = "\n".join(parts)
        lines = text.splitlines()
        if len(lines) > MAX_DIFF_LINES:
            lines = lines[:MAX_DIFF_LINES] + [f"... {len(lines) - MAX_DIFF_LINES} more lines"]
        return "\n".join(lines)
