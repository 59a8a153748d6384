#!/usr/bin/env python3
"""Each kernel in ds4mlx.kernels next to the naive MLX composition it replaces, in one run.

Metal kernels on Apple silicon, their MLX twins elsewhere (``DS4MLX_KERNELS`` picks); median of
``--repeats`` timed calls after a warm-up. Prints a Markdown table with the naive / kernel ratio.

``--emulated`` instead runs the Metal sources through the CPU emulator
(tests/kernels/metal_emulation.cpp, needs a C++20 compiler) and prints, per kernel and shape,
what a launch reads from device memory: load instructions and bytes, next to the ideal (the
weights and x read once; for attention the visible keys and the queries) and to the kernels they
replaced (tests/kernels/baseline_metal). ``--json`` prints those records as a JSON list.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ds4mlx import kernels
from ds4mlx.bench.machine import machine_description
from ds4mlx.diagnostics import kernels as kernel_bench
from ds4mlx.kernels import metal

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
import emulator  # noqa: E402  (tests/kernels: the emulator is a test tool)

# DeepSeek-V4-Flash: routed experts' gate/up and down, the output head (N x K).
FLASH_SHAPES = (("expert gate/up", 2048, 4096), ("expert down", 4096, 2048), ("head", 129280, 4096))
SAMPLED_GROUPS = 8  # threadgroups run per launch where --sample applies


def _groups(n_out: int, rows_per_group: int) -> int:
    return -(-n_out // rows_per_group)


def emulated_matvec(
    qtype: GGMLQuantizationType, n_out: int, k: int, n_rows: int, binary: Path, sample: bool
) -> dict:
    """One record: the packed mat-vec's counters for x [n_rows, k] @ W [n_out, k].T, and the
    baseline's. With ``sample``, about SAMPLED_GROUPS threadgroups run and the counters are
    scaled to the whole launch (every threadgroup of these kernels reads the same amounts)."""
    launch = metal.matvec_launch(n_out, n_rows)
    new_groups = _groups(n_out, launch.simdgroups * launch.rows)
    old_groups = _groups(n_out, 8)  # the baseline: 8 simdgroups of one row each
    new_stride = max(1, new_groups // SAMPLED_GROUPS) if sample else 1
    old_stride = max(1, old_groups // SAMPLED_GROUPS) if sample else 1
    _, type_size = GGML_QUANT_SIZES[qtype]
    block_values = GGML_QUANT_SIZES[qtype][0]
    # Counters do not depend on the values: zero weights (finite scales) will do.
    w = np.zeros((1, n_out, k // block_values * type_size), np.uint8)
    x = np.random.default_rng(0).standard_normal((1, n_rows, k)).astype(np.float32)
    with tempfile.TemporaryDirectory() as work:
        new = emulator.run_linear(binary, qtype, x, w, np.zeros(1), Path(work), False, new_stride)
        old = emulator.run_linear(binary, qtype, x, w, np.zeros(1), Path(work), True, old_stride)
    new_groups *= -(-n_rows // launch.x_rows)
    old_groups *= -(-n_rows // 8)
    new_scale, old_scale = new_groups / new.threadgroups, old_groups / old.threadgroups
    return {
        "kernel": "linear",
        "format": qtype.name,
        "n": n_out,
        "k": k,
        "rows": n_rows,
        "device_load_instructions": round(new.device_load_instructions * new_scale),
        "device_bytes": round(new.device_bytes * new_scale),
        "ideal_bytes": w.nbytes + x.nbytes,
        "threadgroups": new_groups,
        "threads_per_threadgroup": new.threads_per_threadgroup,
        "baseline_device_load_instructions": round(old.device_load_instructions * old_scale),
        "baseline_device_bytes": round(old.device_bytes * old_scale),
        "sampled": sample,
    }


def emulated_attention(build: Path, tokens: int) -> dict:
    """One record: the sparse attention's counters at DeepSeek-V4-Flash's CSA decode shape
    (64 heads of 512, a 128-row window, 512 selected of 2048 compressed rows), and the
    replaced kernel's. Ideal: every visible key row, the queries and the outputs once."""
    heads, dim, window, n_comp, slots = 64, 512, 128, 2048, 512
    binary = emulator.build_emulator(
        build / "attention",
        DS4_D=dim,
        DS4_HEADS=metal.attention_heads_per_group(heads),
        DS4_SPLITS=metal.ATTENTION_SPLITS,
        DS4_SLOTS=slots,
    )
    rng = np.random.default_rng(0)
    q = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    index = np.stack([rng.permutation(n_comp)[:slots] for _ in range(tokens)]).astype(np.int32)
    payload = [
        np.array([tokens, heads, window, n_comp, slots], np.int32),
        np.array([dim**-0.5], np.float32),
        q,
        rng.standard_normal((window, dim)).astype(np.float32),
        np.tile(np.array([0, window], np.int32), (tokens, 1)),
        rng.standard_normal((n_comp, dim)).astype(np.float32),
        index,
        np.zeros(heads, np.float32),
    ]
    counters = {}
    with tempfile.TemporaryDirectory() as work:
        for mode in ("sparse_attention", "baseline_sparse_attention"):
            counters[mode] = emulator.run(binary, [mode], payload, Path(work))[1]
    new, old = counters["sparse_attention"], counters["baseline_sparse_attention"]
    return {
        "kernel": "sparse_attention",
        "shape": "CSA decode",
        "format": "float32",
        "n": heads,
        "k": dim,
        "rows": tokens,
        "device_load_instructions": new["device_load_instructions"],
        "device_bytes": new["device_bytes"],
        "ideal_bytes": tokens * (window + slots) * dim * 4 + 2 * q.nbytes + index.nbytes,
        "threadgroups": new["threadgroups"],
        "threads_per_threadgroup": new["threads_per_threadgroup"],
        "baseline_device_load_instructions": old["device_load_instructions"],
        "baseline_device_bytes": old["device_bytes"],
        "sampled": False,
    }


def emulated_records(row_counts: list[int], sample_all: bool) -> list[dict]:
    records = []
    with tempfile.TemporaryDirectory() as build:
        records.append(emulated_attention(Path(build), tokens=1))
        for name, n_out, k in FLASH_SHAPES:
            binary = emulator.build_emulator(
                Path(build) / f"{n_out}x{k}", **emulator.linear_defines(n_out, k, 1)
            )
            for qtype in emulator.PACKED_FORMATS:
                for n_rows in row_counts:
                    sample = sample_all or name == "head"
                    record = emulated_matvec(qtype, n_out, k, n_rows, binary, sample)
                    records.append({"shape": name, **record})
                    print(f"  {name} {qtype.name} M={n_rows}", file=sys.stderr)
    return records


def emulated_table(records: list[dict]) -> str:
    """Per record: device load instructions (millions, and per weight for the mat-vec), bytes
    against the ideal, each beside the replaced kernel's."""
    lines = [
        "| kernel | format | shape | M | loads | baseline | loads / weight | baseline"
        " | bytes / ideal | baseline | threadgroups x threads |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        attention = r["kernel"] == "sparse_attention"
        size = f"{r['n']} heads x {r['k']}" if attention else f"{r['n']} x {r['k']}"
        per_weight = [
            "-" if attention else f"{r[key] / (r['n'] * r['k']):.3f}"
            for key in ("device_load_instructions", "baseline_device_load_instructions")
        ]
        lines.append(
            f"| {r['kernel']} ({r['shape']}) | {r['format']} | {size} | {r['rows']}"
            f" | {r['device_load_instructions'] / 1e6:.2f} M"
            f" | {r['baseline_device_load_instructions'] / 1e6:.2f} M"
            f" | {per_weight[0]} | {per_weight[1]}"
            f" | {r['device_bytes'] / r['ideal_bytes']:.2f}x"
            f" | {r['baseline_device_bytes'] / r['ideal_bytes']:.2f}x"
            f" | {r['threadgroups']} x {r['threads_per_threadgroup']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--emulated", action="store_true", help="count device loads in the CPU emulator"
    )
    parser.add_argument("--json", action="store_true", help="with --emulated: JSON records")
    parser.add_argument(
        "--rows", default="1,8", help="with --emulated: x row counts, comma-separated"
    )
    parser.add_argument(
        "--sample",
        action="store_true",
        help=f"with --emulated: run ~{SAMPLED_GROUPS} threadgroups of every launch (the head's"
        " always are) and scale the counters",
    )
    args = parser.parse_args()
    if args.emulated:
        records = emulated_records([int(r) for r in args.rows.split(",")], args.sample)
        print(json.dumps(records, indent=1) if args.json else emulated_table(records))
        return
    print(f"machine: {machine_description()}")
    print(f"kernels: {kernels.PACKED_KERNELS}; median of {args.repeats} calls\n")
    print(kernel_bench.report(args.repeats, args.seed))


if __name__ == "__main__":
    main()
