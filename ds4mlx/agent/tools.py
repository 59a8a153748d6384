"""The agent's tools: what each call does to the workspace and what the model reads back.

Results are plain text shaped like the tool results in the tiny model's training corpus
(``list``: size then path; ``read``: numbered lines; ``search``: ``path:line: text``; ``edit``:
a summary line then the changed lines). Anything wrong with a call (unknown tool, bad argument,
refused path, missing file) becomes an error result the model can react to; nothing raises.
"""

from __future__ import annotations

import difflib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ds4mlx.agent import symbols
from ds4mlx.agent.files import is_regular, read_regular, write_atomically
from ds4mlx.agent.jobs import JobRunner
from ds4mlx.agent.tool_schemas import AGENT_TOOLS
from ds4mlx.agent.workspace import ToolError, Workspace
from ds4mlx.generation import ToolCall

import regex

TOOLS_NEEDING_PERMISSION = frozenset({"write", "edit", "bash"})

_SCHEMAS: dict[str, dict[str, Any]] = {
    tool["function"]["name"]: tool["function"]["parameters"] for tool in AGENT_TOOLS
}

MAX_FILE_BYTES = 16 * 2**20
MAX_SEARCH_FILE_BYTES = 2 * 2**20
MAX_OUTLINE_FILE_BYTES = 2 * 2**20
MAX_SEARCH_MATCHES = 100
MAX_LIST_ENTRIES = 300
LIST_DEPTH = 3
MAX_MATCH_LINE_CHARS = 200
# Walks (list, search, symbols by name) stop after this many entries or seconds.
MAX_WALK_ENTRIES = 50_000
WALK_SECONDS = 10.0
# A search stops after this long in all (wall clock), or at once on Ctrl+C; one line's match may
# take at most SEARCH_LINE_SECONDS of CPU time before the pattern is reported as too slow.
SEARCH_SECONDS = 10.0
SEARCH_LINE_SECONDS = 0.5
_SEARCH_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the model reads
    is_error: bool = False
    diff: str = ""  # a unified diff of the change, for people to look at


@dataclass
class _ReadPosition:
    """Where the last read stopped, for ``more``."""

    path: str  # as the model gave it: resolved again on every ``more``
    next_line: int


class ToolBox:
    """Runs tool calls inside one workspace."""

    schemas = AGENT_TOOLS

    def __init__(
        self,
        workspace: Workspace,
        *,
        bash_timeout: float = 60.0,
        max_output_chars: int = 16000,
        read_lines: int = 200,
    ):
        self.workspace = workspace
        self.bash_timeout = bash_timeout
        self.max_output_chars = max_output_chars
        self.read_lines = read_lines
        self.jobs = JobRunner(workspace.root)
        self.changed_files: set[str] = set()
        # Called with a file's path just before write or edit changes it (undo checkpoints).
        self.before_change: Callable[[Path], None] | None = None
        self._cancel = threading.Event()
        self._read_position: _ReadPosition | None = None
        self._tools: dict[str, Callable[..., ToolResult]] = {
            "list": self._list,
            "read": self._read,
            "more": self._more,
            "search": self._search,
            "write": self._write,
            "edit": self._edit,
            "bash": self._bash,
            "status": self._status,
            "stop": self._stop,
            "symbols": self._symbols,
        }

    def run(self, call: ToolCall, cancel: threading.Event | None = None) -> ToolResult:
        """Run ``call``; long work (commands, walks, searches) stops soon after ``cancel``."""
        self._cancel = cancel or threading.Event()
        try:
            arguments = _checked_arguments(call)
            result = self._tools[call.name](**arguments)
        except ToolError as exc:
            return ToolResult(f"error: {exc}", is_error=True)
        except OSError as exc:
            return ToolResult(f"error: {exc.strerror or exc}", is_error=True)
        except ValueError as exc:  # e.g. text that cannot be encoded as UTF-8
            return ToolResult(f"error: {exc}", is_error=True)
        return ToolResult(_clip(result.output, self.max_output_chars), result.is_error, result.diff)

    def open_state(self) -> str:
        """What a summary of the conversation must not lose: running jobs, changed files."""
        lines = [job.state() for job in self.jobs.running_jobs()]
        if self.changed_files:
            lines.append("files changed so far: " + ", ".join(sorted(self.changed_files)))
        return "\n".join(lines)

    def close(self) -> None:
        self.jobs.close()

    # ------------------------------------------------------------------ files

    def _list(self, path: str = ".") -> ToolResult:
        target = self._existing(path)
        if target.is_file():
            return ToolResult(f"{target.stat().st_size:8d}  {self.workspace.relative(target)}")
        if not target.is_dir():
            raise ToolError(f"{path} is not a file or folder")
        lines: list[str] = []
        omitted = 0
        walk = _Walk(self.workspace.walk(target), self._cancel)
        for entry, is_folder in walk:
            relative = entry.relative_to(target)
            if len(relative.parts) > LIST_DEPTH:
                continue
            if len(lines) == MAX_LIST_ENTRIES:
                omitted += 1
                continue
            if is_folder:
                lines.append(f"{'-':>8}  {relative.as_posix()}/")
            else:
                lines.append(f"{_size(entry):8d}  {relative.as_posix()}")
        if omitted:
            more = "at least " if walk.stopped else ""
            lines.append(f"... {more}{omitted} more entries; list a subfolder to see them")
        if walk.stopped:
            lines.append(walk.stopped)
        return ToolResult("\n".join(lines) if lines else "(empty folder)")

    def _read(self, path: str, start: int = 1, end: int | None = None) -> ToolResult:
        target = self._existing(path)
        lines = _text_lines(target)
        if start < 1:
            raise ToolError("start is 1-based and must be at least 1")
        if lines and start > len(lines):
            raise ToolError(f"{path} has {len(lines)} lines; start {start} is past the end")
        if end is None:
            end = start + self.read_lines - 1
        if end < start:
            raise ToolError(f"end ({end}) is before start ({start})")
        return self._show_lines(path, lines, start, end)

    def _more(self, count: int | None = None) -> ToolResult:
        position = self._read_position
        if position is None:
            raise ToolError("nothing to continue: read a file first")
        # Resolved and checked again: the file may have been swapped for a link since.
        target = self._existing(position.path)
        lines = _text_lines(target)
        if position.next_line > len(lines):
            return ToolResult(f"(end of {self.workspace.relative(target)})")
        count = count if count and count > 0 else self.read_lines
        return self._show_lines(
            position.path, lines, position.next_line, position.next_line + count - 1
        )

    def _show_lines(self, path: str, lines: list[str], start: int, end: int) -> ToolResult:
        end = min(end, len(lines))
        shown = "\n".join(f"{n:5d}  {line}" for n, line in enumerate(lines[start - 1 : end], start))
        self._read_position = _ReadPosition(path, end + 1)
        remaining = len(lines) - end
        if remaining > 0:
            shown += f"\n... {remaining} more lines; call more to continue"
        return ToolResult(shown or "(empty file)")

    def _search(self, pattern: str, path: str = ".") -> ToolResult:
        try:
            compiled = regex.compile(pattern)  # version 0: the syntax of Python's re
        except regex.error as exc:
            raise ToolError(f"bad regular expression {pattern!r}: {exc}") from None
        target = self._existing(path)
        if not target.is_dir() and not is_regular(target):
            raise ToolError(f"{path} is not a regular file; only regular files are searched")
        if target.is_file() and target.stat().st_size > MAX_SEARCH_FILE_BYTES:
            raise ToolError(
                f"{path} is larger than {MAX_SEARCH_FILE_BYTES // 2**20} MiB; search a smaller file"
            )
        entries = iter([(target, False)]) if not target.is_dir() else self.workspace.walk(target)
        search = _Search(compiled, entries, self.workspace)
        worker = threading.Thread(target=search.run, name="ds4-agent-search", daemon=True)
        worker.start()
        deadline = time.monotonic() + SEARCH_SECONDS
        while worker.is_alive():
            worker.join(_SEARCH_POLL_SECONDS)
            if self._cancel.is_set():
                search.stop("(stopped by the user; the result is incomplete)")
            elif time.monotonic() >= deadline:
                search.stop(f"(stopped after {SEARCH_SECONDS:g}s; the result is incomplete)")
            else:
                continue
            break
        return search.result(pattern)

    def _write(self, path: str, content: str) -> ToolResult:
        target, before = self._write_target(path)
        data = content.encode("utf-8")  # fails before the file is touched
        self._notify_change(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, data)
        relative = self.workspace.relative(target)
        self.changed_files.add(relative)
        lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
        return ToolResult(
            f"wrote {relative}: {lines} lines, {len(data)} bytes",
            diff=_unified_diff(relative, before, content),
        )

    def _edit(self, path: str, old: str, new: str) -> ToolResult:
        target, before, after = self._edited(path, old, new)
        self._notify_change(target)
        write_atomically(target, after.encode("utf-8", errors="surrogateescape"))
        relative = self.workspace.relative(target)
        self.changed_files.add(relative)
        diff = _unified_diff(relative, _printable(before), _printable(after))
        changed = [line for line in diff.splitlines()[2:] if line[:1] in "+-"]
        return ToolResult(f"edited {relative}: 1 replacement\n" + "\n".join(changed), diff=diff)

    def _symbols(self, path: str = ".", name: str | None = None) -> ToolResult:
        target = self._existing(path)
        stopped = ""
        if not target.is_dir():
            found = [(target, s) for s in self._outline(target) if name in (None, s.name)]
        elif name is None:
            raise ToolError("give a file to outline, or a name to find")
        else:
            walk = _Walk(self.workspace.walk(target), self._cancel)
            found = [
                (file, s)
                for file, is_folder in walk
                if not is_folder
                and symbols.language_for(file)
                and _size(file) <= MAX_OUTLINE_FILE_BYTES
                and is_regular(file)
                for s in self._outline(file)
                if s.name == name
            ]
            stopped = walk.stopped
        if not found:
            missing = f"no definition of {name!r}" if name else "no definitions"
            return ToolResult(missing + (f"\n{stopped}" if stopped else ""))
        if target.is_file() and name is None:
            return ToolResult(
                "\n".join(
                    f"{s.start_line:5d}-{s.end_line:<5d} {'  ' * s.depth}{s.kind} {s.name}"
                    for _, s in found
                )
            )
        listing = "\n".join(
            f"{self.workspace.relative(file)}:{s.start_line}-{s.end_line}: {s.kind} {s.name}"
            for file, s in found
        )
        return ToolResult(listing + (f"\n{stopped}" if stopped else ""))

    def _outline(self, file: Path) -> list[symbols.Symbol]:
        language = symbols.language_for(file)
        relative = self.workspace.relative(file)
        if language is None:
            raise ToolError(
                f"{relative}: no outline for this kind of file "
                f"(supported: {', '.join(sorted(symbols.LANGUAGE_BY_SUFFIX))})"
            )
        return symbols.outline(
            read_regular(file, MAX_OUTLINE_FILE_BYTES, relative), language, self._cancel.is_set
        )

    def _existing(self, path: str) -> Path:
        target = self.workspace.resolve(path)
        if not target.exists():
            hint = ""
            if path != path.strip() and (self.workspace.root / path.strip()).exists():
                hint = f" (note the spaces around the name; {path.strip()!r} exists)"
            raise ToolError(f"{path} does not exist{hint}")
        return target

    def _write_target(self, path: str) -> tuple[Path, str]:
        """Where ``write`` would write ``path``, and the text it holds now ("" if new)."""
        if not path.strip():
            raise ToolError("the path is empty; give the file to write")
        target = self.workspace.resolve(path)
        if target.is_dir():
            raise ToolError(f"{path} is a folder")
        for folder in reversed(target.parents):
            if (
                folder.is_relative_to(self.workspace.root)
                and folder.exists()
                and not folder.is_dir()
            ):
                raise ToolError(
                    f"{self.workspace.relative(folder)} is a file, not a folder; "
                    f"cannot create {path} inside it"
                )
        if target.exists() and not is_regular(target):
            raise ToolError(f"{path} exists and is not a regular file; refused")
        return target, _read_text(target) if target.exists() else ""

    def _edited(self, path: str, old: str, new: str) -> tuple[Path, str, str]:
        """The file ``edit`` would change, its text before and after."""
        if not path.strip():
            raise ToolError("the path is empty; give the file to edit")
        target = self._existing(path)
        if target.is_dir():
            raise ToolError(f"{path} is a folder")
        if not old:
            raise ToolError("old is empty; give the exact text to replace")
        # Bytes that are not UTF-8 survive the edit untouched (surrogateescape round trip).
        before = _read_text(target, errors="surrogateescape")
        count = before.count(old)
        if count == 0:
            raise ToolError(
                f"the old text was not found in {path}; read the file and copy "
                "the text exactly, including whitespace"
            )
        if count > 1:
            raise ToolError(
                f"the old text occurs {count} times in {path}; include more "
                "surrounding lines so that it is unique"
            )
        return target, before, before.replace(old, new, 1)

    def _notify_change(self, target: Path) -> None:
        if self.before_change is not None:
            self.before_change(target)

    def _planned_change(self, call: ToolCall) -> tuple[Path, str, str] | None:
        """The file a write or edit call would change, its text before and after; None for
        other tools. Raises what the call would fail with."""
        arguments = _checked_arguments(call)
        if call.name == "write":
            target, before = self._write_target(arguments["path"])
            return target, before, arguments["content"]
        if call.name == "edit":
            return self._edited(arguments["path"], arguments["old"], arguments["new"])
        return None

    def would_fail(self, call: ToolCall) -> ToolResult | None:
        """The error result a write or edit call will end with, known before it runs (so
        that nobody is asked to allow it); None when it may succeed, and for other tools."""
        try:
            self._planned_change(call)
        except (ToolError, OSError, ValueError) as exc:
            return ToolResult(f"error: {getattr(exc, 'strerror', None) or exc}", is_error=True)
        return None

    def preview(self, call: ToolCall) -> str:
        """The exact diff a write or edit call would make, without making it; a line saying
        why it would fail instead, and "" for other tools."""
        try:
            planned = self._planned_change(call)
        except (ToolError, OSError, ValueError) as exc:
            return f"(this call would fail: {getattr(exc, 'strerror', None) or exc})"
        if planned is None:
            return ""
        target, before, after = planned
        relative = self.workspace.relative(target)
        diff = _unified_diff(relative, _printable(before), _printable(after))
        return diff or f"(no change to {relative})"

    # ------------------------------------------------------------------ commands

    def _bash(self, command: str) -> ToolResult:
        command = command.strip()
        if not command:
            raise ToolError("the command is empty")
        if command.endswith("&") and not command.endswith("&&"):
            job = self.jobs.start(command[:-1].rstrip())
            return ToolResult(
                f"started background job {job.number}: {job.command}\n"
                "use status to see its output and stop to end it"
            )
        outcome = self.jobs.run(command, self.bash_timeout, self._cancel)
        output = outcome.output.rstrip("\n")
        if outcome.timed_out:
            output += (
                f"\n(timed out after {self.bash_timeout:g}s and was stopped; end a "
                "long command with & to run it in the background)"
            )
        elif outcome.cancelled:
            output += "\n(stopped by the user)"
        elif outcome.exit_code:
            output += f"\n(exit code {outcome.exit_code})"
        if outcome.stopped_leftovers:
            output += (
                "\n(processes it left running held its output open and were stopped; "
                "end a command with & to run it as a background job)"
            )
        return ToolResult(output.strip("\n") or "(no output)", is_error=outcome.exit_code != 0)

    def _status(self, job: int | None = None) -> ToolResult:
        jobs = [self._job(job)] if job is not None else list(self.jobs.jobs.values())
        if not jobs:
            return ToolResult("no background jobs")
        reports = []
        for each in jobs:
            output = each.new_output(self.max_output_chars - 200).rstrip("\n")
            reports.append(each.state() + (f"\n{output}" if output else ""))
        return ToolResult("\n\n".join(reports))

    def _stop(self, job: int) -> ToolResult:
        found = self._job(job)
        if not found.running:
            return ToolResult(found.state())
        self.jobs.stop(found)
        output = found.new_output(self.max_output_chars - 200).rstrip("\n")
        return ToolResult(f"stopped job {job}" + (f"\n{output}" if output else ""))

    def _job(self, number: int):
        if number not in self.jobs.jobs:
            raise ToolError(f"there is no job {number}")
        return self.jobs.jobs[number]


# Arguments too bulky for a one-line description of a call.
_UNDESCRIBED = {"old", "new", "content"}


def describe_call(call: ToolCall, width: int | None = 80) -> str:
    """One line naming a call and its main arguments, e.g. ``read src/a.py 10 20``; cut to
    ``width`` characters with a trailing "…" unless ``width`` is None."""
    values = [
        " ".join(str(value).split())
        for key, value in call.arguments.items()
        if key not in _UNDESCRIBED
    ]
    line = " ".join([call.name, *values])
    return line if width is None or len(line) <= width else line[: width - 1] + "…"


def _checked_arguments(call: ToolCall) -> dict[str, Any]:
    """The call's arguments converted to the schema's types; ToolError when they do not fit."""
    schema = _SCHEMAS.get(call.name)
    if schema is None:
        raise ToolError(f"unknown tool {call.name!r}; the tools are {', '.join(_SCHEMAS)}")
    properties = schema["properties"]
    unknown = sorted(set(call.arguments) - set(properties))
    if unknown:
        raise ToolError(
            f"{call.name} has no parameter {', '.join(map(repr, unknown))}; its "
            f"parameters are {', '.join(properties)}"
        )
    missing = [name for name in schema["required"] if name not in call.arguments]
    if missing:
        raise ToolError(f"{call.name} needs {', '.join(map(repr, missing))}")
    return {
        name: _converted(call.name, name, value, properties[name]["type"])
        for name, value in call.arguments.items()
    }


def _converted(tool: str, name: str, value: Any, kind: str) -> Any:
    # Models often write numbers as strings (string="true"); accept what is unambiguous.
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
            return int(value)
        raise ToolError(f"{tool}: {name} must be an integer, got {value!r}")
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ToolError(f"{tool}: {name} must be a string, got {value!r}")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_text(path: Path, errors: str = "replace") -> str:
    """The file's text, line endings as they are; undecodable bytes per ``errors``."""
    data = read_regular(path, MAX_FILE_BYTES)
    if b"\x00" in data[:8192]:
        raise ToolError(f"{path.name} is a binary file")
    return data.decode("utf-8", errors=errors)


def _printable(text: str) -> str:
    """``text`` with escaped undecodable bytes shown as replacement characters."""
    return text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


def _text_lines(path: Path) -> list[str]:
    return _read_text(path).splitlines()


class _Search:
    """One search, in a thread of its own so that the tool can give up on it at once (Ctrl+C,
    the time budget). The regex releases the GIL, and one line's match ends by itself after
    ``SEARCH_LINE_SECONDS`` of CPU time (the ``regex`` package counts CPU time, which a loaded
    machine stretches), so an abandoned search does not run on for long."""

    def __init__(
        self, compiled: regex.Pattern, entries: Iterator[tuple[Path, bool]], workspace: Workspace
    ):
        self.compiled = compiled
        self.entries = entries
        self.workspace = workspace
        self.matches: list[str] = []
        self.more = False
        self.error = ""
        self.stopped = ""
        self._stop = threading.Event()

    def stop(self, why: str) -> None:
        self.stopped = why
        self._stop.set()

    def run(self) -> None:
        walk = _Walk(self.entries, self._stop, seconds=float("inf"))
        try:
            for file, is_folder in walk:
                if is_folder or _size(file) > MAX_SEARCH_FILE_BYTES or not is_regular(file):
                    continue
                try:
                    lines = _text_lines(file)
                except (ToolError, OSError):  # binary or unreadable: not for a text search
                    continue
                if not self._search_lines(self.workspace.relative(file), lines):
                    return
        finally:
            if walk.stopped and not self._stop.is_set():  # the walk's entry limit
                self.stopped = walk.stopped

    def _search_lines(self, relative: str, lines: list[str]) -> bool:
        """Record the matches in one file; False when the search must end."""
        for number, line in enumerate(lines, 1):
            if self._stop.is_set():
                return False
            try:
                found = self.compiled.search(line, timeout=SEARCH_LINE_SECONDS, concurrent=True)
            except TimeoutError:
                self.error = (
                    f"the pattern took more than {SEARCH_LINE_SECONDS:g}s of CPU on {relative}:"
                    f"{number} ({len(line)} characters) and the search was stopped; it likely "
                    "backtracks catastrophically (nested repetition such as (a+)+): simplify it"
                )
                return False
            if found:
                self.matches.append(f"{relative}:{number}: {line.strip()[:MAX_MATCH_LINE_CHARS]}")
                if len(self.matches) > MAX_SEARCH_MATCHES:
                    self.more = True
                    return False
        return True

    def result(self, pattern: str) -> ToolResult:
        if self.error and not self._stop.is_set():
            raise ToolError(self.error)
        lines = list(self.matches[:MAX_SEARCH_MATCHES])
        if self.more:
            lines.append(
                f"... more than {MAX_SEARCH_MATCHES} matches; narrow the pattern or the path"
            )
        if self.stopped:
            lines.append(self.stopped)
        return ToolResult("\n".join(lines) if lines else f"no match for {pattern!r}")


class _Walk:
    """A workspace walk that ends early after ``MAX_WALK_ENTRIES`` entries, ``seconds`` or the
    user's Ctrl+C; ``stopped`` then says why (for the tool's result)."""

    def __init__(
        self,
        entries: Iterator[tuple[Path, bool]],
        cancel: threading.Event,
        seconds: float = WALK_SECONDS,
    ):
        self.entries = entries
        self.cancel = cancel
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.stopped = ""

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def expired(self) -> bool:
        if self.cancel.is_set():
            self.stopped = "(stopped by the user; the result is incomplete)"
        elif self.remaining() <= 0:
            self.stopped = f"(stopped after {self.seconds:g}s; the result is incomplete)"
        return bool(self.stopped)

    def __iter__(self) -> Iterator[tuple[Path, bool]]:
        for count, entry in enumerate(self.entries):
            if count >= MAX_WALK_ENTRIES:
                self.stopped = (
                    f"(stopped after {MAX_WALK_ENTRIES} entries; the result is "
                    "incomplete: give a narrower path)"
                )
                return
            if self.expired():
                return
            yield entry


def _unified_diff(relative: str, before: str, after: str) -> str:
    return "\n".join(
        difflib.unified_diff(
            before.splitlines(),
            after.splitlines(),
            fromfile=f"a/{relative}",
            tofile=f"b/{relative}",
            n=2,
            lineterm="",
        )
    )


def _clip(text: str, limit: int) -> str:
    """Keep the start and the end of an over-long result: a third from the start, the rest
    from the end (the end of a log matters most: the error, the summary), as jobs do."""
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - tail :]}"
