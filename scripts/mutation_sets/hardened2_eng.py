"""Hardened engine, experts and command line, second pass (issue 37, session 18): hand-made
one-line mutations of the code the tests of ``tests/engine``, ``tests/experts`` and
``tests/cli`` left least checked after session 17: ``ds4 bench``'s flags, usage errors,
configuration and exit status (``tests/cli/test_bench_command.py``), the distributed front
ends' shared seed, silenced ranks and following ranks (``tests/cli/test_distributed_start.py``),
and further engine and experts guards (named with their tests below). Each was applied by hand,
run against the test meant to catch it, and given a test where none failed; each is caught by
its folder's tests.

Test selection as in the fresh sets: the whole test folder of the mutated package, with ``-x``.
"""

from __future__ import annotations

from mutation_sets.base import CLI_BENCH_PY, CLI_DISTRIBUTED_PY, CLI_MAIN_PY, CLI_PERPLEXITY_PY
from mutation_sets.base import in_cli_folder as _cli

MUTATIONS = (
    # ds4 bench: value types
    _cli(
        "bench_no_sections_accepted",
        CLI_BENCH_PY,
        "    if unknown or not names:\n",
        "    if unknown:\n",
    ),
    _cli(
        "bench_blank_section_names_kept",
        CLI_BENCH_PY,
        'for name in text.split(",") if name.strip())',
        'for name in text.split(","))',
    ),
    _cli(
        "bench_context_of_one_refused",
        CLI_BENCH_PY,
        "if not values or min(values) < 1:",
        "if not values or min(values) <= 1:",
    ),
    _cli(
        "bench_context_of_zero_accepted",
        CLI_BENCH_PY,
        "if not values or min(values) < 1:",
        "if not values or min(values) < 0:",
    ),
    _cli(
        "bench_empty_drafter_path_not_skipped",
        CLI_BENCH_PY,
        "return Path(text) if text else None",
        "return Path(text)",
    ),
    # ds4 bench: usage errors
    _cli(
        "bench_one_run_refused",
        CLI_BENCH_PY,
        "if args.runs is not None and args.runs < 1:",
        "if args.runs is not None and args.runs <= 1:",
    ),
    _cli(
        "bench_lookup_zero_refused",
        CLI_BENCH_PY,
        "    if args.lookup < 0:\n",
        "    if args.lookup <= 0:\n",
    ),
    _cli(
        "bench_plot_without_speculation_accepted",
        CLI_BENCH_PY,
        'if args.plot is not None and "speculation" not in args.sections:',
        "if args.plot is not None and not args.sections:",
    ),
    _cli(
        "bench_missing_model_accepted",
        CLI_BENCH_PY,
        "    if not args.model.is_file():\n",
        "    if not args.model.suffix:\n",
    ),
    _cli(
        "bench_baseline_with_one_number_accepted",
        CLI_BENCH_PY,
        "    if not isinstance(baseline, dict) or not all(\n",
        "    if not isinstance(baseline, dict) or not any(\n",
    ),
    _cli(
        "bench_baseline_without_metrics_crashes",
        CLI_BENCH_PY,
        "    except (OSError, ValueError, KeyError, TypeError) as exc:\n",
        "    except (OSError, ValueError, TypeError) as exc:\n",
    ),
    # ds4 bench: the configuration
    _cli(
        "bench_no_peers_inverted",
        CLI_BENCH_PY,
        '"peers": not args.no_peers,',
        '"peers": args.no_peers,',
    ),
    _cli(
        "bench_runs_flag_dropped",
        CLI_BENCH_PY,
        '        overrides["runs"] = args.runs\n',
        "        pass\n",
    ),
    _cli(
        "bench_quick_ignored",
        CLI_BENCH_PY,
        "return suite.BenchConfig.quick(**overrides) if args.quick else",
        "return suite.BenchConfig(**overrides) if args.quick else",
    ),
    _cli(
        "bench_command_note_without_its_subcommand",
        CLI_BENCH_PY,
        'shlex.join(["ds4", "bench", *argv])',
        'shlex.join(["ds4", *argv])',
    ),
    # ds4 bench: the run
    _cli(
        "bench_sections_left_out_compared",
        CLI_BENCH_PY,
        "for name, value in baseline.items() if suite.section_of(name) in config.sections",
        "for name, value in baseline.items() if name",
    ),
    _cli(
        "bench_parity_of_any_run_suffices",
        CLI_BENCH_PY,
        "status = 0 if all(r.parity for r in spec_results) else 1",
        "status = 0 if any(r.parity for r in spec_results) else 1",
    ),
    _cli(
        "bench_regression_does_not_fail",
        CLI_BENCH_PY,
        "    if baseline is not None and _compare(report, baseline, config, args.compare):\n"
        "        status = 1\n",
        "    if baseline is not None:\n        _compare(report, baseline, config, args.compare)\n",
    ),
    _cli(
        "bench_comparison_not_recorded",
        CLI_BENCH_PY,
        '    report["comparison"] = [\n',
        "    _ = [\n",
    ),
    _cli(
        "bench_quick_heading_on_every_run",
        CLI_BENCH_PY,
        "f\"model: {config.model}; {'quick: ' if args.quick else ''}\"",
        'f"model: {config.model}; quick: "',
    ),
    _cli(
        "bench_kernels_runs_the_suite",
        CLI_BENCH_PY,
        '        print(f"machine: {machine_description()}\\n{kernel_bench.report()}")\n'
        "        return 0\n",
        '        print(f"machine: {machine_description()}\\n{kernel_bench.report()}")\n',
    ),
    # the distributed front ends
    _cli(
        "distributed_seed_zero_redrawn",
        CLI_DISTRIBUTED_PY,
        "    if seed is not None:\n        return seed\n",
        "    if seed:\n        return seed\n",
    ),
    _cli(
        "distributed_every_rank_draws_a_seed",
        CLI_DISTRIBUTED_PY,
        "mine = secrets.randbelow(2**31) if ranks.rank == 0 else 0",
        "mine = secrets.randbelow(2**31)",
    ),
    _cli(
        "distributed_seed_past_int32",
        CLI_DISTRIBUTED_PY,
        "secrets.randbelow(2**31)",
        "secrets.randbelow(2**32)",
    ),
    _cli(
        "distributed_rank_0_silenced",
        CLI_DISTRIBUTED_PY,
        "    if ranks.rank != 0:\n        sys.stdout",
        "    if ranks.rank >= 0:\n        sys.stdout",
    ),
    _cli(
        "distributed_other_ranks_write",
        CLI_DISTRIBUTED_PY,
        "    if ranks.rank != 0:\n        sys.stdout",
        "    if ranks.rank > 1:\n        sys.stdout",
    ),
    _cli(
        "distributed_shared_seed_not_used",
        CLI_DISTRIBUTED_PY,
        "return ranks, replace(sampling, seed=shared_seed(ranks, sampling.seed))",
        "return ranks, sampling",
    ),
    _cli(
        "distributed_follower_quits_on_ctrl_c",
        CLI_DISTRIBUTED_PY,
        "signal.signal(signal.SIGINT, signal.SIG_IGN)",
        "signal.signal(signal.SIGINT, signal.default_int_handler)",
    ),
    _cli(
        "distributed_follower_keeps_its_model_open",
        CLI_DISTRIBUTED_PY,
        "    finally:\n        model.close()\n",
        "    finally:\n        pass\n",
    ),
    _cli(
        "distributed_follower_drop_succeeds",
        CLI_DISTRIBUTED_PY,
        '        log(f"error: rank 0 stopped answering ({exc})")\n        return 1\n',
        '        log(f"error: rank 0 stopped answering ({exc})")\n        return 0\n',
    ),
    _cli(
        "distributed_follower_load_error_unprefixed",
        CLI_DISTRIBUTED_PY,
        'print(f"{front_end}: rank {ranks.rank}: {text}", file=sys.stderr, flush=True)',
        'print(f"{front_end}: {text}", file=sys.stderr, flush=True)',
    ),
    _cli(
        "distributed_follower_load_oserror_escapes",
        CLI_DISTRIBUTED_PY,
        "    except (GGUFError, TokenizerError, OSError, ValueError, DistributedError) as exc:\n"
        '        log(f"error: {exc}")',
        "    except (GGUFError, TokenizerError, ValueError, DistributedError) as exc:\n"
        '        log(f"error: {exc}")',
    ),
    # ds4 -p: the generation's output (tests/cli/test_ds4_run.py)
    _cli(
        "main_answer_line_ended_twice",
        CLI_MAIN_PY,
        'sys.stdout.write(text if written.endswith("\\n") else text + "\\n")',
        'sys.stdout.write(text + "\\n")',
    ),
    _cli(
        "main_finishing_piece_forgets_earlier_text",
        CLI_MAIN_PY,
        "    written = text or written\n    # The output",
        "    written = text\n    # The output",
    ),
    _cli(
        "main_stop_tokens_written",
        CLI_MAIN_PY,
        "            if event.token in tokenizer.stop_ids:\n                continue\n",
        "            if event.token in tokenizer.stop_ids:\n                pass\n",
    ),
    _cli(
        "main_system_prompt_without_the_template",
        CLI_MAIN_PY,
        "args.chat = args.chat or args.system is not None",
        "args.chat = args.chat",
    ),
    _cli(
        "main_raw_prompt_without_bos",
        CLI_MAIN_PY,
        "prompt = tokenizer.encode(args.prompt, add_special=True)",
        "prompt = tokenizer.encode(args.prompt, add_special=False)",
    ),
    _cli(
        "main_markup_ban_on_raw_prompts",
        CLI_MAIN_PY,
        "constraint=chat_markup_ban(model) if args.chat else None,",
        "constraint=chat_markup_ban(model),",
    ),
    _cli(
        "main_empty_prompt_generated",
        CLI_MAIN_PY,
        "    if not prompt:\n        say.error",
        "    if prompt is None:\n        say.error",
    ),
    _cli(
        "main_interrupt_exit_status",
        CLI_MAIN_PY,
        "        return 130\n",
        "        return 1\n",
    ),
    _cli(
        "main_closing_line_counts_the_prompt_as_generated",
        CLI_MAIN_PY,
        'f"generated {stats.generated_tokens} tokens, decode',
        'f"generated {stats.prompt_tokens} tokens, decode',
    ),
    _cli(
        "main_acceptance_summary_always_detailed",
        CLI_MAIN_PY,
        "say.info(speculation_summary(acceptance, detailed=speculation.timing))",
        "say.info(speculation_summary(acceptance, detailed=True))",
    ),
    _cli(
        "main_expert_line_without_verbose",
        CLI_MAIN_PY,
        "if expert_stats is not None and (options.verbose or speculation.timing):",
        "if expert_stats is not None:",
    ),
    _cli(
        "main_expert_line_never",
        CLI_MAIN_PY,
        "if expert_stats is not None and (options.verbose or speculation.timing):",
        "if expert_stats is not None and speculation.timing:",
    ),
    # ds4 perplexity / logprobs: usage and refusals (tests/cli/test_perplexity.py)
    _cli(
        "perplexity_one_chunk_refused",
        CLI_PERPLEXITY_PY,
        'if getattr(args, "chunks", None) is not None and args.chunks < 1:',
        'if getattr(args, "chunks", None) is not None and args.chunks <= 1:',
    ),
    _cli(
        "perplexity_zero_chunks_accepted",
        CLI_PERPLEXITY_PY,
        'if getattr(args, "chunks", None) is not None and args.chunks < 1:',
        'if getattr(args, "chunks", None) is not None and args.chunks < 0:',
    ),
    _cli(
        "logprobs_top_zero_refused",
        CLI_PERPLEXITY_PY,
        'if getattr(args, "top", 0) < 0:',
        'if getattr(args, "top", 0) <= 0:',
    ),
    _cli(
        "logprobs_negative_top_accepted",
        CLI_PERPLEXITY_PY,
        'if getattr(args, "top", 0) < 0:',
        'if getattr(args, "top", 0) < -1:',
    ),
    _cli(
        "scoring_unreadable_model_escapes",
        CLI_PERPLEXITY_PY,
        "    except (GGUFError, TokenizerError, OSError, ValueError) as exc:\n",
        "    except (TokenizerError, OSError, ValueError) as exc:\n",
    ),
    _cli(
        "logprobs_two_tokens_refused",
        CLI_PERPLEXITY_PY,
        "    if len(tokens) < 2:\n",
        "    if len(tokens) <= 2:\n",
    ),
    _cli(
        "logprobs_one_token_accepted",
        CLI_PERPLEXITY_PY,
        "    if len(tokens) < 2:\n",
        "    if len(tokens) < 1:\n",
    ),
    _cli(
        "logprobs_text_filling_the_context_refused",
        CLI_PERPLEXITY_PY,
        "    if len(tokens) > args.ctx:\n",
        "    if len(tokens) >= args.ctx:\n",
    ),
    _cli(
        "logprobs_top_zero_lists_alternatives",
        CLI_PERPLEXITY_PY,
        "            if top:\n",
        "            if top is not None:\n",
    ),
)
