"""Background jobs report each piece of output once, and stop even when they ignore SIGTERM;
marked processes are found by their exact marker (in /proc or a ps listing), signalling goes on
past processes that are gone, and a command that fails to start or is interrupted leaves
nothing running or open.

Each test fails on a mutation of the blind set ``scripts/mutation_sets/fresh6.py`` that the
suite missed in its first pass (named in each test).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from ds4mlx.agent import jobs
from ds4mlx.engine.chat import ToolCall

import pytest

DEADLINE_S = 20.0


def run(toolbox, name: str, **arguments):
    return toolbox.run(ToolCall(name, arguments))


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {DEADLINE_S:g}s"
        time.sleep(0.05)


def test_status_reports_a_jobs_output_once(toolbox, workspace: Path):
    """(jobs_status_rereads_from_the_start) Each status shows what the job printed since the
    last one, not everything again."""
    # Printed values the command's own text (in each status line) does not contain.
    script = "echo $((42*1001)); until [ -e GO ]; do sleep 0.05; done; echo $((63*1001)); sleep 30"
    started = run(toolbox, "bash", command=f"bash -c '{script}' &")
    assert "started background job 1" in started.output
    job = toolbox.jobs.jobs[1]
    wait_for(lambda: "42042" in job.output.text_since(0)[0], "the first output")
    first = run(toolbox, "status", job=1).output
    assert "42042" in first
    (workspace / "GO").touch()
    wait_for(lambda: "63063" in job.output.text_since(0)[0], "the second output")
    second = run(toolbox, "status", job=1).output
    assert "63063" in second and "42042" not in second
    assert "42042" not in run(toolbox, "status").output
    run(toolbox, "stop", job=1)


def test_stop_ends_a_job_that_ignores_sigterm(toolbox, workspace: Path):
    """(jobs_stop_never_escalates_to_kill) TERM, a short grace, then KILL: a job that traps
    TERM is still stopped."""
    script = 'trap "" TERM; echo ready; while :; do sleep 0.05; done'
    run(toolbox, "bash", command=f"bash -c '{script}' &")
    job = toolbox.jobs.jobs[1]
    wait_for(lambda: "ready" in job.output.text_since(0)[0], "the job's start")
    stopped = run(toolbox, "stop", job=1)
    assert "stopped job 1" in stopped.output
    wait_for(lambda: not job.running, "the job's end")
    assert job.handle.process.returncode == -9  # SIGKILL


def test_marked_processes_are_found_by_their_exact_marker(tmp_path, monkeypatch):
    environments = {
        "123": b"HOME=/root\0DS4_AGENT_COMMAND=m\0",
        "124": b"OTHER_DS4_AGENT_COMMAND=m\0",  # another variable ending in the marker's name
        "125": b"DS4_AGENT_COMMAND=mm\0",  # another marker starting with this one
        "self": b"DS4_AGENT_COMMAND=m\0",  # /proc/self: not a process number
    }
    for entry, environment in environments.items():
        (tmp_path / entry).mkdir()
        (tmp_path / entry / "environ").write_bytes(environment)
    (tmp_path / "126").mkdir()  # gone before its environment was read
    monkeypatch.setattr(jobs, "PROC", str(tmp_path))
    assert jobs._marked_processes("m") == [123]


def listing(stdout: str, returncode: int = 0):
    return lambda command, **_: subprocess.CompletedProcess(command, returncode, stdout, "")


def test_ps_listings_are_read_by_whole_words_from_the_first_spelling_that_works(monkeypatch):
    spellings = []

    def ps(command, **options):
        spellings.append(command)
        if len(spellings) == 1:
            raise OSError("ps: -E: unknown option")
        # A marker that starts with this one, and a line without a process number.
        lines = ["12 sleep DS4_AGENT_COMMAND=m", "13 DS4_AGENT_COMMAND=mm", "x DS4_AGENT_COMMAND=m"]
        return listing("".join(f" {line}\n" for line in lines))(command)

    monkeypatch.setattr(jobs.subprocess, "run", ps)
    assert jobs._marked_by_ps("DS4_AGENT_COMMAND=m") == [12]
    assert spellings == list(jobs._PS_WITH_ENVIRONMENT)


def test_without_a_working_ps_no_process_is_found(monkeypatch):
    answers = iter([listing("1 DS4_AGENT_COMMAND=m\n", returncode=1), None])

    def ps(command, **options):
        answer = next(answers)
        if answer is None:
            raise subprocess.TimeoutExpired(command, 5)
        return answer(command)

    monkeypatch.setattr(jobs.subprocess, "run", ps)
    assert jobs._marked_by_ps("DS4_AGENT_COMMAND=m") == []


def test_signalling_goes_on_past_processes_that_are_gone_or_not_ours(monkeypatch):
    signalled = []

    def killpg(group, sig):
        raise PermissionError

    def kill(pid, sig):
        if pid in (1, 3):
            raise ProcessLookupError if pid == 1 else PermissionError
        signalled.append((pid, sig))

    monkeypatch.setattr(jobs.os, "killpg", killpg)
    monkeypatch.setattr(jobs.os, "kill", kill)
    monkeypatch.setattr(jobs, "_marked_processes", lambda marker: [1, 2, 3, 4])
    jobs._signal_all(SimpleNamespace(pid=99), "m", signal.SIGTERM)
    assert signalled == [(2, signal.SIGTERM), (4, signal.SIGTERM)]


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_command_that_cannot_start_leaves_no_pipe_open(tmp_path):
    before = open_descriptors()
    with pytest.raises(FileNotFoundError):
        jobs._Command("true", tmp_path / "missing", 16, 16)
    assert open_descriptors() == before


def test_a_command_whose_reader_cannot_start_is_ended(tmp_path, monkeypatch):
    started = []
    popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(jobs.subprocess, "Popen", recording_popen)
    monkeypatch.setattr(jobs.threading.Thread, "start", no_thread)
    before = open_descriptors()
    with pytest.raises(RuntimeError):
        jobs._Command("sleep 30", tmp_path, 16, 16)
    assert started[0].returncode is not None  # ended, not left running
    assert open_descriptors() == before


def test_an_interrupted_foreground_command_is_ended_and_no_longer_shown(tmp_path, monkeypatch):
    commands = []

    class Recorded(jobs._Command):
        def __init__(self, *args):
            super().__init__(*args)
            commands.append(self)

    class Interrupting:
        def is_set(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(jobs, "_Command", Recorded)
    runner = jobs.JobRunner(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        runner.run("sleep 30", 20.0, Interrupting())
    assert commands[0].process.returncode is not None and runner.current is None


def test_what_a_command_writes_to_stderr_is_in_its_output(tmp_path):
    runner = jobs.JobRunner(tmp_path)
    outcome = runner.run("echo out; echo err >&2; exit 4", 20.0, threading.Event())
    assert (outcome.output, outcome.exit_code) == ("out\nerr\n", 4)


def test_a_command_past_its_time_and_cancelled_at_once_is_reported_timed_out(tmp_path):
    cancel = threading.Event()
    cancel.set()
    outcome = jobs.JobRunner(tmp_path).run("sleep 30", 0.0, cancel)
    assert (outcome.timed_out, outcome.cancelled, outcome.exit_code) == (True, False, None)


def test_a_foreground_command_keeps_its_first_32_and_last_64_kib(tmp_path):
    total = 200 * 1024
    command = f"head -c {total} /dev/zero | tr '\\0' a"
    outcome = jobs.JobRunner(tmp_path).run(command, 60.0, threading.Event())
    head, tail = 32 * 1024, 64 * 1024
    omitted = f"\n[... {total - head - tail} bytes omitted ...]\n"
    assert outcome.output == "a" * head + omitted + "a" * tail


def test_a_background_job_keeps_its_first_64_and_last_256_kib(tmp_path):
    runner = jobs.JobRunner(tmp_path)
    job = runner.start(f"head -c {600 * 1024} /dev/zero")
    wait_for(lambda: not job.running, "the job's end")
    job.handle.finish_reading(DEADLINE_S)
    assert (len(job.output.head), len(job.output.tail)) == (64 * 1024, 256 * 1024)


def test_a_running_job_says_so_with_its_command(tmp_path):
    runner = jobs.JobRunner(tmp_path)
    job = runner.start("sleep 30")
    try:
        assert re.fullmatch(r"job 1 running for \d+s: sleep 30", job.state())
    finally:
        runner.close()
    assert re.fullmatch(r"job 1 exited with code -?\d+: sleep 30", job.state())


def test_closing_stops_what_an_ended_job_left_holding_its_output(tmp_path):
    runner = jobs.JobRunner(tmp_path)
    job = runner.start("setsid sleep 30 & echo started")
    try:
        wait_for(lambda: not job.running and "started" in job.output.text_since(0)[0], "the end")
        assert job.handle.reader.is_alive()  # the escaped sleep holds the output open
        runner.close()
        assert jobs._marked_processes(job.handle.marker) == []
        assert not job.handle.reader.is_alive()
    finally:
        for pid in jobs._marked_processes(job.handle.marker):
            os.kill(pid, signal.SIGKILL)
