"""The tree's code style is checked here, so the README's test command (and CI) enforces it:
`ruff check` (lint rules, import order, complexity) and `ruff format --check` (one formatting,
adopted in one commit; issue 22)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["ds4mlx", "tests", "scripts", "README.md"]  # the README: its Python example


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ruff", *args, *CHECKED]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module", autouse=True)
def _ruff_installed() -> None:
    if (
        shutil.which("ruff") is None
        and subprocess.run(
            [sys.executable, "-m", "ruff", "--version"], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("ruff is not installed (pip install -e '.[test]')")


def test_ruff_check_is_clean():
    done = _ruff("check", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_leaves_the_tree_unchanged():
    done = _ruff("format", "--check", "--quiet")
    assert done.returncode == 0, "run `ruff format ds4mlx tests scripts`:\n" + done.stdout
