"""``ds4 ... | head``: when the reader of ds4's output goes away, ds4 stops quietly with the
shell's status for a broken pipe, not a traceback or an error message."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

SAMPLE = "def add(a, b):\n    return a + b\n\n" * 20


@pytest.mark.parametrize(
    "command",
    [
        ["-p", "def f(x):", "-n", "64"],
        ["logprobs", "-f", "{sample}"],
    ],
    ids=["generate", "logprobs"],
)
def test_a_closed_pipe_ends_ds4_quietly(command, tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(SAMPLE)
    ds4 = subprocess.Popen(
        [sys.executable, "-m", "ds4mlx.cli.main", *(a.format(sample=sample) for a in command)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Closed before ds4 writes anything, so its first write of output fails, every run.
    ds4.stdout.close()
    _, stderr = ds4.communicate(timeout=300)
    assert ds4.returncode == 128 + signal.SIGPIPE, stderr
    assert "Traceback" not in stderr and "error" not in stderr, stderr
