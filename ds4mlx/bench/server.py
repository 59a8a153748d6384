"""A ds4-server subprocess on a loopback port, for benchmarks and end-to-end tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server_process(
    model: str, flags: Sequence[str] = (), start_timeout: float = 300.0
) -> Iterator[str]:
    """Run ``ds4-server -m model *flags`` on a free loopback port until the block ends; yields
    its base URL (without ``/v1``) once ``/health`` answers. A server that exits early raises
    RuntimeError with its log."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "ds4mlx.cli.server",
        "-m",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *flags,
    ]
    # The log goes to a file: a pipe nobody reads would block a chatty server once full.
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while not _healthy(url):
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"ds4-server exited with {process.returncode}:\n{log.read()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ds4-server did not start within {start_timeout:.0f} s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False
