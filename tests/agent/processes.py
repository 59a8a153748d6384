"""Finding the processes a test started, by their command line (Linux ``/proc``)."""

from __future__ import annotations

import os
from pathlib import Path


def processes_with(text: str) -> list[int]:
    """Live processes whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry))
    return found


def sleeper(n: int) -> str:
    """``sleep`` for a time that names this test process as well as ``n``: the same test run at
    once from another checkout (mutation runs side by side) must not find this one's sleeps,
    nor kill them."""
    return f"sleep {n}{os.getpid():07d}"
