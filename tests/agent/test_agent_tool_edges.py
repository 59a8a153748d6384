"""The file tools' bounds at their exact values: the search and list caps, the listing depth,
the read size limit, line ranges at the end of a file, and when a command becomes a background
job.

Each test here was checked against a one-character mutation of the code it guards (see
``scripts/mutation_run.py``, the ``agent_*`` mutations).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ds4mlx.agent import tools
from ds4mlx.agent.files import read_regular, write_atomically
from ds4mlx.agent.tools import ToolBox
from ds4mlx.agent.workspace import ToolError, Workspace
from ds4mlx.engine.chat import ToolCall

import pytest


@pytest.fixture
def box(tmp_path: Path):
    root = tmp_path / "ws"
    root.mkdir()
    toolbox = ToolBox(Workspace(root), bash_timeout=5.0)
    yield toolbox
    toolbox.close()


def run(box: ToolBox, tool: str, **arguments):
    return box.run(ToolCall(tool, arguments))


@pytest.mark.parametrize("extra", [0, 1])
def test_search_shows_every_match_up_to_the_cap(box, extra):
    cap = tools.MAX_SEARCH_MATCHES
    (box.workspace.root / "hits.txt").write_text("hit\n" * (cap + extra))
    lines = run(box, "search", pattern="hit").output.splitlines()
    assert lines[:cap] == [f"hits.txt:{n}: hit" for n in range(1, cap + 1)]
    more = [f"... more than {cap} matches; narrow the pattern or the path"]
    assert lines[cap:] == (more if extra else [])


def test_a_matching_line_is_cut_at_its_limit(box):
    width = tools.MAX_MATCH_LINE_CHARS
    (box.workspace.root / "long.txt").write_text("x" * (width + 5) + "\n")
    assert run(box, "search", pattern="x").output == "long.txt:1: " + "x" * width


@pytest.mark.parametrize("extra", [0, 1])
def test_list_shows_entries_up_to_the_cap(box, extra):
    cap = tools.MAX_LIST_ENTRIES
    for n in range(cap + extra):
        (box.workspace.root / f"f{n:04d}").write_text("")
    lines = run(box, "list", path=".").output.splitlines()
    assert len(lines) == cap + extra
    assert lines[cap - 1].endswith(f"f{cap - 1:04d}")
    if extra:
        assert lines[-1] == "... 1 more entries; list a subfolder to see them"


def test_list_goes_down_to_its_depth(box):
    deep = box.workspace.root.joinpath(*"abcd")
    deep.mkdir(parents=True)
    (deep / "too-deep.txt").write_text("")
    (deep.parent.parent / "deep-enough.txt").write_text("")
    listing = run(box, "list", path=".").output
    assert "a/b/deep-enough.txt" in listing and "a/b/c/" in listing
    assert "a/b/c/d" not in listing and "too-deep" not in listing
    assert tools.LIST_DEPTH == 3


def test_a_file_of_exactly_the_read_limit_is_read(tmp_path):
    path = tmp_path / "ten"
    path.write_bytes(b"0123456789")
    assert read_regular(path, 10) == b"0123456789"
    with pytest.raises(ToolError, match="larger than 9 bytes"):
        read_regular(path, 9)


def test_a_file_that_grows_past_the_limit_while_it_is_read_is_refused(tmp_path, monkeypatch):
    # The size checked before reading says 5 bytes; 10 arrive (another process appended).
    path = tmp_path / "growing"
    path.write_bytes(b"0123456789")
    real_fstat = os.fstat

    def before_it_grew(fd: int) -> os.stat_result:
        fields = list(real_fstat(fd))
        fields[stat.ST_SIZE] = 5
        return os.stat_result(fields)

    monkeypatch.setattr(os, "fstat", before_it_grew)
    with pytest.raises(ToolError, match="larger than 9 bytes"):
        read_regular(path, 9)
    assert read_regular(path, 10) == b"0123456789"


def test_reading_ends_at_the_last_line(box):
    (box.workspace.root / "three.txt").write_text("one\ntwo\nthree\n")
    assert run(box, "read", path="three.txt", start=3).output == "    3  three"
    past = run(box, "read", path="three.txt", start=4)
    assert past.is_error and "has 3 lines; start 4 is past the end" in past.output
    assert run(box, "read", path="three.txt", start=2, end=2).output.startswith("    2  two\n")
    assert run(box, "read", path="three.txt", start=2, end=1).is_error
    assert run(box, "read", path="three.txt", start=0).is_error
    first = run(box, "read", path="three.txt", start=1, end=2).output
    assert first.endswith("... 1 more lines; call more to continue")
    assert run(box, "more").output == "    3  three"
    assert run(box, "more").output == "(end of three.txt)"


@pytest.mark.parametrize(
    ("command", "background"),
    [("sleep 0 &", True), ("sleep 0&", True), ("true && true", False), ("echo a&&", False)],
)
def test_only_a_trailing_single_ampersand_starts_a_job(box, command, background):
    result = run(box, "bash", command=command)
    assert result.output.startswith("started background job") is background


def test_a_link_to_a_folder_inside_is_listed_but_never_entered(box):
    root = box.workspace.root
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("x = 1\n")
    (root / "alias").symlink_to(root / "src")
    (root / "loop").symlink_to(root)  # entering it would walk the workspace again and again
    names = [line.split()[-1] for line in run(box, "list", path=".").output.splitlines()]
    assert names == ["alias", "loop", "src/", "src/a.py"]
    assert run(box, "search", pattern="x = 1", path=".").output == "src/a.py:1: x = 1"


def test_a_failed_write_leaves_the_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "a.txt"
    target.write_text("old\n")

    def disk_full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError):
        write_atomically(target, b"new\n")
    assert [path.name for path in tmp_path.iterdir()] == ["a.txt"]
    assert target.read_text() == "old\n"


def test_a_finished_background_job_leaves_the_open_state(box):
    assert run(box, "bash", command="true &").output.startswith("started background job 1")
    box.jobs.jobs[1].handle.process.wait(timeout=30)
    assert box.open_state() == ""
