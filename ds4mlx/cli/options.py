"""Command-line flags shared by ds4, ds4-agent and ds4-server, parsed once into dataclasses."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ds4mlx.generation import (
    DEFAULT_MTP_MARGIN,
    DEFAULT_NGRAM,
    DrafterKind,
    ExpertOptions,
    GGUFError,
    SamplingOptions,
    SpeculationConfig,
    check_drafter_files,
    parse_cache_budget,
)
from ds4mlx.resources import data_dir


@dataclass(frozen=True)
class ModelOptions:
    model: str
    ctx: int
    weights_dtype: str
    experts: ExpertOptions = ExpertOptions()
    verbose: bool = False
    distributed: bool = False  # this process is one rank of an mlx.launch group


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _float_in(low: float, high: float, *, low_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
        too_low = value <= low if low_open else value < low
        if too_low or value > high:
            left = "(" if low_open else "["
            raise argparse.ArgumentTypeError(
                f"expected a value in {left}{low}, {high}], got {value}"
            )
        return value

    return parse


# The embedded default: the tiny DeepSeek-V4 model shipped in the repository's assets/
# (``scripts/train_tiny.py`` rebuilds it); found next to the package of an editable install.
DEFAULT_MODEL = data_dir("assets") / "ds4-tiny.gguf"


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "-m",
        "--model",
        default=str(DEFAULT_MODEL),
        help="GGUF model file (default: the shipped tiny model, assets/ds4-tiny.gguf)",
    )
    group.add_argument(
        "-c",
        "--ctx",
        type=_positive_int,
        default=4096,
        help="context size in tokens (default 4096)",
    )
    group.add_argument(
        "--weights-dtype",
        choices=("auto", "f32", "native"),
        default="auto",
        help="f32: dequantize weights to float32; native: keep the GGUF blocks as stored; "
        "auto (default): native, but f32 on the CPU for a model under 1 GiB as float32",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print routed-expert cache counters and other details",
    )
    experts = parser.add_argument_group("routed experts")
    experts.add_argument(
        "--ssd-stream",
        action="store_true",
        help="keep routed experts in the GGUF file and read them on demand "
        "into a bounded cache (for models larger than memory)",
    )
    experts.add_argument(
        "--expert-cache",
        type=_cache_budget,
        default=None,
        metavar="GiB|auto",
        help="with --ssd-stream: cache size in GiB, or auto (default: 80%% of "
        "the routed experts, capped by available memory)",
    )
    experts.add_argument(
        "--expert-hotlist",
        metavar="FILE",
        help="with --ssd-stream: warm the cache from this hot-expert list",
    )
    experts.add_argument(
        "--save-expert-hotlist",
        action="store_true",
        help="write the hot-expert list to --expert-hotlist FILE at exit",
    )


def add_distributed_flags(
    parser: argparse.ArgumentParser, roles: str = "rank 0 prints the output"
) -> None:
    parser.add_argument_group("distributed").add_argument(
        "--distributed",
        action="store_true",
        help="run as one rank of a group started by mlx.launch: each rank holds a shard "
        f"(attention heads, routed experts); {roles}",
    )


def _cache_budget(text: str) -> float | None:
    try:
        return parse_cache_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument(
        "--temp",
        type=_float_in(0.0, 100.0),
        default=0.0,
        help="temperature (0 = greedy, the default)",
    )
    group.add_argument("--top-p", type=_float_in(0.0, 1.0, low_open=True), default=1.0)
    group.add_argument("--top-k", type=int, default=0, help="0 = off")
    group.add_argument("--min-p", type=_float_in(0.0, 0.999), default=0.0)
    group.add_argument("--seed", type=int, default=None)
    group.add_argument(
        "--repeat-penalty",
        type=_float_in(0.0, 10.0, low_open=True),
        default=1.0,
        help="divide the logits of recent tokens by this (llama.cpp's; 1 = off)",
    )
    group.add_argument(
        "--presence-penalty",
        type=_float_in(-2.0, 2.0),
        default=0.0,
        help="subtract this from the logits of recent tokens",
    )
    group.add_argument(
        "--frequency-penalty",
        type=_float_in(-2.0, 2.0),
        default=0.0,
        help="subtract this per occurrence from the logits of recent tokens",
    )
    group.add_argument(
        "--repeat-last-n",
        type=_positive_int,
        default=64,
        help="how many recent tokens the penalties look at (default 64)",
    )
    group.add_argument(
        "--logit-bias",
        type=_logit_bias,
        action="append",
        default=[],
        metavar="ID=BIAS",
        help="add BIAS to token ID's logit (repeatable; -100 bans the token)",
    )


def _logit_bias(text: str) -> tuple[int, float]:
    token, _, bias = text.partition("=")
    try:
        pair = int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID=BIAS, got '{text}'") from None
    if pair[0] < 0 or not -100.0 <= pair[1] <= 100.0:
        raise argparse.ArgumentTypeError(
            f"expected a token id >= 0 and a bias in [-100, 100], got '{text}'"
        )
    return pair


def add_speculation_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("speculative decoding")
    group.add_argument(
        "--mtp-model",
        metavar="FILE",
        help="drafter GGUF: DSpark support file (with --dspark) or legacy MTP (with --mtp-draft N)",
    )
    group.add_argument(
        "--dspark",
        action="store_true",
        help="draft with DSpark (the support file given by --mtp-model)",
    )
    group.add_argument(
        "--dspark-confidence",
        type=_float_in(0.0, 1.0),
        metavar="X",
        help="cut DSpark drafts at the first token under this confidence "
        "(implies --dspark; default: no cut)",
    )
    group.add_argument(
        "--dspark-strict",
        action="store_true",
        help="load the drafter but decode with the target alone (implies --dspark)",
    )
    group.add_argument(
        "--quality",
        action="store_true",
        help="disable speculative acceptance (target-only decoding)",
    )
    group.add_argument(
        "--mtp-draft",
        type=_positive_int,
        default=1,
        metavar="N",
        help="legacy MTP: draft up to N tokens (default 1 = off)",
    )
    group.add_argument(
        "--mtp-margin",
        type=_float_in(0.0, 1000.0),
        default=None,
        help="legacy MTP: stop drafting when the top-1 logit margin is smaller (default: "
        f"{DEFAULT_MTP_MARGIN}, as ds4, when sampling; none when greedy, where the drafts are "
        "cut by their measured acceptance and cost)",
    )
    group.add_argument(
        "--mtp",
        action="store_true",
        help="draft with the MTP block inside the main GGUF (GLM nextn)",
    )
    group.add_argument(
        "--mtp-timing",
        action="store_true",
        help="print drafting/verify counters and timing (enables --mtp if no "
        "other drafter and no --lookup is chosen)",
    )
    group.add_argument(
        "--lookup",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="prompt lookup: draft up to N tokens (6 at most: longer verify passes would "
        "not match one-token decoding bit for bit) copied from the context where its "
        "last tokens occurred before (alone, or in front of --dspark / --mtp-draft; 0 = off)",
    )
    group.add_argument(
        "--lookup-ngram",
        type=_ngram_sizes,
        default=DEFAULT_NGRAM,
        metavar="MIN..MAX",
        help="prompt lookup's n-gram sizes, longest tried first (default "
        f"{DEFAULT_NGRAM[0]}..{DEFAULT_NGRAM[1]})",
    )
    group.add_argument(
        "--mtp-exact-sampling",
        action="store_true",
        help="at temperature > 0, accept drafts by rejection sampling so the "
        "output distribution equals ordinary sampling",
    )


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _ngram_sizes(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("..")
    try:
        sizes = (int(low), int(high)) if sep else (int(low), int(low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN..MAX (e.g. 2..4), got '{text}'") from None
    if not 1 <= sizes[0] <= sizes[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got '{text}'")
    return sizes


def speculation_config(args: argparse.Namespace) -> SpeculationConfig:
    """Raises ValueError with a message naming the flags when they contradict each other."""
    dspark = args.dspark or args.dspark_strict or args.dspark_confidence is not None
    if dspark:
        kind = DrafterKind.DSPARK
    elif args.mtp_draft > 1:
        kind = DrafterKind.MTP
    elif args.mtp or (args.mtp_timing and not args.lookup):
        kind = DrafterKind.NEXTN
    elif args.mtp_model:
        raise ValueError("--mtp-model given without --dspark or --mtp-draft N")
    else:
        kind = DrafterKind.NONE
    if kind is DrafterKind.NEXTN and args.mtp_model:
        raise ValueError("--mtp uses the draft block inside the main model; drop --mtp-model")
    return SpeculationConfig(
        kind=kind,
        support_path=Path(args.mtp_model) if args.mtp_model else None,
        confidence=args.dspark_confidence or 0.0,
        strict=args.dspark_strict or args.quality,
        mtp_draft=args.mtp_draft,
        mtp_margin=args.mtp_margin,
        exact_sampling=args.mtp_exact_sampling,
        timing=args.mtp_timing,
        lookup=args.lookup,
        lookup_ngram=args.lookup_ngram,
    )


def check_drafter(args: argparse.Namespace, speculation: SpeculationConfig) -> None:
    """Raises ValueError when the drafter the flags ask for cannot draft for the model, found
    from the files' headers before the model loads (minutes for a large one)."""
    nextn_flag = "--mtp" if args.mtp else "--mtp-timing without another drafter"
    try:
        check_drafter_files(speculation, args.model, nextn_flag)
    except GGUFError as exc:
        raise ValueError(str(exc)) from None


def model_options(args: argparse.Namespace) -> ModelOptions:
    """Raises ValueError (naming the flags) for expert flags that contradict each other."""
    experts = ExpertOptions(
        stream=args.ssd_stream,
        cache_gib=args.expert_cache,
        hotlist=Path(args.expert_hotlist) if args.expert_hotlist else None,
        save_hotlist=args.save_expert_hotlist,
    )
    # Only the front ends that can run as ranks add --distributed (see add_distributed_flags).
    return ModelOptions(
        model=args.model,
        ctx=args.ctx,
        weights_dtype=args.weights_dtype,
        experts=experts,
        verbose=args.verbose,
        distributed=getattr(args, "distributed", False),
    )


def sampling_options(args: argparse.Namespace) -> SamplingOptions:
    if args.top_k < 0:
        raise SystemExit(f"error: --top-k must be >= 0, got {args.top_k}")
    return SamplingOptions(
        temperature=args.temp,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.seed,
        repeat_penalty=args.repeat_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repeat_last_n=args.repeat_last_n,
        logit_bias=tuple(dict(args.logit_bias).items()),
    )
