#!/usr/bin/env python3
"""Rewrite a DSpark drafter in the other file layout, or again in its own.

    python scripts/convert_dspark.py assets/ds4-tiny-dspark.gguf assets/ds4-tiny-dflash.gguf \
        --target assets/ds4-tiny.gguf --layout dflash

makes the shipped llama.cpp-layout drafter from the ds4-layout one (the same weights; the
tensors keep their stored types unless ``--matrix-type`` says otherwise). Rewriting a dflash file
as dflash drops keys llama.cpp cannot run with (``dflash.embedding_length_out`` as older ds4mlx
versions wrote it). The window rule is the written layout's: llama.cpp's per-row sliding window
for ``dflash``, ds4's one ring range per block for ``ds4``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ds4mlx.gguf import GGUFError, open_gguf
from ds4mlx.models.deepseek4 import ModelArgs
from ds4mlx.speculation.dspark_layout import ARCH_DS4, ARCH_LLAMA, convert_dspark

from gguf import GGMLQuantizationType

LAYOUTS = {"ds4": ARCH_DS4, "dflash": ARCH_LLAMA}
MATRIX_TYPES = ("keep", "q8_0", "f16", "bf16", "f32")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--target", type=Path, required=True, help="the target model GGUF")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    parser.add_argument(
        "--matrix-type",
        choices=MATRIX_TYPES,
        default="keep",
        help="how matrices are stored (default: as in the source)",
    )
    args = parser.parse_args()
    if args.dest.resolve() == args.source.resolve():
        parser.error("write to another path (the source is memory-mapped while converting)")
    try:
        target = open_gguf(args.target)
        keep = args.matrix_type == "keep"
        matrix_type = (
            GGMLQuantizationType.Q8_0 if keep else GGMLQuantizationType[args.matrix_type.upper()]
        )
        config = convert_dspark(
            args.source,
            args.dest,
            LAYOUTS[args.layout],
            target,
            ModelArgs.from_gguf(target),
            keep_types=keep,
            matrix_type=matrix_type,
        )
    except (GGUFError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(
        f"wrote {args.dest} ({args.layout} layout, block {config.block_size}, "
        f"{config.stage_count} stages, target layers {list(config.target_layers)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
