"""``agent/files.py`` directly: which files are read, what the refusals say, sizes in words."""

from __future__ import annotations

import os
import socket
import stat

from ds4mlx.agent import files
from ds4mlx.agent.files import is_regular, read_regular, write_atomically
from ds4mlx.agent.workspace import ToolError

import pytest


def test_a_file_of_exactly_the_limit_is_read(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"x" * 1024)
    assert read_regular(path, 1024) == b"x" * 1024
    with pytest.raises(ToolError, match=r"^notes.txt is larger than 1023 bytes \(1 KiB\)$"):
        read_regular(path, 1023)


@pytest.mark.parametrize(
    ("limit", "words"),
    [(1023, "1023 bytes"), (1024, "1 KiB"), (2**20 - 1, "1024 KiB"), (2**20, "1.0 MiB")],
)
def test_sizes_are_named_in_the_largest_unit_that_fits(tmp_path, limit, words):
    path = tmp_path / "big.bin"
    path.write_bytes(b"\0" * (limit + 1))
    with pytest.raises(ToolError, match=rf"is larger than {words} "):
        read_regular(path, limit)


def test_refusals_name_the_file_as_shown_or_by_its_name(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(ToolError, match=r"^folder is a folder; use list$"):
        read_regular(tmp_path / "folder", 100)
    with pytest.raises(ToolError, match=r"^src/folder is a folder"):
        read_regular(tmp_path / "folder", 100, shown="src/folder")


def test_a_socket_is_not_read(tmp_path):
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        with pytest.raises(ToolError, match=r"^s.sock is not a regular file"):
            read_regular(path, 100)
    finally:
        server.close()


def test_a_fifo_is_not_read(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    with pytest.raises(ToolError, match=r"^pipe is a FIFO"):
        read_regular(path, 100)


def test_a_missing_file_is_the_callers_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "gone", 100)


def test_is_regular(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    assert is_regular(tmp_path / "f")
    assert not is_regular(tmp_path / "d") and not is_regular(tmp_path / "gone")


def test_an_atomic_write_keeps_the_mode_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "run.sh"
    target.write_text("old")
    target.chmod(0o750)
    write_atomically(target, b"new")
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o750
    write_atomically(tmp_path / "fresh.txt", b"made")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.txt", "run.sh"]


def test_a_file_without_any_permission_keeps_none_when_rewritten(tmp_path):
    """Mode 0 is a mode to keep, not a missing one (a new file would get 0o666 less the
    umask)."""
    path = tmp_path / "locked.txt"
    path.write_text("old")
    path.chmod(0)
    write_atomically(path, b"new")
    assert stat.S_IMODE(path.stat().st_mode) == 0
    assert path.read_bytes() == b"new"


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        (stat.S_IFIFO, "a FIFO"),
        (stat.S_IFCHR, "a character device"),
        (stat.S_IFBLK, "a block device"),
        (stat.S_IFSOCK, "a socket"),
        (stat.S_IFLNK, "not a regular file"),
    ],
)
def test_each_kind_of_file_that_is_not_read_is_named(kind, words):
    assert files._kind(kind | 0o644) == words
