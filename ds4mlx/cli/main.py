"""``ds4``: one-shot generation. Generated text goes to stdout and nothing else does."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass

from ds4mlx.cli.options import (
    ModelOptions,
    add_distributed_flags,
    add_model_flags,
    add_sampling_flags,
    add_speculation_flags,
    check_drafter,
    model_options,
    sampling_options,
    speculation_config,
)
from ds4mlx.cli.prompt_source import (
    PromptSourceError,
    add_prompt_flags,
    chat_messages,
    read_prompt,
    read_system,
)
from ds4mlx.generation import (
    Done,
    GGUFError,
    SamplingOptions,
    SpeculationConfig,
    SpeculativeStats,
    TokenizerError,
    chat_markup_ban,
    generate,
    load_drafter,
)
from ds4mlx.loader import LoadedModel


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ds4",
        description="Generate text with a DeepSeek-V4-Flash / GLM GGUF model.",
        epilog="Subcommands: 'ds4 plan -m FILE' prints a model's memory plan without loading "
        "it; 'ds4 bench' measures speed and quality; 'ds4 perplexity -f FILE' and 'ds4 logprobs "
        "-f FILE' score a text.",
    )
    add_model_flags(parser)
    add_prompt_flags(parser)
    parser.add_argument(
        "-n",
        "--n-predict",
        type=int,
        default=128,
        help="number of tokens to generate (default 128)",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="wrap the prompt in the model's chat template as a user turn",
    )
    add_sampling_flags(parser)
    add_speculation_flags(parser)
    add_distributed_flags(parser)
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


@dataclass(frozen=True)
class Messages:
    """ds4's messages (all on stderr) as one rank writes them. Under ``--distributed`` every rank
    runs the same generation, so ranks other than 0 would repeat each of rank 0's lines: they
    write only their errors, marked with their rank."""

    rank: int = 0

    def info(self, message: str) -> None:
        if self.rank == 0:
            log(message)

    def progress(self, message: str) -> None:
        if self.rank == 0:
            progress_line(message)

    def error(self, message: str) -> None:
        where = "" if self.rank == 0 else f"rank {self.rank}: "
        log(f"ds4: {where}error: {message}")


def main(argv: list[str] | None = None) -> int:
    try:
        return _dispatch(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:
        # The reader went away (``ds4 ... | head``): stop quietly, as Unix tools do. Python
        # flushes stdout again at exit, which would fail the same way, so it goes to /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _dispatch(argv: list[str]) -> int:
    # ``ds4 bench ...`` and ``ds4 plan ...`` are subcommands; anything else is the one-shot
    # generator, whose flags stay top-level (``ds4 -p ...``), so subcommands are matched by the
    # first word only.
    if argv[:1] == ["bench"]:
        from ds4mlx.cli.bench import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["plan"]:
        from ds4mlx.cli.plan import main as plan_main

        return plan_main(argv[1:])
    if argv[:1] in (["perplexity"], ["logprobs"]):
        from ds4mlx.cli.perplexity import main as scoring_main

        return scoring_main(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.n_predict <= 0:
        parser.error(f"--n-predict must be positive, got {args.n_predict}")
    try:
        sampling = sampling_options(args)
        speculation = speculation_config(args)
        options = model_options(args)
        args.prompt, args.system = read_prompt(args), read_system(args)
        check_drafter(args, speculation)
    except (ValueError, PromptSourceError) as exc:
        parser.error(str(exc))
    args.chat = args.chat or args.system is not None
    if args.prompt is None and not (sys.stdin.isatty() and sys.stdout.isatty()):
        parser.error(
            "give a prompt: -p TEXT, -f FILE, or -p - to read standard input "
            "(without one, on a terminal, ds4 opens a chat)"
        )
    if args.prompt is None and args.distributed:
        parser.error("the chat runs in one process; give a prompt with --distributed")

    from ds4mlx.cli.distributed import start_ranks
    from ds4mlx.generation.ranks import DistributedError
    from ds4mlx.loader import load_model

    started = time.perf_counter()
    say = Messages()
    try:
        refused = refuse_oversized(options)
        if refused is not None:
            say.error(refused)
            return 1
        ranks, sampling = start_ranks(options.distributed, sampling)
        if ranks is not None:
            say = Messages(ranks.rank)
        model = load_model(
            options.model,
            weights_dtype=options.weights_dtype,
            progress=say.progress,
            experts=options.experts,
            ranks=ranks,
        )
    except (GGUFError, TokenizerError, OSError, ValueError, DistributedError) as exc:
        say.error(str(exc))
        return 1
    say.info(
        f"ds4: loaded {options.model} ({model.args_summary()}) "
        f"in {time.perf_counter() - started:.2f}s"
    )
    if options.verbose:
        say.info(f"ds4: weights: {model.load_summary()}")
    try:
        return run(args, options, model, sampling, speculation, say)
    except RuntimeError as exc:
        if ranks is None:
            raise
        # The ring backend fails a collective when a peer's connection drops.
        log(f"ds4: error: distributed run stopped on rank {ranks.rank}: {exc}")
        return 1
    finally:
        model.close()  # reader threads; the expert hot-list is saved here when asked


def refuse_oversized(options: ModelOptions) -> str | None:
    """Without --ssd-stream, a model whose resident weights do not fit the memory available is
    refused with its memory plan (``ds4 plan``) instead of swapping or being killed."""
    if options.experts.stream or options.distributed:
        return None
    from ds4mlx.cli.plan import refusal
    from ds4mlx.loader import resolve_weights_dtype

    mode = resolve_weights_dtype(options.weights_dtype, options.model)
    return refusal(options.model, mode, options.ctx)


def run(
    args: argparse.Namespace,
    options: ModelOptions,
    model: LoadedModel,
    sampling: SamplingOptions,
    speculation: SpeculationConfig,
    say: Messages,
) -> int:
    try:
        drafter = load_drafter(speculation, model)
    except (GGUFError, OSError, ValueError) as exc:
        say.error(str(exc))
        return 1
    if drafter is not None:
        tokens = "token" if drafter.max_draft == 1 else "tokens"
        mode = (
            "strict: target-only decoding"
            if speculation.strict
            else f"up to {drafter.max_draft} {tokens} a draft"
        )
        say.info(f"ds4: drafter {drafter.name} ({mode})")

    if args.prompt is None:
        from ds4mlx.cli.repl import run_repl

        return run_repl(
            model,
            system=args.system,
            max_tokens=args.n_predict,
            max_context=options.ctx,
            sampling=sampling,
            drafter=drafter,
            speculation=speculation,
            info=say.info,
            verbose=options.verbose,
        )
    tokenizer = model.tokenizer
    if args.chat:
        if model.chat_format is None:
            say.error(f"{model.path.name} has no chat template (no real tokenizer)")
            return 1
        text = model.chat_format.render(chat_messages(args.prompt, args.system))
        prompt = tokenizer.encode(text, add_special=False)
    else:
        prompt = tokenizer.encode(args.prompt, add_special=True)
    if not prompt:
        say.error("the prompt encodes to no tokens")
        return 1

    detokenizer = tokenizer.streaming_detokenizer()
    session = model.new_session()
    written = ""  # the last piece of text written to stdout
    try:
        for event in generate(
            session,
            prompt,
            args.n_predict,
            sampling,
            drafter,
            speculation,
            stop_tokens=tokenizer.stop_ids,
            max_context=options.ctx,
            constraint=chat_markup_ban(model) if args.chat else None,
        ):
            if isinstance(event, Done):
                stats, acceptance = event.stats, event.acceptance
                break
            if event.token in tokenizer.stop_ids:
                continue
            text = detokenizer.add(event.token)
            written = text or written
            sys.stdout.write(text)
            sys.stdout.flush()
    except ValueError as exc:
        say.error(str(exc))
        return 1
    except KeyboardInterrupt:
        say.info("\nds4: interrupted")
        return 130
    text = detokenizer.finish()
    written = text or written
    # The output ends its line, so that whatever follows (a shell prompt) starts on its own.
    sys.stdout.write(text if written.endswith("\n") else text + "\n")
    sys.stdout.flush()
    say.info(
        f"ds4: prompt {stats.prompt_tokens} tokens, prefill {rate(stats.prefill_tps)} | "
        f"generated {stats.generated_tokens} tokens, decode {rate(stats.decode_tps)} "
        f"({stats.stop_reason})"
    )
    if acceptance is not None:
        say.info(speculation_summary(acceptance, detailed=speculation.timing))
    expert_stats = model.expert_stats()
    if expert_stats is not None and (options.verbose or speculation.timing):
        say.info(f"ds4: {expert_stats.summary()}")
    return 0


def rate(tokens_per_second: float) -> str:
    """A throughput for the closing line; under 0.1 t/s (a model far larger than the machine)
    as seconds per token too, where one decimal of t/s would say 0.0."""
    if 0 < tokens_per_second < 0.1:
        return f"{tokens_per_second:.4f} t/s ({1 / tokens_per_second:.0f} s/token)"
    return f"{tokens_per_second:.1f} t/s"


def speculation_summary(stats: SpeculativeStats, detailed: bool) -> str:
    line = (
        f"ds4: speculation: {stats.drafted_passes} drafts, {stats.drafted_tokens} drafted, "
        f"{stats.accepted_tokens} accepted ({stats.acceptance_rate:.0%}), "
        f"tau {stats.tau:.2f}"
    )
    if not detailed:
        return line
    s = stats.scheduler
    per_drafter = "".join(
        f"\nds4: {name}: {drafts} drafts, {drafted} drafted, {accepted} accepted "
        f"({accepted / drafted:.0%})"
        for name, (drafts, drafted, accepted) in stats.by_drafter.items()
        if len(stats.by_drafter) > 1
    )
    return (
        f"{line}{per_drafter}\nds4: timing: draft {stats.draft_seconds * 1e3:.0f} ms, verify "
        f"{stats.verify_seconds * 1e3:.0f} ms in {stats.verify_passes} passes, accept "
        f"{stats.accept_seconds * 1e3:.0f} ms | scheduler: {s.cycles} cycles, "
        f"{s.pauses} pauses ({s.no_draft_pauses} for missing drafts), {s.paused_cycles} "
        f"paused, {s.tail_cycles} in the budget tail, {s.cost_pauses} cost pauses "
        f"({s.plain_advances} plain advances)"
    )


if __name__ == "__main__":
    sys.exit(main())
