"""Hardened engine, experts and command line, second pass (issue 37, session 18): hand-made
one-line mutations of the code the tests of ``tests/engine``, ``tests/experts`` and
``tests/cli`` left least checked after session 17: ``ds4 bench``'s flags, usage errors,
configuration and exit status (``tests/cli/test_bench_command.py``), the distributed front
ends' shared seed, silenced ranks and following ranks (``tests/cli/test_distributed_start.py``),
``ds4 -p``'s output around a chosen token stream (``tests/cli/test_ds4_answer_output.py``),
``ds4 perplexity``/``logprobs``' usage errors and bounds (``tests/cli/test_perplexity.py``), and
the chat formats (DeepSeek-V4's and GLM's templates and parsers, the engine files with the
fewest mutations per line: ``tests/engine/test_chat.py``, ``test_chat_glm.py``). Each was
applied by hand, run against the test file meant to catch it, and given a test where none
failed. The 53 CLI ones change lines or branches that tests/cli's in-process tests never ran
before; of the 25 chat-format ones, 8 survived the tests before this session (now caught).

Left out as equivalent or not worth pinning: the loop's ``written = text or written`` in
``cli/main.py`` (a detokenizer piece is never empty after text unless the finish is too); GLM's
``all(ids)`` (implied by ``set(ids) <= set(call_ids)`` and ``all(call_ids)``); GLM keeping
reasoning at ``index >= last_user`` (an assistant message is never the last user's index); an
EOS at the very start of DeepSeek's pending tool-block text (``eos >= 0`` to ``> 0`` only
delays the block's end to ``finish``, with the same events).

Test selection as in the fresh sets: the whole test folder of the mutated package, with ``-x``.

The 3 entries found identical to fresh9's (written the same afternoon by the
blind writer, who never saw these) were taken out of this set: fresh9 keeps them.
"""

from __future__ import annotations

from mutation_sets.base import (
    CLI_BENCH_PY,
    CLI_DISTRIBUTED_PY,
    CLI_MAIN_PY,
    CLI_PERPLEXITY_PY,
    DEEPSEEK4_CHAT_PY,
    GLM5_CHAT_PY,
)
from mutation_sets.base import in_cli_folder as _cli
from mutation_sets.base import in_engine_folder as _engine

MUTATIONS = (
    # ds4 bench: value types
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
    # ds4 -p: the generation's output (tests/cli/test_ds4_answer_output.py)
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
        "logprobs_top_zero_lists_alternatives",
        CLI_PERPLEXITY_PY,
        "            if top:\n",
        "            if top is not None:\n",
    ),
    # chat formats: DeepSeek-V4's and GLM's templates and parsers (tests/engine/test_chat*.py)
    _engine(
        "chat_deepseek4_merge_user_turns_never",
        DEEPSEEK4_CHAT_PY,
        '            if turns and turns[-1].role == "user":\n                turns[-1].blocks',
        '            if turns and turns[-1].role == "assistant":\n                turns[-1].blocks',
    ),
    _engine(
        "chat_deepseek4_tools_on_developer",
        DEEPSEEK4_CHAT_PY,
        '        if not turns or turns[0].role != "system":',
        "        if not turns:",
    ),
    _engine(
        "chat_deepseek4_sort_two_results_not",
        DEEPSEEK4_CHAT_PY,
        "            if len(results) > 1:",
        "            if len(results) > 2:",
    ),
    _engine(
        "chat_deepseek4_first_invoke_newline",
        DEEPSEEK4_CHAT_PY,
        'out.template("\\n" if index else "", f\'<{DSML}invoke name="\')',
        'out.template("\\n", f\'<{DSML}invoke name="\')',
    ),
    _engine(
        "chat_deepseek4_first_param_newline",
        DEEPSEEK4_CHAT_PY,
        'out.template("\\n" if position else "", f\'<{DSML}parameter name="\')',
        'out.template("\\n", f\'<{DSML}parameter name="\')',
    ),
    _engine(
        "chat_deepseek4_effort_high_refused",
        DEEPSEEK4_CHAT_PY,
        'if reasoning_effort not in (None, "high", "max"):',
        'if reasoning_effort not in (None, "max"):',
    ),
    _engine(
        "chat_deepseek4_forced_required_empty",
        DEEPSEEK4_CHAT_PY,
        'return _FORCED_BLOCK if tool_choice == "required" else ""',
        'return _FORCED_BLOCK if tool_choice != "auto" else ""',
    ),
    _engine(
        "chat_deepseek4_parse_tools_none",
        DEEPSEEK4_CHAT_PY,
        'parse_tools=tool_choice != "none",',
        "parse_tools=True,",
    ),
    _engine(
        "chat_deepseek4_block_start_prefix",
        DEEPSEEK4_CHAT_PY,
        'if not tail.lstrip("\\n").startswith(("<｜", "<D")):',
        'if not tail.lstrip("\\n").startswith(("<｜",)):',
    ),
    _engine(
        "chat_deepseek4_duplicate_param",
        DEEPSEEK4_CHAT_PY,
        "    if name in arguments:\n",
        "    if name in arguments and False:\n",
    ),
    _engine(
        "chat_deepseek4_stop_strings",
        DEEPSEEK4_CHAT_PY,
        "        return [EOS]",
        "        return []",
    ),
    _engine(
        "chat_deepseek4_next_is_assistant",
        DEEPSEEK4_CHAT_PY,
        'next_is_assistant = not is_last and turns[index + 1].role == "assistant"',
        "next_is_assistant = not is_last",
    ),
    _engine(
        "chat_deepseek4_skip_ws",
        DEEPSEEK4_CHAT_PY,
        "while position < len(text) and text[position].isspace():",
        'while position < len(text) and text[position] == " ":',
    ),
    _engine(
        "chat_glm5_tool_reference_empty_list",
        GLM5_CHAT_PY,
        "        and len(value) > 0\n",
        "        and len(value) >= 0\n",
    ),
    _engine(
        "chat_glm5_result_id_fallback",
        GLM5_CHAT_PY,
        'return str(entry.get("tool_call_id") or entry.get("id") or "")',
        'return str(entry.get("tool_call_id") or "")',
    ),
    _engine(
        "chat_glm5_output_list_needs_an_output_key",
        GLM5_CHAT_PY,
        '        and "output" in content[0]\n',
        '        and "output" in content\n',
    ),
    _engine(
        "chat_glm5_sort_distinct_ids",
        GLM5_CHAT_PY,
        "        and len(set(ids)) == len(ids)\n",
        "        and len(set(ids)) <= len(ids)\n",
    ),
    _engine(
        "chat_glm5_sort_distinct_call_ids",
        GLM5_CHAT_PY,
        "        and len(set(call_ids)) == len(call_ids)\n",
        "        and len(set(call_ids)) <= len(call_ids)\n",
    ),
    _engine(
        "chat_glm5_reasoning_after_last_think_start",
        GLM5_CHAT_PY,
        "split(THINK_START)[-1], after",
        "split(THINK_START)[0], after",
    ),
    _engine(
        "chat_glm5_effort_default_max",
        GLM5_CHAT_PY,
        'effort = reasoning_effort or "max"',
        'effort = reasoning_effort or "high"',
    ),
    _engine(
        "chat_glm5_deferred_tool_rendered",
        GLM5_CHAT_PY,
        'if not _function(tool).get("defer_loading")',
        'if _function(tool).get("name")',
    ),
    _engine(
        "chat_glm5_forced_required",
        GLM5_CHAT_PY,
        'return CALL_START if tool_choice == "required" else ""',
        'return CALL_START if tool_choice != "auto" else ""',
    ),
    _engine(
        "chat_glm5_partial_tool_prefix",
        GLM5_CHAT_PY,
        '        if held < len("<tool"):',
        '        if held <= len("<tool"):',
    ),
    _engine(
        "chat_glm5_name_with_angle",
        GLM5_CHAT_PY,
        '        if not name or "<" in name:\n            return ToolCallError',
        "        if not name:\n            return ToolCallError",
    ),
    _engine(
        "chat_glm5_string_schema_type",
        GLM5_CHAT_PY,
        'if isinstance(schema, Mapping) and schema.get("type") == "string"',
        "if isinstance(schema, Mapping)",
    ),
)
