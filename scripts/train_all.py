#!/usr/bin/env python3
"""Rebuild every shipped tiny model in ``assets/`` from nothing, in dependency order.

1. ``scripts/train_tiny.py``: corpus, tokenizer, ``ds4-tiny.gguf`` (the DS4 target);
2. ``scripts/train_glm_tiny.py``: ``glm-tiny.gguf`` (reuses the corpus and tokenizer);
3. ``scripts/train_drafters.py``: ``ds4-tiny-dspark.gguf``, ``ds4-tiny-dflash.gguf`` and
   ``ds4-tiny-mtp.gguf``, distilled from the frozen target of step 1 (the drafters name it by
   fingerprint, so they must follow any change to it).

Each step is its own process with its own progress output (loss, tokens/s, ETA); the seeds are
fixed, so a rerun with the same Python, MLX and corpus gives the same files. ``--from STEP``
resumes after finished steps. Prints each step's minutes and the assets' sizes and hashes.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = {
    "target": ["scripts/train_tiny.py"],
    "glm": ["scripts/train_glm_tiny.py"],
    "drafters": ["scripts/train_drafters.py"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from",
        dest="start",
        choices=list(STEPS),
        default="target",
        help="first step to run (earlier ones must have finished)",
    )
    args = parser.parse_args()
    names = list(STEPS)
    minutes: dict[str, float] = {}
    for name in names[names.index(args.start) :]:
        print(f"=== {name}: {' '.join(STEPS[name])}", flush=True)
        started = time.perf_counter()
        result = subprocess.run([sys.executable, *STEPS[name]], cwd=ROOT)
        minutes[name] = (time.perf_counter() - started) / 60
        if result.returncode != 0:
            sys.exit(f"step {name} failed with exit status {result.returncode}")
    print("\n=== done")
    for name, value in minutes.items():
        print(f"{name:9s} {value:6.1f} min")
    for path in sorted((ROOT / "assets").glob("*.gguf")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(f"{path.name:24s} {path.stat().st_size / 2**20:6.1f} MiB  sha256 {digest}")


if __name__ == "__main__":
    main()
