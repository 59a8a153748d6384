#!/usr/bin/env python3
"""Decode and prefill speed of ds4mlx next to llama.cpp's CPU build on the same GGUF, in one run.

llama.cpp is measured through ``llama-cpp-python`` (``pip install -e '.[bench]'``) when importable.
Each side: one warm-up, then the median (min..max) of ``--runs`` runs. Prints a Markdown table and
the ds4mlx / llama.cpp ratio. The measurement lives in ``ds4mlx.bench.decode`` (``ds4 bench``
runs the same code).
"""

from __future__ import annotations

import argparse
import os

import ds4mlx
from ds4mlx.bench.decode import markdown_table, measure_ds4mlx, measure_llamacpp
from ds4mlx.bench.machine import machine_description


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument(
        "--contexts", default="128", help="comma-separated prompt lengths for prefill (default 128)"
    )
    parser.add_argument("-n", "--n-decode", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--weights-dtype", default="auto", choices=("auto", "f32", "native"))
    args = parser.parse_args()
    contexts = [int(n) for n in args.contexts.split(",")]

    model = ds4mlx.load_model(args.model, weights_dtype=args.weights_dtype)
    print(f"machine: {machine_description()}")
    print(f"model: {args.model}; decode {args.n_decode} tokens, median of {args.runs} (min..max)\n")
    rows = [measure_ds4mlx(model, contexts, args.n_decode, args.runs)]
    peer = measure_llamacpp(
        args.model, model.args.vocab_size, contexts, args.n_decode, args.runs, args.threads
    )
    if isinstance(peer, str):
        print(f"(llama.cpp peer not measured: {peer})\n")
    else:
        rows.append(peer)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
