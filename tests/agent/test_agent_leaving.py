"""After SIGTERM or SIGHUP the agent leaves even when Textual's shutdown hangs: a hang-up of the
terminal (tmux's kill-server) comes with SIGCONT, on which Textual resumes with a new output
thread that dies on the dead terminal, and closing the app then waited for good on that
thread's full queue, leaving an agent deaf to SIGTERM behind."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from ds4mlx.agent import app as app_module
from ds4mlx.agent.app import AgentApp
from ds4mlx.agent.conversations import ConversationStore
from ds4mlx.agent.loop import Agent

import pytest
from scripted_backend import text
from scripted_server import Server, text_chunks
from test_agent_app import make_app, ready, until

ROOT = Path(__file__).parents[2]
# The grace before the watchdog ends the process, and room for a loaded machine.
LEAVE_WAIT_SECONDS = app_module.LEAVE_GRACE_SECONDS + 25


class ProcessEnd:
    """A stand-in for ``os._exit``: records the code and wakes the test."""

    def __init__(self):
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


@pytest.fixture
def process_end(monkeypatch) -> ProcessEnd:
    end = ProcessEnd()
    monkeypatch.setattr(app_module.os, "_exit", end)
    monkeypatch.setattr(app_module, "LEAVE_GRACE_SECONDS", 0.2)
    return end


def _app(toolbox, tmp_path) -> tuple[AgentApp, Agent]:
    return make_app(toolbox, ConversationStore(tmp_path / "conversations"), [[text("Hello.")]])


def test_a_leave_that_hangs_ends_the_process_saved_and_jobs_stopped(
    toolbox, tmp_path, process_end, monkeypatch
):
    app, agent = _app(toolbox, tmp_path)
    closed: list[bool] = []
    monkeypatch.setattr(toolbox, "close", lambda: closed.append(True))
    leave = app.exit

    async def auto_pilot(pilot):
        await ready(pilot)
        await pilot.press(*"hi", "enter")
        await until(pilot, lambda: not app.busy and len(agent.conversation.messages) > 2)
        app.exit = lambda **_: None  # Textual's shutdown, stuck
        app.terminate(signal.SIGHUP)
        await asyncio.to_thread(process_end.called.wait, 5)
        leave()  # with or without the watchdog's end: the test must end

    app.run(headless=True, size=(100, 30), auto_pilot=auto_pilot)
    assert process_end.codes == [128 + signal.SIGHUP]
    assert closed  # the background jobs were stopped before the process ended
    saved = ConversationStore(tmp_path / "conversations").list()
    assert len(saved) == 1  # saved before the wait began


def test_a_leave_in_time_cancels_the_watchdog(toolbox, tmp_path, process_end):
    app, _ = _app(toolbox, tmp_path)

    async def auto_pilot(pilot):
        await ready(pilot)
        app.terminate(signal.SIGTERM)

    app.run(headless=True, size=(100, 30), auto_pilot=auto_pilot)
    assert app.return_code == 128 + signal.SIGTERM
    time.sleep(0.5)  # past the grace: the caller's clean-up may take that long
    assert process_end.codes == []


def test_an_app_under_the_pilot_arms_no_watchdog(toolbox, tmp_path, process_end):
    """Tests drive the app with Textual's pilot in their own process: a SIGTERM there must
    not end the test run a grace later."""
    app, _ = _app(toolbox, tmp_path)

    async def main():
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            app.terminate(signal.SIGTERM)

    asyncio.run(main())
    time.sleep(0.5)
    assert process_end.codes == []


def _controlling_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux terminal's hang-up")
def test_a_terminal_hang_up_ends_the_agent(workspace, tmp_path):
    """The hang-up as tmux's kill-server makes it: the pseudo-terminal's master closed under
    the agent, whose controlling terminal it is (the kernel sends SIGHUP and SIGCONT), 50 ms
    after a prompt (the old agent hung in about half of such runs)."""
    answer = text_chunks(" ".join(f"word{i}" for i in range(2000)))
    with Server([answer]) as server:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        process = subprocess.Popen(
            [sys.executable, "-m", "ds4mlx.cli.agent", "--api-base", server.url,
             "--workspace", str(workspace), "--data-dir", str(tmp_path / "data")],
            stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path,
            env={**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)},
            preexec_fn=_controlling_terminal,
        )  # fmt: skip
        os.close(slave)
        hung_up = False
        try:
            output = bytearray()
            deadline = time.monotonic() + 60
            while b"Ask ds4-agent" not in output and time.monotonic() < deadline:
                if select.select([master], [], [], 0.1)[0]:
                    output += os.read(master, 65536)
            assert b"Ask ds4-agent" in output, bytes(output[-2000:])
            time.sleep(0.5)
            os.write(master, b"tell me\r")
            time.sleep(0.05)
            os.close(master)
            hung_up = True
            process.wait(LEAVE_WAIT_SECONDS)
        finally:
            if not hung_up:
                os.close(master)
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 128 + signal.SIGHUP
