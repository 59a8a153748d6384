"""Reading and writing workspace files safely.

Only regular files are opened: a FIFO would block a read forever and a device could stream
without end, so the file is opened without blocking and checked with ``fstat`` before a byte
is read (no window between a check and the open). Writes go to a temporary file next to the
target, which then replaces it: a crash never leaves half a file, and a file that is a hard
link to one outside the workspace is replaced by a new file instead of changed through the
link.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from pathlib import Path

from ds4mlx.agent.workspace import ToolError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for check, name in _KINDS if check(mode)), "not a regular file")


def read_regular(path: Path, limit: int, shown: str | None = None) -> bytes:
    """The bytes of the regular file ``path``; ToolError for anything else or a file larger
    than ``limit`` bytes. ``shown`` names the file in messages."""
    shown = shown or path.name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket or a FIFO opened for the other end
            raise ToolError(f"{shown} is not a regular file; only regular files are read") from None
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{shown} is a folder; use list")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{shown} is {_kind(info.st_mode)}; only regular files are read")
        if info.st_size > limit:
            raise ToolError(f"{shown} is larger than {_human(limit)} ({_human(info.st_size)})")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:  # it grew while being read
        raise ToolError(f"{shown} is larger than {_human(limit)}")
    return data


def is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def write_atomically(target: Path, data: bytes) -> None:
    """Replace ``target`` (or create it) with ``data`` through a temporary file in the same
    folder; an existing file keeps its permission bits."""
    try:
        mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    temporary = target.parent / f".{target.name[:200]}.{uuid.uuid4().hex[:8]}.ds4-tmp"
    # 0o666 less the umask, as a plain open() would create it.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as file:
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _human(size: int) -> str:
    if size >= 2**20:
        return f"{size / 2**20:.1f} MiB"
    if size >= 1024:
        return f"{size / 1024:.0f} KiB"
    return f"{size} bytes"
