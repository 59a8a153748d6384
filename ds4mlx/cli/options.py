"""Command-line flags shared by ds4, ds4-agent and ds4-server, parsed once into dataclasses."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ds4mlx.engine.sampling import SamplingOptions


@dataclass(frozen=True)
class ModelOptions:
    model: str
    ctx: int
    weights_dtype: str


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
                f"expected a value in {left}{low}, {high}], got {value}")
        return value

    return parse


def add_model_flags(parser: argparse.ArgumentParser, default_model: str | None) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("-m", "--model", default=default_model, required=default_model is None,
                       help="GGUF model file (default: the shipped tiny model)")
    group.add_argument("-c", "--ctx", type=_positive_int, default=4096,
                       help="context size in tokens (default 4096)")
    group.add_argument("--weights-dtype", choices=("auto", "f32", "native"), default="auto",
                       help="f32: dequantize weights to float32 (fast on the CPU backend); "
                            "native: keep GGUF quantization (Metal); auto picks by backend")


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--temp", type=_float_in(0.0, 100.0), default=0.0,
                       help="temperature (0 = greedy, the default)")
    group.add_argument("--top-p", type=_float_in(0.0, 1.0, low_open=True), default=1.0)
    group.add_argument("--top-k", type=int, default=0, help="0 = off")
    group.add_argument("--min-p", type=_float_in(0.0, 0.999), default=0.0)
    group.add_argument("--seed", type=int, default=None)


def model_options(args: argparse.Namespace) -> ModelOptions:
    return ModelOptions(model=args.model, ctx=args.ctx, weights_dtype=args.weights_dtype)


def sampling_options(args: argparse.Namespace) -> SamplingOptions:
    if args.top_k < 0:
        raise SystemExit(f"error: --top-k must be >= 0, got {args.top_k}")
    return SamplingOptions(temperature=args.temp, top_p=args.top_p, top_k=args.top_k,
                           min_p=args.min_p, seed=args.seed)
