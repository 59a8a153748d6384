"""A multi-line paste through tmux (``paste-buffer -p``: bracketed paste, lines separated by
carriage returns) into ``ds4-agent`` on the scripted server reaches the model whole."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from scripted_server import Server

ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


class Tmux:
    """A private tmux server (its own socket) running one command in a 100x30 window."""

    def __init__(self, command: list[str], cwd: Path):
        self.socket = f"ds4-agent-test-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if k != "TMUX"}
        env["PYTHONPATH"] = str(ROOT)
        self.env = env
        self.tmux(
            "-f", "/dev/null", "new-session", "-d", "-s", "ag", "-x", "100", "-y", "30",
            "-c", str(cwd), shlex.join(command),
        )  # fmt: skip

    def tmux(self, *arguments: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *arguments],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "ag")

    def wait_for(self, condition, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.1)
        raise AssertionError(f"not reached; the window shows:\n{self.screen()}")

    def close(self) -> None:
        """Ends the server and the command it ran: a command that outlives the hang-up tmux
        sends it (as the agent did while Textual's shutdown hung: test_agent_leaving.py) is
        ended here, not left behind as an orphan."""
        pane = subprocess.run(
            ["tmux", "-L", self.socket, "display-message", "-p", "-t", "ag", "#{pane_pid}"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
        if pane.isdigit():
            _end(int(pane))


def _end(pid: int, grace: float = 5.0) -> None:
    """SIGTERM to ``pid``, SIGKILL if it is still there after ``grace`` seconds."""
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def test_a_tmux_bracketed_paste_keeps_its_lines(workspace, tmp_path):
    pasted = tmp_path / "p.txt"
    pasted.write_text("line one\nline two\nline three")
    with Server([]) as server:
        tmux = Tmux(
            [
                sys.executable, "-m", "ds4mlx.cli.agent", "--api-base", server.url,
                "--workspace", str(workspace), "--data-dir", str(tmp_path / "data"),
            ],
            tmp_path,
        )  # fmt: skip
        try:
            tmux.wait_for(lambda: "Ask ds4-agent" in tmux.screen())
            tmux.wait_for(lambda: "ready" in tmux.screen())
            tmux.tmux("load-buffer", "-b", "p1", str(pasted))
            tmux.tmux("paste-buffer", "-p", "-b", "p1", "-t", "ag")
            tmux.wait_for(lambda: "line three" in tmux.screen())
            tmux.tmux("send-keys", "-t", "ag", "Enter")
            tmux.wait_for(lambda: bool(server.requests))
        finally:
            tmux.close()
    users = [m for m in server.requests[0]["messages"] if m["role"] == "user"]
    assert users == [{"role": "user", "content": "line one\nline two\nline three"}]
