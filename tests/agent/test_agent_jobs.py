"""Background jobs report each piece of output once, and stop even when they ignore SIGTERM.

Each test fails on a mutation of the blind set ``scripts/mutation_sets/fresh6.py`` that the
suite missed in its first pass (named in each test).
"""

from __future__ import annotations

import time
from pathlib import Path

from ds4mlx.engine.chat import ToolCall

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
