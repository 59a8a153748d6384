#!/usr/bin/env python3
"""Each kernel in ds4mlx.kernels next to the naive MLX composition it replaces, in one run.

Metal kernels on Apple silicon, their MLX twins elsewhere (``DS4MLX_KERNELS`` picks); median of
``--repeats`` timed calls after a warm-up. Prints a Markdown table with the naive / kernel ratio.
"""

from __future__ import annotations

import argparse

from ds4mlx import kernels
from ds4mlx.bench.machine import machine_description
from ds4mlx.diagnostics import kernels as kernel_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"machine: {machine_description()}")
    print(f"kernels: {kernels.PACKED_KERNELS}; median of {args.repeats} calls\n")
    print(kernel_bench.markdown_table(kernel_bench.run_all(args.repeats, args.seed)))


if __name__ == "__main__":
    main()
