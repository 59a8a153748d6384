"""Hardened command line (issue 37, session 17): hand-made one-line mutations of ``ds4mlx/cli``
(flag value types and their bounds, defaults, the fields the flags become in
``SamplingOptions``, ``SpeculationConfig``, ``ModelOptions`` and ``ServerConfig``, the prompt
cache flags, ds4's messages per rank, ``ds4 plan``'s refusal, ``ds4-agent``'s checks and
``--print`` exit codes, the terminal chat's loop), in lines no earlier set changes. Each is
caught by the in-process tests of ``tests/cli`` written for them (``test_flag_parsing.py``,
``test_kv_options.py``, ``test_ds4_messages.py``, ``test_server_cli.py``,
``test_agent_cli.py``, ``test_repl_loop.py``, additions to ``test_plan.py`` and
``test_prompt_source.py``), checked with the change applied and passing without it.

Test selection as in the fresh sets: the whole ``tests/cli`` folder, with ``-x``.
"""

from __future__ import annotations

from mutation_sets.base import (
    CLI_AGENT_PY,
    CLI_MAIN_PY,
    CLI_OPTIONS_PY,
    CLI_PLAN_PY,
    CLI_REPL_PY,
    CLI_SERVER_PY,
    KV_OPTIONS_PY,
    PROMPT_SOURCE_PY,
)
from mutation_sets.base import in_cli_folder as _cli

MUTATIONS = (
    _cli(
        "cli_float_range_bracket_swapped",
        CLI_OPTIONS_PY,
        'left = "(" if low_open else "["',
        'left = "[" if low_open else "("',
    ),
    _cli(
        "cli_min_p_reaches_one",
        CLI_OPTIONS_PY,
        "type=_float_in(0.0, 0.999), default=0.0)",
        "type=_float_in(0.0, 1.0), default=0.0)",
    ),
    _cli("cli_repeat_last_n_default", CLI_OPTIONS_PY, "default=64,", "default=32,"),
    _cli(
        "cli_ngram_single_size_doubled",
        CLI_OPTIONS_PY,
        "sizes = (int(low), int(high)) if sep else (int(low), int(low))",
        "sizes = (int(low), int(high)) if sep else (1, int(low))",
    ),
    _cli(
        "cli_dspark_confidence_zero_not_dspark",
        CLI_OPTIONS_PY,
        "dspark = args.dspark or args.dspark_strict or args.dspark_confidence is not None",
        "dspark = args.dspark or args.dspark_strict or bool(args.dspark_confidence)",
    ),
    _cli(
        "cli_mtp_draft_one_is_mtp",
        CLI_OPTIONS_PY,
        "elif args.mtp_draft > 1:",
        "elif args.mtp_draft >= 1:",
    ),
    _cli(
        "cli_mtp_timing_with_lookup_is_nextn",
        CLI_OPTIONS_PY,
        "elif args.mtp or (args.mtp_timing and not args.lookup):",
        "elif args.mtp or args.mtp_timing:",
    ),
    _cli(
        "cli_quality_not_strict",
        CLI_OPTIONS_PY,
        "strict=args.dspark_strict or args.quality,",
        "strict=args.dspark_strict,",
    ),
    _cli(
        "cli_exact_sampling_dropped",
        CLI_OPTIONS_PY,
        "exact_sampling=args.mtp_exact_sampling,",
        "exact_sampling=False,",
    ),
    _cli(
        "cli_nextn_flag_named_wrong",
        CLI_OPTIONS_PY,
        'nextn_flag = "--mtp" if args.mtp else "--mtp-timing without another drafter"',
        'nextn_flag = "--mtp"',
    ),
    _cli(
        "cli_distributed_default_true",
        CLI_OPTIONS_PY,
        'distributed=getattr(args, "distributed", False),',
        'distributed=getattr(args, "distributed", True),',
    ),
    _cli("cli_top_k_zero_refused", CLI_OPTIONS_PY, "if args.top_k < 0:", "if args.top_k <= 0:"),
    _cli(
        "cli_presence_and_frequency_swapped",
        CLI_OPTIONS_PY,
        "presence_penalty=args.presence_penalty,",
        "presence_penalty=args.frequency_penalty,",
    ),
    _cli(
        "cli_logit_bias_first_wins",
        CLI_OPTIONS_PY,
        "logit_bias=tuple(dict(args.logit_bias).items()),",
        "logit_bias=tuple(dict(reversed(args.logit_bias)).items()),",
    ),
    _cli(
        "cli_cache_budget_error_escapes",
        CLI_OPTIONS_PY,
        "return parse_cache_budget(text)\n    except ValueError as exc:",
        "return parse_cache_budget(text)\n    except TypeError as exc:",
    ),
    _cli(
        "kv_memory_default_changed",
        KV_OPTIONS_PY,
        "DEFAULT_MEMORY_GIB = 2.0",
        "DEFAULT_MEMORY_GIB = 1.0",
    ),
    _cli(
        "kv_file_taken_as_folder",
        KV_OPTIONS_PY,
        "if folder.exists() and not folder.is_dir():",
        "if folder.exists() and folder.is_file() and False:",
    ),
    _cli(
        "kv_zero_disk_space_accepted",
        KV_OPTIONS_PY,
        "if args.kv_disk_space <= 0:",
        "if args.kv_disk_space < 0:",
    ),
    _cli(
        "kv_folder_mode_open",
        KV_OPTIONS_PY,
        "folder.mkdir(mode=0o700, parents=True, exist_ok=True)",
        "folder.mkdir(mode=0o755, parents=True, exist_ok=True)",
    ),
    _cli(
        "kv_unwritable_folder_accepted",
        KV_OPTIONS_PY,
        "if not os.access(folder, os.W_OK | os.X_OK):",
        "if not os.access(folder, os.R_OK):",
    ),
    _cli(
        "kv_disk_budget_in_gb",
        KV_OPTIONS_PY,
        "int(args.kv_disk_space * GIB)",
        "int(args.kv_disk_space * 1e9)",
    ),
    _cli(
        "kv_memory_budget_in_mib",
        KV_OPTIONS_PY,
        "memory = int(args.kv_memory_space * GIB)",
        "memory = int(args.kv_memory_space * 2**20)",
    ),
    _cli(
        "main_progress_never_ends_its_line",
        CLI_MAIN_PY,
        'end = "\\n" if "100.0%" in message else ""',
        'end = ""',
    ),
    _cli(
        "main_other_ranks_print_info",
        CLI_MAIN_PY,
        "    def info(self, message: str) -> None:\n        if self.rank == 0:",
        "    def info(self, message: str) -> None:\n        if self.rank >= 0:",
    ),
    _cli(
        "main_error_without_rank",
        CLI_MAIN_PY,
        'where = "" if self.rank == 0 else f"rank {self.rank}: "',
        'where = ""',
    ),
    _cli(
        "main_one_token_refused", CLI_MAIN_PY, "if args.n_predict <= 0:", "if args.n_predict < 0:"
    ),
    _cli(
        "main_rate_boundary_closed",
        CLI_MAIN_PY,
        "if 0 < tokens_per_second < 0.1:",
        "if 0 < tokens_per_second <= 0.1:",
    ),
    _cli(
        "main_per_drafter_lines_for_one",
        CLI_MAIN_PY,
        "if len(stats.by_drafter) > 1",
        "if len(stats.by_drafter) >= 1",
    ),
    _cli(
        "main_distributed_chat_allowed",
        CLI_MAIN_PY,
        "if args.prompt is None and args.distributed:",
        "if args.prompt is None and args.distributed and False:",
    ),
    _cli(
        "main_stream_refused_as_oversized",
        CLI_MAIN_PY,
        "if options.experts.stream or options.distributed:",
        "if options.distributed:",
    ),
    _cli(
        "prompt_source_file_ignored",
        PROMPT_SOURCE_PY,
        "    if args.file is not None:\n",
        "    if args.prompt is not None:\n",
    ),
    _cli(
        "prompt_source_empty_system_dropped",
        PROMPT_SOURCE_PY,
        'messages = [{"role": "system", "content": system}] if system is not None else []',
        'messages = [{"role": "system", "content": system}] if system else []',
    ),
    _cli(
        "prompt_source_decode_error_escapes",
        PROMPT_SOURCE_PY,
        "except (OSError, UnicodeDecodeError) as exc:",
        "except OSError as exc:",
    ),
    _cli(
        "plan_no_memory_reading_plans_anyway",
        CLI_PLAN_PY,
        "    if available is None:\n        return None\n    oversized",
        "    if available is None:\n        available = 0\n    oversized",
    ),
    _cli(
        "plan_advice_fits_native_inverted",
        CLI_PLAN_PY,
        "elif oversized.fits_native:",
        "elif not oversized.fits_native:",
    ),
    _cli(
        "plan_kv_not_modelled_line",
        CLI_PLAN_PY,
        'kv = f"not modelled for {plan.arch}"',
        'kv = "not modelled"',
    ),
    _cli("plan_ctx_zero_accepted", CLI_PLAN_PY, "if args.ctx <= 0:", "if args.ctx < 0:"),
    _cli(
        "plan_available_memory_dropped",
        CLI_PLAN_PY,
        "        if available is not None:\n            memories.append",
        "        if available is None:\n            memories.append",
    ),
    _cli(
        "server_zero_tokens_accepted",
        CLI_SERVER_PY,
        "if args.tokens is not None and args.tokens <= 0:",
        "if args.tokens is not None and args.tokens < 0:",
    ),
    _cli(
        "server_zero_keepalive_accepted",
        CLI_SERVER_PY,
        "if args.keepalive <= 0:",
        "if args.keepalive < 0:",
    ),
    _cli(
        "server_ipv6_as_ipv4",
        CLI_SERVER_PY,
        'family = socket.AF_INET6 if ":" in host else socket.AF_INET',
        'family = socket.AF_INET6 if "::" == host else socket.AF_INET',
    ),
    _cli(
        "server_blank_key_accepted",
        CLI_SERVER_PY,
        "if any(not key.strip() for key in found):",
        "if any(not key for key in found):",
    ),
    _cli(
        "server_keys_not_stripped",
        CLI_SERVER_PY,
        "return tuple(key.strip() for key in found)",
        "return tuple(found)",
    ),
    _cli(
        "server_model_id_with_suffix",
        CLI_SERVER_PY,
        "model_id=Path(options.model).stem,",
        "model_id=Path(options.model).name,",
    ),
    _cli(
        "server_aliases_dropped",
        CLI_SERVER_PY,
        "aliases=tuple(args.alias),",
        "aliases=tuple(args.alias[:1]),",
    ),
    _cli(
        "server_max_tokens_ignores_the_flag",
        CLI_SERVER_PY,
        "max_tokens=args.tokens or options.ctx,",
        "max_tokens=options.ctx,",
    ),
    _cli(
        "server_details_always_on",
        CLI_SERVER_PY,
        "details=partial(expert_details, model) if options.verbose else None,",
        "details=partial(expert_details, model),",
    ),
    _cli(
        "server_sessions_not_passed", CLI_SERVER_PY, "sessions=args.batched_session,", "sessions=1,"
    ),
    _cli("server_keepalive_default", CLI_SERVER_PY, "default=5.0,", "default=15.0,"),
    _cli(
        "agent_xdg_ignored",
        CLI_AGENT_PY,
        'base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"',
        'base = Path.home() / ".local" / "share"',
    ),
    _cli(
        "agent_output_chars_not_capped",
        CLI_AGENT_PY,
        "max_output_chars=min(16000, args.ctx),",
        "max_output_chars=args.ctx,",
    ),
    _cli(
        "agent_states_without_a_store",
        CLI_AGENT_PY,
        "if store is not None and args.kv_disk_dir is not None:",
        "if args.kv_disk_dir is not None:",
    ),
    _cli(
        "agent_context_ignores_streaming",
        CLI_AGENT_PY,
        "else plan.context_that_fits(memory, streamed=model_options(args).experts.stream)",
        "else plan.context_that_fits(memory, streamed=False)",
    ),
    _cli("agent_context_zero_kept", CLI_AGENT_PY, "return fits or fallback", "return fits"),
    _cli(
        "agent_continue_from_the_relative_workspace",
        CLI_AGENT_PY,
        "return store.latest(str(Path(args.workspace).resolve()))",
        "return store.latest(str(args.workspace))",
    ),
    _cli(
        "agent_empty_conversation_saved",
        CLI_AGENT_PY,
        "if not agent.conversation.is_empty:",
        "if True:",
    ),
    _cli(
        "agent_state_saved_without_leaving",
        CLI_AGENT_PY,
        "if leaving and agent.states is not None:",
        "if agent.states is not None:",
    ),
    _cli("agent_step_limit_exit_code", CLI_AGENT_PY, "EXIT_STEP_LIMIT = 3", "EXIT_STEP_LIMIT = 2"),
    _cli("agent_tool_output_line_longer", CLI_AGENT_PY, "lines[0][:120]", "lines[0][:200]"),
    _cli(
        "agent_more_lines_counted_with_the_first",
        CLI_AGENT_PY,
        'more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""',
        'more = f" (+{len(lines)} lines)" if len(lines) > 1 else ""',
    ),
    _cli(
        "agent_context_full_exit_zero",
        CLI_AGENT_PY,
        '                return 1\n            if event.reason == "step_limit":',
        '                return 0\n            if event.reason == "step_limit":',
    ),
    _cli(
        "agent_zero_steps_accepted",
        CLI_AGENT_PY,
        '        if value <= 0:\n            parser.error(f"{flag} must be positive',
        '        if value < 0:\n            parser.error(f"{flag} must be positive',
    ),
    _cli(
        "agent_max_steps_unchecked", CLI_AGENT_PY, '        ("--max-steps", args.max_steps),\n', ""
    ),
    _cli(
        "agent_tiny_hint_for_every_model",
        CLI_AGENT_PY,
        "if Path(args.model) == DEFAULT_MODEL",
        "if Path(args.model) != DEFAULT_MODEL",
    ),
    _cli(
        "agent_distributed_with_api_base",
        CLI_AGENT_PY,
        "if args.distributed and args.api_base:",
        "if args.distributed and not args.api_base:",
    ),
    _cli(
        "repl_xdg_ignored",
        CLI_REPL_PY,
        'base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"',
        'base = Path.home() / ".local" / "share"',
    ),
    _cli(
        "repl_block_marker_not_stripped",
        CLI_REPL_PY,
        "if line.strip() == BLOCK:",
        "if line == BLOCK:",
    ),
    _cli(
        "repl_continuation_keeps_the_backslash",
        CLI_REPL_PY,
        "lines.append(line[:-1])",
        "lines.append(line)",
    ),
    _cli(
        "repl_history_folder_open",
        CLI_REPL_PY,
        "self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)",
        "self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)",
    ),
    _cli(
        "repl_history_file_open",
        CLI_REPL_PY,
        "            self.path.chmod(0o600)",
        "            self.path.chmod(0o644)",
    ),
    _cli("repl_stop_not_cleared", CLI_REPL_PY, "        self.stop.clear()\n", ""),
    _cli(
        "repl_quit_not_a_command",
        CLI_REPL_PY,
        'if command in ("/exit", "/quit"):',
        'if command in ("/exit",):',
    ),
    _cli(
        "repl_clear_drops_the_system_prompt",
        CLI_REPL_PY,
        "                messages = list(opening)\n",
        "                messages = []\n",
    ),
    _cli(
        "repl_refused_turn_kept",
        CLI_REPL_PY,
        "messages.pop()  # the turn did not happen",
        "pass  # the turn did not happen",
    ),
    _cli(
        "repl_answer_keeps_only_the_last_piece",
        CLI_REPL_PY,
        "answer += event.text",
        "answer = event.text",
    ),
    _cli(
        "repl_summary_without_cached_tokens",
        CLI_REPL_PY,
        "({finished.cached_tokens} cached)",
        "({finished.prompt_tokens} cached)",
    ),
    _cli(
        "repl_verbose_ignored",
        CLI_REPL_PY,
        "                    if verbose:\n",
        "                    if False:\n",
    ),
)
