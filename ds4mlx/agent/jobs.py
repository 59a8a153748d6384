"""Shell commands for the bash tool: foreground runs with a timeout, and background jobs.

Each command runs under ``bash -c`` in the workspace, in its own process group, with a marker
in its environment that its descendants inherit: stopping a command stops its process group
and every process still carrying the marker, so even children that left the group with
``setsid`` are found (through /proc, or ``ps`` where there is none). Output never accumulates
without bound: a reader thread keeps the first and the last bytes of what a command prints and
counts what it dropped in between, and it slows down once the middle is being dropped (so
``yes`` cannot make the agent spin either).
A command ending in ``&`` becomes a background job whose output ``status`` reads in bounded
slices, from where it last stopped.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# How often a foreground command checks for its timeout and the user's Ctrl+C.
_POLL_SECONDS = 0.05
# Between SIGTERM and SIGKILL: short, so that a stopped command returns within a second.
_TERM_GRACE_SECONDS = 0.3
# After a foreground command exits, how long processes it left behind may keep its output open.
_DRAIN_SECONDS = 0.5
# Read size of the output pumps, and their pause per read once output is being dropped.
_READ_BYTES = 1 << 16
_OVERFLOW_PAUSE_SECONDS = 0.005

FOREGROUND_HEAD_BYTES = 32 * 1024
FOREGROUND_TAIL_BYTES = 64 * 1024
JOB_HEAD_BYTES = 64 * 1024
JOB_TAIL_BYTES = 256 * 1024
# The environment variable that marks every process a command starts.
MARKER_VARIABLE = "DS4_AGENT_COMMAND"
PROC = "/proc"


class BoundedOutput:
    """The first ``head_limit`` and the last ``tail_limit`` bytes of a stream, and its length.

    Positions count bytes of the whole stream, so a reader can ask for what arrived since a
    position it saw before; what fell between head and tail is reported as omitted.
    """

    def __init__(self, head_limit: int, tail_limit: int):
        self.head_limit = head_limit
        self.tail_limit = tail_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self._lock = threading.Lock()

    @property
    def stored(self) -> int:
        return len(self.head) + len(self.tail)

    @property
    def overflowing(self) -> bool:
        return len(self.tail) >= self.tail_limit

    def append(self, data: bytes) -> None:
        with self._lock:
            self.total += len(data)
            room = self.head_limit - len(self.head)
            if room > 0:
                self.head += data[:room]
                data = data[room:]
            if data:
                self.tail += data
                if len(self.tail) > self.tail_limit:
                    del self.tail[: len(self.tail) - self.tail_limit]

    def text_since(self, position: int = 0, limit: int | None = None) -> tuple[str, int]:
        """The stream from ``position`` on, and the position to continue from. What was not
        kept, or does not fit in ``limit`` bytes (a third from the start, the rest from the
        end), is replaced by a line saying how many bytes were omitted."""
        with self._lock:
            tail_start = self.total - len(self.tail)
            first = bytes(self.head[position:])
            last = bytes(self.tail[max(0, position - tail_start) :])
            unread = self.total - position
        if limit is not None and len(first) + len(last) > limit:
            # Room the end does not fill goes to the start: the slice stays ``limit`` long.
            keep_last = min(len(last), limit - min(len(first), limit // 3))
            keep_first = limit - keep_last
            first, last = first[:keep_first], last[len(last) - keep_last :]
        omitted = unread - len(first) - len(last)
        text = first.decode("utf-8", "replace")
        if omitted > 0:
            text += f"\n[... {omitted} bytes omitted ...]\n"
        return text + last.decode("utf-8", "replace"), position + unread


def _pump(fd: int, output: BoundedOutput, stop: threading.Event) -> None:
    """Read ``fd`` into ``output`` until end of file or ``stop``; closes ``fd``."""
    try:
        while not stop.is_set():
            readable, _, _ = select.select([fd], [], [], _POLL_SECONDS)
            if not readable:
                continue
            data = os.read(fd, _READ_BYTES)
            if not data:
                return
            output.append(data)
            if output.overflowing:
                time.sleep(_OVERFLOW_PAUSE_SECONDS)
    finally:
        os.close(fd)


def _marked_processes(marker: str) -> list[int]:
    """Processes whose environment carries ``marker``: from /proc on Linux, from ``ps``
    where there is no /proc (macOS)."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    try:
        entries = os.listdir(PROC)
    except OSError:
        return _marked_by_ps(needle.decode())
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"{PROC}/{entry}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return found


# ``ps`` listing every process with its environment: BSD/macOS spelling, then procps'.
_PS_WITH_ENVIRONMENT = (
    ["ps", "-A", "-E", "-ww", "-o", "pid=,command="],
    ["ps", "-A", "-ww", "-o", "pid=,command=", "e"],
)


def _marked_by_ps(needle: str) -> list[int]:
    for command in _PS_WITH_ENVIRONMENT:
        try:
            listing = subprocess.run(
                command, capture_output=True, text=True, errors="replace", timeout=5
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if listing.returncode == 0:
            found = []
            for line in listing.stdout.splitlines():
                pid, _, rest = line.strip().partition(" ")
                if pid.isdigit() and needle in rest.split():
                    found.append(int(pid))
            return found
    return []


def _signal_all(process: subprocess.Popen, marker: str, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in _marked_processes(marker):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue


class _Command:
    """One running ``bash -c``, its marker and its output pump."""

    def __init__(self, command: str, cwd: Path, head: int, tail: int):
        self.marker = uuid.uuid4().hex
        self.output = BoundedOutput(head, tail)
        read_end, write_end = os.pipe()
        try:
            self.process = subprocess.Popen(
                ["bash", "-c", command],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, MARKER_VARIABLE: self.marker},
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        self._stop_reading = threading.Event()
        self.reader = threading.Thread(
            target=_pump, args=(read_end, self.output, self._stop_reading), daemon=True
        )
        try:
            self.reader.start()
        except BaseException:  # e.g. a signal's SystemExit: the command must not outlive it
            os.close(read_end)
            self.kill()
            raise

    def kill(self) -> None:
        """Stop the process group and every marked process: TERM, a short grace, then KILL."""
        _signal_all(self.process, self.marker, signal.SIGTERM)
        try:
            self.process.wait(timeout=_TERM_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        _signal_all(self.process, self.marker, signal.SIGKILL)
        try:
            self.process.wait(timeout=_TERM_GRACE_SECONDS)
        except subprocess.TimeoutExpired:  # stuck in the kernel; reaped when it gets out
            pass

    def finish_reading(self, wait: float) -> None:
        """Let the reader drain for up to ``wait`` seconds, then stop it."""
        self.reader.join(wait)
        self._stop_reading.set()
        self.reader.join()


@dataclass
class CommandOutcome:
    output: str
    exit_code: int | None  # None: the command was stopped (timeout or cancellation)
    timed_out: bool = False
    cancelled: bool = False
    stopped_leftovers: bool = False  # processes it left behind held its output and were ended


@dataclass
class BackgroundJob:
    number: int
    command: str
    handle: _Command
    started: float = field(default_factory=time.monotonic)
    read_offset: int = 0

    @property
    def output(self) -> BoundedOutput:
        return self.handle.output

    @property
    def running(self) -> bool:
        return self.handle.process.poll() is None

    def state(self) -> str:
        elapsed = time.monotonic() - self.started
        if self.running:
            return f"job {self.number} running for {elapsed:.0f}s: {self.command}"
        return (
            f"job {self.number} exited with code {self.handle.process.returncode}: {self.command}"
        )

    def new_output(self, limit: int) -> str:
        """What the job printed since the last call, at most ``limit`` bytes of it (the
        middle of a flood is reported as omitted)."""
        text, self.read_offset = self.output.text_since(self.read_offset, limit)
        return text


class JobRunner:
    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.jobs: dict[int, BackgroundJob] = {}
        # The output of the foreground command while it runs (the UI shows its tail live).
        self.current: BoundedOutput | None = None

    def run(self, command: str, timeout: float, cancel: threading.Event) -> CommandOutcome:
        """Run ``command`` to completion, or until ``timeout`` seconds or ``cancel``."""
        handle = _Command(command, self.cwd, FOREGROUND_HEAD_BYTES, FOREGROUND_TAIL_BYTES)
        timed_out = cancelled = leftovers = False
        try:
            self.current = handle.output
            deadline = time.monotonic() + timeout
            while handle.process.poll() is None:
                timed_out = time.monotonic() >= deadline
                cancelled = cancel.is_set()
                if timed_out or cancelled:
                    handle.kill()
                    break
                try:
                    handle.process.wait(timeout=_POLL_SECONDS)
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:  # SIGTERM's SystemExit, KeyboardInterrupt: nothing may linger
            handle.kill()
            handle.finish_reading(0)
            raise
        finally:
            self.current = None
        handle.reader.join(_DRAIN_SECONDS)
        if handle.reader.is_alive():  # something it started still holds the output open
            handle.kill()
            leftovers = not (timed_out or cancelled)
        handle.finish_reading(_DRAIN_SECONDS)
        text, _ = handle.output.text_since(0)
        stopped = timed_out or cancelled
        return CommandOutcome(
            text,
            None if stopped else handle.process.returncode,
            timed_out=timed_out,
            cancelled=cancelled and not timed_out,
            stopped_leftovers=leftovers,
        )

    def start(self, command: str) -> BackgroundJob:
        number = max(self.jobs, default=0) + 1
        job = BackgroundJob(
            number, command, _Command(command, self.cwd, JOB_HEAD_BYTES, JOB_TAIL_BYTES)
        )
        self.jobs[number] = job
        return job

    def stop(self, job: BackgroundJob) -> None:
        job.handle.kill()
        job.handle.finish_reading(_DRAIN_SECONDS)

    def running_jobs(self) -> list[BackgroundJob]:
        return [job for job in self.jobs.values() if job.running]

    def close(self) -> None:
        """Stop every job and whatever it left running (the agent is exiting)."""
        for job in self.jobs.values():
            if job.running or job.handle.reader.is_alive():
                self.stop(job)
