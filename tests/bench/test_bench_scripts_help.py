"""Every benchmark script answers ``-h``: argparse formats help texts with ``%``, so a literal
percent sign in one (an engine named "streamed 50%") once made ``bench_real_width.py -h``
crash with a traceback instead of printing its usage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("bench_*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_bench_script_prints_its_usage(script: Path):
    done = subprocess.run(
        [sys.executable, str(script), "-h"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:")
