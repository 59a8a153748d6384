#!/usr/bin/env python3
"""Speculative decoding next to target-only decoding, measured side by side in one run.

DSpark (ds4's and llama.cpp's support-file layouts) and legacy MTP on the DS4 target, GLM's
built-in NextN MTP on the GLM target; on ds4's acceptance prompts (hello, redis, math,
python_reverse, c_add), a prose continuation and held-out standard-library code. Greedy decoding;
a warm-up then the median (min..max) of ``--runs`` runs per side. Prints a Markdown table with τ,
acceptance (overall and per draft position), scheduler pauses and greedy parity; ``--json FILE``
writes the rows for machines. A drafter file that is absent is reported and skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import ds4mlx
from ds4mlx.bench.machine import machine_description
from ds4mlx.bench.speculation import (
    CHAT_PROMPTS,
    PROSE_PROMPT,
    SpecResult,
    bench_model,
    code_prompts,
    markdown_table,
    summary_rows,
)
from ds4mlx.speculation import DrafterKind, SpeculationConfig

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", type=Path, default=ASSETS / "ds4-tiny.gguf")
    parser.add_argument("--dspark", type=Path, default=ASSETS / "ds4-tiny-dspark.gguf")
    parser.add_argument("--dflash", type=Path, default=ASSETS / "ds4-tiny-dflash.gguf")
    parser.add_argument("--mtp", type=Path, default=ASSETS / "ds4-tiny-mtp.gguf")
    parser.add_argument("--mtp-draft", type=int, default=3)
    parser.add_argument("--glm", type=Path, default=ASSETS / "glm-tiny.gguf",
                        help="a glm5-next GGUF with its NextN layer ('' to skip)")
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", default="all",
                        help="comma-separated names (hello,redis,math,python_reverse,c_add,prose,"
                             "code) or 'all'")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    args = parser.parse_args()

    prompts = [*CHAT_PROMPTS, PROSE_PROMPT, *code_prompts()]
    if args.prompts != "all":
        wanted = set(args.prompts.split(","))
        prompts = [p for p in prompts if p.name in wanted or p.name.split(":")[0] in wanted]
        if not prompts:
            parser.error(f"--prompts {args.prompts}: no such prompt")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    print(f"machine: {machine_description()}")
    print(f"greedy, up to {args.max_tokens} tokens, median of {args.runs} runs (min..max)\n")
    results: list[SpecResult] = []
    ds4_drafters = []
    for name, kind, path, extra in (
            ("dspark", DrafterKind.DSPARK, args.dspark, {}),
            ("dspark (dflash file)", DrafterKind.DSPARK, args.dflash, {}),
            (f"mtp (draft {args.mtp_draft})", DrafterKind.MTP, args.mtp,
             {"mtp_draft": args.mtp_draft})):
        if path.is_file():
            ds4_drafters.append((name, SpeculationConfig(kind, path, **extra)))
        else:
            print(f"({name} not measured: {path} does not exist)")
    if ds4_drafters:
        model = ds4mlx.load_model(args.model)
        results += bench_model(model, ds4_drafters, prompts, max_tokens=args.max_tokens,
                               runs=args.runs, progress=progress)
    if args.glm and args.glm.is_file():
        glm = ds4mlx.load_model(args.glm)
        results += bench_model(glm, [("glm nextn", SpeculationConfig(DrafterKind.NEXTN))],
                               prompts, max_tokens=args.max_tokens, runs=args.runs,
                               progress=progress)
    elif args.glm:
        print(f"(glm nextn not measured: {args.glm} does not exist)")

    rows = [*results, *summary_rows(results)]
    print()
    print(markdown_table(rows))
    if not all(r.parity for r in results):
        print("\nPARITY FAILURE: a drafted run's greedy output differs from the target's own")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_description(),
                                         "rows": [r.as_json() for r in rows]}, indent=1))
    sys.exit(0 if all(r.parity for r in results) else 1)


if __name__ == "__main__":
    main()
