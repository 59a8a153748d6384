"""Shell commands for the bash tool: foreground runs with a timeout, and background jobs.

Each command runs under ``bash -c`` in the workspace, in its own process group so that stopping
it also stops whatever it started. A command ending in ``&`` becomes a background job: its output
goes to a file that ``status`` reads from where it last stopped, and ``stop`` ends it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# How often a foreground command checks for the user's Ctrl+C while it waits.
_POLL_SECONDS = 0.1


@dataclass
class CommandOutcome:
    output: str
    exit_code: int | None  # None: the command was stopped (timeout or cancellation)
    timed_out: bool = False
    cancelled: bool = False


@dataclass
class BackgroundJob:
    number: int
    command: str
    process: subprocess.Popen
    log_path: Path
    started: float = field(default_factory=time.monotonic)
    read_offset: int = 0

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def state(self) -> str:
        elapsed = time.monotonic() - self.started
        if self.running:
            return f"job {self.number} running for {elapsed:.0f}s: {self.command}"
        return f"job {self.number} exited with code {self.process.returncode}: {self.command}"

    def new_output(self) -> str:
        """What the job printed since the last call."""
        with open(self.log_path, "rb") as log:
            log.seek(self.read_offset)
            data = log.read()
        self.read_offset += len(data)
        return data.decode("utf-8", errors="replace")


def _stop_group(process: subprocess.Popen) -> None:
    """Terminate the command's whole process group, then kill it if it lingers."""
    for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


class JobRunner:
    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.jobs: dict[int, BackgroundJob] = {}
        self._log_dir = tempfile.TemporaryDirectory(prefix="ds4-agent-jobs-")

    def run(self, command: str, timeout: float, cancel: threading.Event) -> CommandOutcome:
        """Run ``command`` to completion, or until ``timeout`` seconds or ``cancel``."""
        process = subprocess.Popen(
            ["bash", "-c", command], cwd=self.cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                output, _ = process.communicate(timeout=_POLL_SECONDS)
                return CommandOutcome(output.decode("utf-8", "replace"), process.returncode)
            except subprocess.TimeoutExpired:
                timed_out = time.monotonic() >= deadline
                if timed_out or cancel.is_set():
                    _stop_group(process)
                    output, _ = process.communicate()
                    return CommandOutcome(output.decode("utf-8", "replace"), None,
                                          timed_out=timed_out, cancelled=not timed_out)

    def start(self, command: str) -> BackgroundJob:
        number = max(self.jobs, default=0) + 1
        log_path = Path(self._log_dir.name) / f"job-{number}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                ["bash", "-c", command], cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        job = BackgroundJob(number, command, process, log_path)
        self.jobs[number] = job
        return job

    def stop(self, job: BackgroundJob) -> None:
        _stop_group(job.process)

    def running_jobs(self) -> list[BackgroundJob]:
        return [job for job in self.jobs.values() if job.running]

    def close(self) -> None:
        """Stop every job still running (the agent is exiting) and remove their logs."""
        for job in self.running_jobs():
            self.stop(job)
        self._log_dir.cleanup()
