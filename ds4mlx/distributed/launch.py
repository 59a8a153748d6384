"""Starting N ranks of a Python module on this machine through ``mlx.launch`` (ring backend on
loopback): what the distributed test and bench use; across machines ``mlx.launch`` takes a
hostfile instead (README)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence


def free_port_block(count: int) -> int:
    """A base port such that ``count`` consecutive ports were free just now (the ring backend
    listens on base + rank); avoids clashing with another run on the default port."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            held = []
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"found no {count} consecutive free ports")


def launch_local(
    n: int, module: str, args: Sequence[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m module args`` as ``n`` ranks on 127.0.0.1 (``n`` = 1: one plain
    process, no group) and waits at most ``timeout`` seconds (subprocess.TimeoutExpired after
    that; the ranks are killed)."""
    command = [sys.executable, "-m", module, *args]
    if n > 1:
        launcher = shutil.which("mlx.launch")
        if launcher is None:
            raise FileNotFoundError("mlx.launch is not on PATH (it comes with the mlx package)")
        command = [
            launcher,
            "--backend",
            "ring",
            "-n",
            str(n),
            "--hosts",
            "127.0.0.1",
            "--starting-port",
            str(free_port_block(n)),
            "--",
            *command,
        ]
    # A session of its own, so that a timeout can end the launcher and every rank it started.
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
