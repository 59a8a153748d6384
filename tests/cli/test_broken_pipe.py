"""``ds4 ... | head``: when the reader of ds4's output goes away, ds4 stops quietly with the
shell's status for a broken pipe, not a traceback or an error message."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[2] / "ds4mlx" / "cli" / "plan.py"


@pytest.mark.parametrize(
    "command",
    [
        ["-p", "def f(x):", "-n", "64"],
        ["logprobs", "-f", str(SAMPLE)],
    ],
    ids=["generate", "logprobs"],
)
def test_a_closed_pipe_ends_ds4_quietly(command):
    ds4 = subprocess.Popen(
        [sys.executable, "-m", "ds4mlx.cli.main", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Closed before ds4 writes anything, so its first write of output fails, every run.
    ds4.stdout.close()
    _, stderr = ds4.communicate(timeout=300)
    assert ds4.returncode == 128 + signal.SIGPIPE, stderr
    assert "Traceback" not in stderr and "error" not in stderr, stderr
