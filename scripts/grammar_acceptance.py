#!/usr/bin/env python3
"""The whole 50-prompt acceptance run of constrained output (issue 36), outside the suite.

The suite's tests/server/test_constrained_output.py asks ten of the fifty prompts (every style,
every topic once); this runs the same tests on all fifty, through the same served tiny model:

    python scripts/grammar_acceptance.py            # about 200 requests, minutes on a CPU
    python scripts/grammar_acceptance.py -k schema  # more pytest arguments pass through
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = "tests/server/test_constrained_output.py"


def main(argv: list[str]) -> int:
    env = {**os.environ, "DS4MLX_GRAMMAR_PROMPTS": "all"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TESTS, *argv]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
