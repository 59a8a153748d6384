"""``ds4``: one-shot generation. Generated text goes to stdout and nothing else does."""

from __future__ import annotations

import argparse
import sys
import time

from ds4mlx.cli.options import (
    add_model_flags,
    add_sampling_flags,
    model_options,
    sampling_options,
)
from ds4mlx.engine.generate import DoneEvent, generate
from ds4mlx.engine.tokenizer import TokenizerError
from ds4mlx.gguf import GGUFError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ds4", description="Generate text with a DeepSeek-V4-Flash / GLM GGUF model.")
    add_model_flags(parser, default_model=None)
    parser.add_argument("-p", "--prompt", required=True, help="prompt text")
    parser.add_argument("-n", "--n-predict", type=int, default=128,
                        help="number of tokens to generate (default 128)")
    parser.add_argument("--chat", action="store_true",
                        help="wrap the prompt in the model's chat template as a user turn")
    add_sampling_flags(parser)
    return parser


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def progress_line(message: str) -> None:
    """Loading progress: redrawn in place on a terminal, one line per update otherwise."""
    if sys.stderr.isatty():
        end = "\n" if "100.0%" in message else ""
        print(f"\r{message}", end=end, file=sys.stderr, flush=True)
    else:
        log(message)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.n_predict <= 0:
        parser.error(f"--n-predict must be positive, got {args.n_predict}")
    try:
        sampling = sampling_options(args)
    except ValueError as exc:
        parser.error(str(exc))
    options = model_options(args)

    from ds4mlx.api import load_model

    started = time.perf_counter()
    try:
        model = load_model(options.model, weights_dtype=options.weights_dtype,
                           progress=progress_line)
    except (GGUFError, TokenizerError, OSError) as exc:
        log(f"ds4: error: {exc}")
        return 1
    log(f"ds4: loaded {options.model} ({model.args_summary()}) "
        f"in {time.perf_counter() - started:.2f}s")

    tokenizer = model.tokenizer
    if args.chat:
        prompt = tokenizer.encode(model.render_user_prompt(args.prompt), add_special=False)
    else:
        prompt = tokenizer.encode(args.prompt, add_special=True)
    if not prompt:
        log("ds4: error: the prompt encodes to no tokens")
        return 1

    detokenizer = tokenizer.streaming_detokenizer()
    session = model.new_session()
    try:
        for event in generate(session, prompt, args.n_predict, sampling,
                              stop_tokens=tokenizer.stop_ids, max_context=options.ctx):
            if isinstance(event, DoneEvent):
                stats = event.stats
                break
            if event.token in tokenizer.stop_ids:
                continue
            sys.stdout.write(detokenizer.add(event.token))
            sys.stdout.flush()
    except ValueError as exc:
        log(f"ds4: error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("\nds4: interrupted")
        return 130
    sys.stdout.write(detokenizer.finish())
    sys.stdout.flush()
    log("")
    log(f"ds4: prompt {stats.prompt_tokens} tokens, prefill {stats.prefill_tps:.1f} t/s | "
        f"generated {stats.generated_tokens} tokens, decode {stats.decode_tps:.1f} t/s "
        f"({stats.stop_reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
