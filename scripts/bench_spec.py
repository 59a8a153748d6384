#!/usr/bin/env python3
"""Speculative decoding next to target-only decoding, measured side by side in one run.

DSpark (ds4's and llama.cpp's support-file layouts) and legacy MTP on the DS4 target, GLM's
built-in NextN MTP on the GLM target; on ds4's acceptance prompts (hello, redis, math,
python_reverse, c_add), a prose continuation and held-out standard-library code. Greedy decoding;
a warm-up then the median (min..max) of ``--runs`` runs per side. Prints a Markdown table with τ,
acceptance (overall and per draft position), scheduler pauses and greedy parity; ``--json FILE``
writes the rows for machines. A drafter file that is absent is reported and skipped. This is the
speculation section of ``ds4 bench`` (``ds4mlx.bench.suite``) on its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ds4mlx.bench import suite
from ds4mlx.bench.machine import machine_description

ALL_PROMPTS = ("hello", "redis", "math", "python_reverse", "c_add", "prose", "code")


def main() -> None:
    defaults = suite.BenchConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", type=Path, default=defaults.model)
    parser.add_argument("--dspark", type=Path, default=defaults.dspark)
    parser.add_argument("--dflash", type=Path, default=defaults.dflash)
    parser.add_argument("--mtp", type=Path, default=defaults.mtp)
    parser.add_argument("--mtp-draft", type=int, default=defaults.mtp_draft)
    parser.add_argument(
        "--glm",
        type=str,
        default=str(defaults.glm),
        help="a glm5-next GGUF with its NextN layer ('' to skip)",
    )
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--prompts", default="all", help=f"comma-separated names ({','.join(ALL_PROMPTS)}) or 'all'"
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    args = parser.parse_args()

    prompts = ALL_PROMPTS if args.prompts == "all" else tuple(args.prompts.split(","))
    if not suite.selected_prompts(prompts):
        parser.error(f"--prompts {args.prompts}: no such prompt")
    config = suite.BenchConfig(
        model=args.model,
        dspark=args.dspark,
        dflash=args.dflash,
        mtp=args.mtp,
        mtp_draft=args.mtp_draft,
        glm=Path(args.glm) if args.glm else None,
        max_tokens=args.max_tokens,
        runs=args.runs,
        prompts=prompts,
        peers=False,
    )

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    print(f"machine: {machine_description()}")
    print(f"greedy, up to {args.max_tokens} tokens, median of {args.runs} runs (min..max)\n")
    report, text, results = suite.run_speculation(config, progress)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_description(), **report}, indent=1))
    sys.exit(0 if all(r.parity for r in results) else 1)


if __name__ == "__main__":
    main()
