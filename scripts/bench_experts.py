"""Resident vs streamed routed experts on a synthetic model: tokens/s, hit rate, bytes read per
token and peak RSS at 100/50/25/10% expert-cache budgets, with a warmed-up expert cache and a
cold one (empty, the file's pages dropped) separately.

The measurement lives in ``ds4mlx.bench.experts`` (``ds4 bench`` runs it on the tiny model); this
script writes a synthetic MoE of a chosen size first, so that streaming is measured at sizes the
tiny model does not reach.

    python scripts/bench_experts.py --size-mb 2048 --tokens 32 --runs 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ds4mlx.bench.experts import bench_experts, markdown_table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_synthetic_moe import EXPERT_TYPES, experts_for_size, write_synthetic_moe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="an existing synthetic GGUF (else written)")
    parser.add_argument("--size-mb", type=float, default=256, help="routed experts to write")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="decoded tokens per run")
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="timed runs per configuration (median t/s, min..max shown)",
    )
    args = parser.parse_args()
    if args.runs < 1 or args.tokens < 1:
        parser.error("--runs and --tokens must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            path = Path(tmp) / "synthetic.gguf"
            experts = experts_for_size(
                int(args.size_mb * 2**20),
                layers=args.layers,
                hidden=1024,
                expert_ff=1024,
                qtype=EXPERT_TYPES["Q4_K"],
            )
            write_synthetic_moe(path, layers=args.layers, experts=experts, vocab=512)
        results = bench_experts(path, n_tokens=args.tokens, runs=args.runs, skipped=print)
        print(
            f"model {path.name}: {path.stat().st_size / 2**20:.0f} MiB file, routed experts "
            f"{results[0].routed / 2**20:.0f} MiB as computed; {args.tokens} decoded tokens "
            f"per run, {args.runs} runs per configuration in rounds\n"
        )
        print(markdown_table(results))
        print(
            "\nwarm: a warm-up generation on another prompt filled the expert cache and the "
            "OS page cache first; cold: an empty expert cache, and the file's pages dropped "
            "with posix_fadvise(DONTNEED) before loading (first reads come from the disk)."
        )


if __name__ == "__main__":
    main()
