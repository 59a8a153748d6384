"""A command run in a pseudo-terminal of its own, everything it writes kept, for tests of the
interactive faces (``ds4-agent``'s UI, ``ds4``'s chat)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]


class PseudoTerminal:
    """``python -m MODULE ARGUMENTS`` in a ``columns`` x ``rows`` terminal; what it writes
    accumulates in ``output``."""

    timeout = 60.0  # seconds ``wait_for`` waits unless told

    def __init__(
        self,
        module: str,
        arguments: list[str],
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        size: tuple[int, int] = (100, 30),
    ):
        master, slave = pty.openpty()
        columns, rows = size
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        environment = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *arguments],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env={**environment, **(env or {})},
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.output = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.output += data

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait_for(self, condition, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < deadline:
            if condition():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"not reached; the terminal shows:\n{self.output[-3000:]!r}")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.reader.join(2)
        os.close(self.master)
