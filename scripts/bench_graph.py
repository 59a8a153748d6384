#!/usr/bin/env python3
"""The size of a decode step's MLX graph: primitives per token by block and layer, build and
evaluation time, the same for a verify pass, and the projection to DeepSeek-V4-Flash's 43 layers.

Counts are exact and deterministic; times are medians of ``--steps`` repeats of the same step.
``--json`` prints one JSON object instead of the tables. ``--backend metal`` builds the step as a
Mac would, on any machine (``ds4mlx.diagnostics.metal_graph``): its counts are a Mac's, its
times are not (stand-ins compute nothing). Dispatches are the primitives that are not views.
"""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext

import ds4mlx
from ds4mlx.diagnostics.graph import BLOCKS, FLASH_RATIOS, count_step, project_to_ratios, time_step
from ds4mlx.diagnostics.metal_graph import dispatches, metal_configuration
from ds4mlx.experts import ExpertOptions
from ds4mlx.models.base import DECODE_TILE


def measure(network, state, tokens: list[int], steps: int) -> dict:
    count = count_step(network, state.copy(), tokens)
    build_ms, eval_ms = time_step(network, state, tokens, steps)
    return {
        "rows": len(tokens),
        "primitives": count.uncut_total,
        "dispatches": dispatches(count.uncut_names),
        "primitives_counted_by_layer": count.total,
        "per_block": {b: count.per_block.get(b, 0) for b in BLOCKS},
        "per_layer": {str(k): v for k, v in count.per_layer.items()},
        "top_primitives": dict(count.per_name.most_common(12)),
        "build_ms": round(build_ms, 3),
        "eval_ms": round(eval_ms, 3),
        "_count": count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument(
        "--context",
        type=int,
        default=32,
        help="prompt tokens before the measured step (default 32)",
    )
    parser.add_argument("--verify-rows", type=int, default=6)
    parser.add_argument("--steps", type=int, default=30, help="timed repeats (median)")
    parser.add_argument(
        "--weights-dtype",
        default="auto",
        choices=("auto", "f32", "native"),
        help="auto: this machine's default, native with --backend metal (a Mac's)",
    )
    parser.add_argument(
        "--backend",
        default="cpu",
        choices=("cpu", "metal"),
        help="the graph this machine builds, or the one a Mac builds (default cpu)",
    )
    parser.add_argument(
        "--experts",
        default="resident",
        choices=("resident", "stream"),
        help="routed experts resident, or streamed from the file through a slab that holds "
        "them all (every step's experts cached: the steady state; default resident)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    weights_dtype = args.weights_dtype
    if args.backend == "metal" and weights_dtype == "auto":
        weights_dtype = "native"
    with metal_configuration() if args.backend == "metal" else nullcontext():
        report = run(args, weights_dtype)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_tables(report)


WARM_STEPS = DECODE_TILE
STREAM_CACHE_GIB = 1.0  # more than a tiny model's routed experts


def run(args: argparse.Namespace, weights_dtype: str) -> dict:
    experts = None
    if args.experts == "stream":
        # A slab as big as all the routed experts (auto caps it below them).
        experts = ExpertOptions(stream=True, cache_gib=STREAM_CACHE_GIB)
    model = ds4mlx.load_model(args.model, weights_dtype=weights_dtype, experts=experts)
    vocab = model.args.vocab_size
    session = model.new_session()
    context = [(i * 7919 + 13) % vocab for i in range(args.context)]
    # The last tokens of the context are decoded one at a time, so that the step measured is
    # the one decoding repeats: caches that settle into fixed shapes (a KDA layer's rollback
    # states, which a prefill leaves at one) have settled, and its compiled tiles replay.
    prompt = max(1, len(context) - WARM_STEPS)
    session.feed(context[:prompt])
    for token in context[prompt:]:
        session.feed([token])
    network, state = model.network, session.state
    decode = measure(network, state, [1], args.steps)
    verify = measure(
        network, state, [(i * 31 + 7) % vocab for i in range(args.verify_rows)], args.steps
    )
    model.close()
    ratios = getattr(model.args, "compress_ratios", None)
    flash = None
    if ratios is not None and set(FLASH_RATIOS) <= set(ratios[: len(network.blocks)]):
        flash = project_to_ratios(decode.pop("_count"), ratios, FLASH_RATIOS)
    decode.pop("_count", None)
    verify.pop("_count")
    return {
        "model": args.model,
        "summary": model.args_summary(),
        "backend": args.backend,
        "experts": args.experts,
        "weights_dtype": weights_dtype,
        "context": args.context,
        "primitives_per_token": decode["primitives"],
        "dispatches_per_token": decode["dispatches"],
        "per_block": decode["per_block"],
        "per_layer": decode["per_layer"],
        "build_ms": decode["build_ms"],
        "eval_ms": decode["eval_ms"],
        "decode": decode,
        "verify": verify,
        "flash_43_layer_primitives_per_token": flash,
    }


def print_tables(report: dict) -> None:
    decode, verify = report["decode"], report["verify"]
    print(
        f"model: {report['model']} ({report['summary']}); {report['backend']} configuration, "
        f"{report['weights_dtype']} weights, {report['experts']} experts; "
        f"step after {report['context']} tokens\n"
    )
    print(
        "| step | rows | primitives | dispatches | "
        + " | ".join(BLOCKS)
        + " | build ms | eval ms |"
    )
    print("|---|---:|---:|---:|" + "---:|" * len(BLOCKS) + "---:|---:|")
    for name, row in (("decode", decode), (f"verify {verify['rows']}", verify)):
        blocks = " | ".join(str(row["per_block"][b]) for b in BLOCKS)
        print(
            f"| {name} | {row['rows']} | {row['primitives']} | {row['dispatches']} | {blocks} | "
            f"{row['build_ms']:.2f} | {row['eval_ms']:.2f} |"
        )
    print("\nper layer (decode): " + ", ".join(f"{k}: {v}" for k, v in decode["per_layer"].items()))
    print(
        "most frequent (decode): "
        + ", ".join(f"{k} {v}" for k, v in decode["top_primitives"].items())
    )
    flash = report["flash_43_layer_primitives_per_token"]
    if flash is not None:
        print(f"\nprojected to DeepSeek-V4-Flash's 43 layers: {flash} primitives per token")


if __name__ == "__main__":
    main()
