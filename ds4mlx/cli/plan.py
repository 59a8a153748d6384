"""``ds4 plan``: print what a model needs in memory, and how it fits, before anything is loaded;
and the message with which ``ds4`` refuses a model that cannot fit resident. The plan itself is
computed below the faces (``ds4mlx.load_plan``, through the generation API); this module parses
the arguments and formats it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ds4mlx.generation import (
    GGUFError,
    MemoryPlan,
    Verdict,
    check_resident,
    format_size,
    plan_model,
)
from ds4mlx.loader import resolve_weights_dtype
from ds4mlx.memory import (
    GPU_WIRED_SHARE,
    available_memory_bytes,
    physical_memory_bytes,
    wired_limit_sysctl,
)


def parse_memory(text: str) -> int:
    """``128G``, ``96GiB``, ``64``, ``512M``, ``1.5T`` -> bytes (binary units; bare = GiB)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if match is None or float(match[1]) <= 0:
        raise ValueError(f"memory size: expected e.g. 128G, 96GiB or 512M, got '{text}'")
    scale = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "": 2**30}[match[2]]
    return int(float(match[1]) * scale)


def describe(plan: MemoryPlan, memories: list[tuple[int, str]]) -> str:
    """The plan as printed by ``ds4 plan`` (and by ``ds4`` when it refuses a model)."""
    experts = (
        (
            f"{plan.moe_layers} MoE layers x {plan.n_experts} experts, top-{plan.n_used}, "
            f"{format_size(plan.expert_bytes)} an expert"
        )
        if plan.moe_layers
        else "none"
    )
    if plan.kv_bytes_per_1k is None:
        kv = f"not modelled for {plan.arch}"
    else:
        kv = (
            f"{format_size(plan.kv_bytes_per_1k)} per 1k tokens + "
            f"{format_size(plan.kv_fixed_bytes or 0)} fixed "
            f"({format_size(plan.kv_bytes)} at {plan.ctx} tokens)"
        )
    lines = [
        f"memory plan for {plan.path} ({plan.arch}, weights {plan.mode})",
        f"  file            {format_size(plan.file_bytes)}",
        f"  dense weights   {format_size(plan.dense_file_bytes)} stored, "
        f"{format_size(plan.dense_bytes)} in memory",
        f"  routed experts  {format_size(plan.routed_file_bytes)} stored, "
        f"{format_size(plan.routed_bytes)} in memory ({experts})",
        f"  KV cache        {kv}",
    ]
    for memory, label in memories:
        verdict = plan.verdict(memory)
        lines.append(f"  {label}: {_verdict_line(plan, verdict)}")
        if verdict.kind == "resident" and verdict.needed_bytes > GPU_WIRED_SHARE * memory:
            lines.append(
                f"    on a Mac the GPU wires about {GPU_WIRED_SHARE:.0%} of memory by default: "
                f"{wired_limit_sysctl(verdict.needed_bytes)} keeps it resident"
            )
    return "\n".join(lines)


def _verdict_line(plan: MemoryPlan, verdict: Verdict) -> str:
    if verdict.kind == "resident":
        return (
            f"fits resident (needs {format_size(verdict.needed_bytes)} with 10% headroom "
            "and the process's own 0.5 GiB)"
        )
    if verdict.kind == "streamed":
        return (
            f"streamed: {verdict.flags()} caches {verdict.cached_share:.0%} of the routed "
            f"experts (peak ~{format_size(verdict.needed_bytes)})"
        )
    return (
        f"does not fit: needs at least {format_size(verdict.needed_bytes)} "
        f"(dense weights {format_size(plan.dense_bytes)}"
        + (
            f" + one layer's experts {format_size(plan.min_cache_bytes)})"
            if plan.routed_bytes
            else ")"
        )
    )


def memory_label(memory: int, source: str) -> str:
    return f"{format_size(memory)} {source}".rstrip()


def refusal(path: str | Path, mode: str, ctx: int) -> str | None:
    """None when the model at ``path`` can be loaded resident in ``mode`` with the memory
    available now; else the message ``ds4`` prints instead of loading it: the plan and the
    flags to use."""
    available = available_memory_bytes()
    if available is None:
        return None
    oversized = check_resident(path, mode, ctx, available)
    if oversized is None:
        return None
    plan, verdict = oversized.plan, oversized.verdict
    if verdict.kind == "streamed":
        advice = f"run with {verdict.flags()} (routed experts read from the file on demand)"
    elif oversized.fits_native:
        advice = "it does not fit with f32 weights; try --weights-dtype native --ssd-stream"
    else:
        advice = "it does not fit in this machine's memory in any mode"
    return (
        f"{plan.path} needs {format_size(plan.resident_needed())} resident but "
        f"{format_size(available)} is available; {advice}\n"
        + describe(plan, [(available, memory_label(available, "available now"))])
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ds4 plan", description="Print a GGUF model's memory plan without loading it."
    )
    parser.add_argument("-m", "--model", required=True, help="GGUF model file")
    parser.add_argument(
        "--memory",
        action="append",
        type=_memory,
        metavar="SIZE",
        help="memory to plan for, e.g. 128G (repeatable; default: this "
        "machine's physical memory and what is available now)",
    )
    parser.add_argument(
        "--weights-dtype",
        choices=("auto", "f32", "native"),
        default="auto",
        help="weights mode to plan (auto: f32 on the CPU backend, native with Metal)",
    )
    parser.add_argument(
        "-c", "--ctx", type=int, default=4096, help="context length for the KV cache (default 4096)"
    )
    return parser


def _memory(text: str) -> int:
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.ctx <= 0:
        parser.error(f"--ctx must be positive, got {args.ctx}")
    if args.memory:
        memories = [(m, memory_label(m, "")) for m in args.memory]
    else:
        memories = []
        total, available = physical_memory_bytes(), available_memory_bytes()
        if total is not None:
            memories.append((total, memory_label(total, "(this machine)")))
        if available is not None:
            memories.append((available, memory_label(available, "(available now)")))
    try:
        mode = resolve_weights_dtype(args.weights_dtype, args.model)
        print(describe(plan_model(args.model, mode, args.ctx), memories))
    except (GGUFError, OSError, ValueError) as exc:
        print(f"ds4 plan: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
