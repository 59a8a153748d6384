"""Fixtures of the agent tests: a small workspace with code in three languages."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.agent.conversations import ConversationStore
from ds4mlx.agent.tools import ToolBox
from ds4mlx.agent.workspace import Workspace

import pytest

PYTHON_SOURCE = """\
import os


class Greeter:
    def greet(self, name):
        return f"hello {name}"


def add(a, b):
    return a + b
"""

C_SOURCE = """\
#include <stdio.h>

struct point { int x; int y; };

static int *find(int *values, int n) {
    return values + n;
}

int add(int a, int b) {
    return a + b;
}
"""

JS_SOURCE = """\
export function add(a, b) {
  return a + b;
}

class Counter {
  increment() { this.n += 1; }
}

const double = (x) => x * 2;
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text(PYTHON_SOURCE)
    (root / "src" / "point.c").write_text(C_SOURCE)
    (root / "src" / "util.js").write_text(JS_SOURCE)
    (root / "README.md").write_text("# demo\nA demo project.\n")
    (root / ".gitignore").write_text("build/\n*.log\n")
    (root / "build").mkdir()
    (root / "build" / "out.txt").write_text("add generated\n")
    (root / "debug.log").write_text("add in a log\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder next to the workspace that must never be read or written by the tools."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("top secret\n")
    return folder


@pytest.fixture
def toolbox(workspace: Path):
    box = ToolBox(Workspace(workspace), bash_timeout=5.0)
    yield box
    box.close()


@pytest.fixture
def store(tmp_path: Path) -> ConversationStore:
    """An empty conversation store in the test's own folder."""
    return ConversationStore(tmp_path / "conversations")
