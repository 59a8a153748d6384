"""Hardened command line, third pass (issue 37, session 19): hand-made one-line mutations of
``ds4mlx/cli`` on the lines no earlier set mutates, the least covered files first. ``ds4-agent``'s
backend loading, ``--print``'s life (signals, Ctrl+C, the closing save, the notes told) and
``main``'s paths had no test in ``tests/cli`` before this session
(``tests/cli/test_ds4_agent_runs.py``); nor had ``ds4-server``'s rank groups, load errors and
``load_engine`` (``test_server_cli.py``), nor ``ds4``'s paths around the generation
(``test_ds4_answer_output.py``). Then ``ds4 perplexity``/``logprobs``' pieces on a stand-in
model (``test_perplexity.py``: 15 of its 21 survived that file before), ``ds4 plan``'s KV line
and wired-memory note (2 of 7 survived), and the lower ends of the sampling ranges
(``test_flag_parsing.py``: 6 of 6 survived). Each was applied by hand, run against the test file
meant to catch it, and given a test where none failed. Lines an earlier set mutates were left
out (``plan.py``'s refusal advice, ``options.py``'s ``--min-p``).

Left out as not observable: ``listen``'s ``backlog=2048``; ``ds4 plan``'s ``OSError`` member
(a missing or unreadable model is reported as a GGUFError before it).

Test selection as in the fresh sets: the whole test folder of the mutated package, with ``-x``.

The 4 entries found identical to fresh10's (written the same evening by the blind writer, who
never saw this set) were taken out of this set: fresh10 keeps them.
"""

from __future__ import annotations

from mutation_sets.base import (
    CLI_AGENT_PY,
    CLI_MAIN_PY,
    CLI_OPTIONS_PY,
    CLI_PERPLEXITY_PY,
    CLI_PLAN_PY,
    CLI_SERVER_PY,
)
from mutation_sets.base import in_cli_folder as _cli

MUTATIONS = (
    # ds4-agent: the backend the flags load
    _cli(
        "agent_server_context_replaces_explicit_ctx",
        CLI_AGENT_PY,
        "if not args.ctx_given:",
        "if args.ctx_given:",
    ),
    _cli(
        "agent_server_without_context_gets_none",
        CLI_AGENT_PY,
        "backend.server_context_size() or backend.context_size",
        "backend.server_context_size()",
    ),
    _cli(
        "agent_server_api_key_dropped",
        CLI_AGENT_PY,
        "api_key=args.api_key,",
        'api_key="none",',
    ),
    _cli(
        "agent_server_context_ignores_ctx",
        CLI_AGENT_PY,
        "            context_size=options.ctx,\n            sampling=sampling,\n        )",
        "            sampling=sampling,\n        )",
    ),
    _cli(
        "agent_load_progress_dropped",
        CLI_AGENT_PY,
        "        progress=progress,\n        experts=options.experts,",
        "        progress=None,\n        experts=options.experts,",
    ),
    _cli(
        "agent_load_without_ranks",
        CLI_AGENT_PY,
        "        ranks=ranks,\n    )\n    # The backend outlives",
        "        ranks=None,\n    )\n    # The backend outlives",
    ),
    _cli(
        "agent_model_not_closed_at_exit",
        CLI_AGENT_PY,
        "atexit.register(model.close)",
        "pass",
    ),
    _cli(
        "agent_followers_let_go_without_ranks",
        CLI_AGENT_PY,
        "    if ranks is not None:\n        atexit.register(lead(model, ranks).stop)",
        "    if ranks is None:\n        atexit.register(lead(model, ranks).stop)",
    ),
    _cli(
        "agent_prompt_cache_kept_with_ranks",
        CLI_AGENT_PY,
        "prompt_cache = None if ranks is not None else prompt_cache_for(args, model)",
        "prompt_cache = None if ranks is None else prompt_cache_for(args, model)",
    ),
    _cli(
        "agent_service_without_prompt_cache",
        CLI_AGENT_PY,
        "max_context=options.ctx, prompt_cache=prompt_cache",
        "max_context=options.ctx, prompt_cache=None",
    ),
    _cli(
        "agent_local_backend_default_sampling",
        CLI_AGENT_PY,
        "return LocalBackend(service, sampling)",
        "return LocalBackend(service)",
    ),
    # ds4-agent --print: signals
    _cli(
        "agent_unwind_exit_code_without_128",
        CLI_AGENT_PY,
        "raise SystemExit(128 + received[0])",
        "raise SystemExit(received[0])",
    ),
    _cli(
        "agent_signal_does_not_stop_the_run",
        CLI_AGENT_PY,
        "        agent.stop()\n        signal.signal(signal.SIGALRM, unwind)",
        "        signal.signal(signal.SIGALRM, unwind)",
    ),
    _cli(
        "agent_signal_grace_longer",
        CLI_AGENT_PY,
        "_SIGNAL_GRACE_SECONDS = 3",
        "_SIGNAL_GRACE_SECONDS = 30",
    ),
    _cli(
        "agent_sighup_not_handled",
        CLI_AGENT_PY,
        "for sig in (signal.SIGTERM, signal.SIGHUP):",
        "for sig in (signal.SIGTERM,):",
    ),
    # ds4-agent --print: what is told and saved
    _cli(
        "agent_saved_at_the_end_only",
        CLI_AGENT_PY,
        "isinstance(event, (TurnFinished, RunFinished))",
        "isinstance(event, RunFinished)",
    ),
    _cli(
        "agent_notes_not_sanitized",
        CLI_AGENT_PY,
        'log(f"ds4-agent: {sanitize(text)}")',
        'log(f"ds4-agent: {text}")',
    ),
    _cli(
        "agent_tool_call_not_sanitized",
        CLI_AGENT_PY,
        'log(f"ds4-agent: > {sanitize(describe_call(event.call))}")',
        'log(f"ds4-agent: > {describe_call(event.call)}")',
    ),
    _cli(
        "agent_answer_sanitized_for_a_pipe",
        CLI_AGENT_PY,
        "sanitize(event.answer) if sys.stdout.isatty() else event.answer",
        "sanitize(event.answer) if not sys.stdout.isatty() else event.answer",
    ),
    _cli(
        "agent_drafter_checked_with_a_server",
        CLI_AGENT_PY,
        "    if not args.api_base:  # a drafter",
        "    if args.api_base:  # a drafter",
    ),
    _cli(
        "agent_drafter_error_ignored",
        CLI_AGENT_PY,
        "            check_drafter(args, speculation)\n        except ValueError as exc:\n"
        "            parser.error(str(exc))",
        "            check_drafter(args, speculation)\n        except ValueError:\n"
        "            pass",
    ),
    _cli(
        "agent_model_context_replaces_explicit_ctx",
        CLI_AGENT_PY,
        "if not args.ctx_given and not args.api_base:",
        "if not args.api_base:",
    ),
    _cli(
        "agent_model_context_asked_of_a_server",
        CLI_AGENT_PY,
        "if not args.ctx_given and not args.api_base:",
        "if not args.ctx_given:",
    ),
    # ds4-agent --print: its life
    _cli(
        "agent_print_loads_without_progress",
        CLI_AGENT_PY,
        "load_backend(args, progress_line, ranks)",
        "load_backend(args, None, ranks)",
    ),
    _cli(
        "agent_load_error_exit_0",
        CLI_AGENT_PY,
        '        log(f"ds4-agent: error: {exc}")\n        return 1\n    if agent.instructions',
        '        log(f"ds4-agent: error: {exc}")\n        return 0\n    if agent.instructions',
    ),
    _cli(
        "agent_instructions_told_when_resumed",
        CLI_AGENT_PY,
        "if agent.instructions is not None and conversation is None:",
        "if agent.instructions is not None:",
    ),
    _cli(
        "agent_state_restored_for_a_new_conversation",
        CLI_AGENT_PY,
        "if conversation is not None and agent.states is not None:",
        "if agent.states is not None:",
    ),
    _cli(
        "agent_restore_note_always_told",
        CLI_AGENT_PY,
        "        note = agent.states.restore(agent)\n        if note:",
        "        note = agent.states.restore(agent)\n        if True:",
    ),
    _cli(
        "agent_signal_exit_code_lost",
        CLI_AGENT_PY,
        "return 128 + received[0] if received else code",
        "return code",
    ),
    _cli(
        "agent_ctrl_c_exit_1",
        CLI_AGENT_PY,
        '        log("ds4-agent: interrupted")\n        return EXIT_INTERRUPTED',
        '        log("ds4-agent: interrupted")\n        return 1',
    ),
    _cli(
        "agent_grace_alarm_left_armed",
        CLI_AGENT_PY,
        "        signal.alarm(0)\n        agent.toolbox.close()",
        "        agent.toolbox.close()",
    ),
    _cli(
        "agent_print_toolbox_left_open",
        CLI_AGENT_PY,
        "        signal.alarm(0)\n        agent.toolbox.close()",
        "        signal.alarm(0)",
    ),
    _cli(
        "agent_print_state_not_saved_on_leaving",
        CLI_AGENT_PY,
        "_save(agent, store, leaving=True)",
        "_save(agent, store)",
    ),
    # ds4-agent: main
    _cli(
        "agent_rank_error_exit_0",
        CLI_AGENT_PY,
        '    except DistributedError as exc:\n        log(f"ds4-agent: error: {exc}")\n'
        "        return 1",
        '    except DistributedError as exc:\n        log(f"ds4-agent: error: {exc}")\n'
        "        return 0",
    ),
    _cli(
        "agent_rank_0_follows",
        CLI_AGENT_PY,
        "if ranks is not None and ranks.rank != 0:",
        "if ranks is not None and ranks.rank != 1:",
    ),
    _cli(
        "agent_stale_temporaries_kept",
        CLI_AGENT_PY,
        "    store.remove_stale_temporaries()\n",
        "",
    ),
    _cli(
        "agent_unresumable_conversation_exit_0",
        CLI_AGENT_PY,
        '    except ConversationError as exc:\n        log(f"ds4-agent: error: {exc}")\n'
        "        return 1",
        '    except ConversationError as exc:\n        log(f"ds4-agent: error: {exc}")\n'
        "        return 0",
    ),
    _cli(
        "agent_empty_print_prompt_opens_the_ui",
        CLI_AGENT_PY,
        "if args.print_prompt is not None:",
        "if args.print_prompt:",
    ),
    _cli(
        "agent_ui_names_the_model_by_its_file_name",
        CLI_AGENT_PY,
        "name = args.api_model if args.api_base else Path(args.model).stem",
        "name = args.api_model if args.api_base else Path(args.model).name",
    ),
    _cli(
        "agent_ui_return_code_dropped",
        CLI_AGENT_PY,
        "return app.return_code or 0",
        "return 0",
    ),
    _cli(
        "agent_ui_toolbox_left_open",
        CLI_AGENT_PY,
        "        for agent in agents:\n            agent.toolbox.close()",
        "        for agent in agents[1:]:\n            agent.toolbox.close()",
    ),
)
MUTATIONS += (
    # ds4-server: ranks
    _cli(
        "server_ranks_never_joined",
        CLI_SERVER_PY,
        "ranks = join_ranks(options.distributed)",
        "ranks = join_ranks(False)",
    ),
    _cli(
        "server_rank_error_exit_0",
        CLI_SERVER_PY,
        '        log.error("error: %s", exc)\n        return 1\n    if ranks is not None',
        '        log.error("error: %s", exc)\n        return 0\n    if ranks is not None',
    ),
    _cli(
        "server_only_rank_1_follows",
        CLI_SERVER_PY,
        "if ranks is not None and ranks.rank != 0:",
        "if ranks is not None and ranks.rank == 1:",
    ),
    _cli(
        "server_follower_exit_code_dropped",
        CLI_SERVER_PY,
        '        return follow_rank_0("ds4-server", options, ranks)',
        '        follow_rank_0("ds4-server", options, ranks)\n        return 0',
    ),
    # ds4-server: the socket, the engine, the cache
    _cli(
        "server_listens_on_the_default_port",
        CLI_SERVER_PY,
        "listener = listen(args.host, args.port)",
        "listener = listen(args.host, 8000)",
    ),
    _cli(
        "server_engine_loaded_without_ranks",
        CLI_SERVER_PY,
        "partial(load_engine, options, speculation, ranks)",
        "partial(load_engine, options, speculation, None)",
    ),
    _cli(
        "server_rank_lost_while_loading_not_caught",
        CLI_SERVER_PY,
        "except (GGUFError, TokenizerError, OSError, ValueError, DistributedError) as exc:",
        "except (GGUFError, TokenizerError, OSError, ValueError) as exc:",
    ),
    _cli(
        "server_load_error_exit_0",
        CLI_SERVER_PY,
        "            return 1\n        if model.chat_format",
        "            return 0\n        if model.chat_format",
    ),
    _cli(
        "server_disk_warning_without_disk_folder",
        CLI_SERVER_PY,
        "if ranks is not None and args.kv_disk_dir is not None:",
        "if ranks is not None:",
    ),
    _cli(
        "server_prompt_cache_kept_with_ranks",
        CLI_SERVER_PY,
        "None if ranks is not None else engine.run(partial(prompt_cache_for, args, model))",
        "None if ranks is None else engine.run(partial(prompt_cache_for, args, model))",
    ),
    _cli(
        "server_disk_cache_error_exit_0",
        CLI_SERVER_PY,
        '            log.error("error: --kv-disk-dir: %s", exc)\n            return 1',
        '            log.error("error: --kv-disk-dir: %s", exc)\n            return 0',
    ),
    _cli(
        "server_batched_session_error_exit_0",
        CLI_SERVER_PY,
        '            log.error("error: --batched-session %d: %s", args.batched_session, exc)\n'
        "            return 1",
        '            log.error("error: --batched-session %d: %s", args.batched_session, exc)\n'
        "            return 0",
    ),
    # ds4-server: serving and stopping
    _cli(
        "server_ipv4_address_bracketed",
        CLI_SERVER_PY,
        'url_host = f"[{args.host}]" if ":" in args.host else args.host',
        'url_host = f"[{args.host}]" if "." in args.host else args.host',
    ),
    _cli(
        "server_graceful_shutdown_longer",
        CLI_SERVER_PY,
        "timeout_graceful_shutdown=5,",
        "timeout_graceful_shutdown=30,",
    ),
    _cli(
        "server_uvicorn_binds_its_own_socket",
        CLI_SERVER_PY,
        "server.run(sockets=[listener])",
        "server.run()",
    ),
    _cli(
        "server_ctrl_c_not_suppressed",
        CLI_SERVER_PY,
        "contextlib.suppress(KeyboardInterrupt)",
        "contextlib.suppress(SystemExit)",
    ),
    _cli(
        "server_listener_left_open",
        CLI_SERVER_PY,
        "        listener.close()\n        engine.close()",
        "        engine.close()",
    ),
    _cli(
        "server_followers_not_stopped",
        CLI_SERVER_PY,
        "        if conductor is not None:\n            conductor.stop()\n    return 0",
        "    return 0",
    ),
    # ds4-server: load_engine
    _cli(
        "server_load_without_progress",
        CLI_SERVER_PY,
        "progress=progress_line,",
        "progress=None,",
    ),
    _cli(
        "server_load_model_without_ranks",
        CLI_SERVER_PY,
        "        experts=options.experts,\n        ranks=ranks,\n    )",
        "        experts=options.experts,\n        ranks=None,\n    )",
    ),
    _cli(
        "server_model_not_closed_at_exit",
        CLI_SERVER_PY,
        "atexit.register(model.close)",
        "pass",
    ),
    _cli(
        "server_no_conductor",
        CLI_SERVER_PY,
        "conductor = None if ranks is None else lead(model, ranks)",
        "conductor = None",
    ),
    _cli(
        "server_interrupted_drafter_keeps_followers",
        CLI_SERVER_PY,
        "    except BaseException:\n        if conductor is not None:",
        "    except Exception:\n        if conductor is not None:",
    ),
    _cli(
        "server_failed_drafter_keeps_followers",
        CLI_SERVER_PY,
        "        if conductor is not None:\n            conductor.stop()\n        raise",
        "        raise",
    ),
    _cli(
        "server_weights_told_without_verbose",
        CLI_SERVER_PY,
        "    if options.verbose:\n        log.info",
        "    if not options.verbose:\n        log.info",
    ),
    _cli(
        "server_strict_told_for_a_lenient_drafter",
        CLI_SERVER_PY,
        '" (strict: target-only decoding)" if speculation.strict else ""',
        '" (strict: target-only decoding)" if not speculation.strict else ""',
    ),
    _cli(
        "server_ranks_size_told_wrong",
        CLI_SERVER_PY,
        '"rank 0 of %d: the other ranks follow this one\'s model calls", ranks.size',
        '"rank 0 of %d: the other ranks follow this one\'s model calls", ranks.rank',
    ),
)
MUTATIONS += (
    # ds4: subcommands
    _cli(
        "ds4_bench_gets_its_own_name",
        CLI_MAIN_PY,
        "return bench_main(argv[1:])",
        "return bench_main(argv)",
    ),
    _cli(
        "ds4_plan_gets_its_own_name",
        CLI_MAIN_PY,
        "return plan_main(argv[1:])",
        "return plan_main(argv)",
    ),
    _cli(
        "ds4_logprobs_not_a_subcommand",
        CLI_MAIN_PY,
        'if argv[:1] in (["perplexity"], ["logprobs"]):',
        'if argv[:1] in (["perplexity"],):',
    ),
    _cli(
        "ds4_scoring_always_perplexity",
        CLI_MAIN_PY,
        "return scoring_main(argv[0], argv[1:])",
        'return scoring_main("perplexity", argv[1:])',
    ),
    # ds4: loading
    _cli(
        "ds4_other_ranks_speak_as_rank_0",
        CLI_MAIN_PY,
        "            say = Messages(ranks.rank)",
        "            say = Messages()",
    ),
    _cli(
        "ds4_tokenizer_error_not_caught",
        CLI_MAIN_PY,
        "except (GGUFError, TokenizerError, OSError, ValueError, DistributedError) as exc:",
        "except (GGUFError, OSError, ValueError, DistributedError) as exc:",
    ),
    _cli(
        "ds4_load_error_exit_0",
        CLI_MAIN_PY,
        "        say.error(str(exc))\n        return 1\n    say.info(",
        "        say.error(str(exc))\n        return 0\n    say.info(",
    ),
    _cli(
        "ds4_weights_told_without_verbose",
        CLI_MAIN_PY,
        "    if options.verbose:\n        say.info",
        "    if not options.verbose:\n        say.info",
    ),
    _cli(
        "ds4_runtime_error_hidden_without_ranks",
        CLI_MAIN_PY,
        "        if ranks is None:\n            raise",
        "        if ranks is not None:\n            raise",
    ),
    _cli(
        "ds4_dropped_peer_exit_0",
        CLI_MAIN_PY,
        '{ranks.rank}: {exc}")\n        return 1',
        '{ranks.rank}: {exc}")\n        return 0',
    ),
    _cli(
        "ds4_model_not_closed",
        CLI_MAIN_PY,
        "        model.close()  # reader threads",
        "        pass  # reader threads",
    ),
    # ds4: the drafter
    _cli(
        "ds4_drafter_os_error_not_caught",
        CLI_MAIN_PY,
        "    except (GGUFError, OSError, ValueError) as exc:",
        "    except (GGUFError, ValueError) as exc:",
    ),
    _cli(
        "ds4_drafter_error_exit_0",
        CLI_MAIN_PY,
        "        say.error(str(exc))\n        return 1\n    if drafter is not None:",
        "        say.error(str(exc))\n        return 0\n    if drafter is not None:",
    ),
    _cli(
        "ds4_one_token_drafts_plural",
        CLI_MAIN_PY,
        'tokens = "token" if drafter.max_draft == 1 else "tokens"',
        'tokens = "token" if drafter.max_draft < 1 else "tokens"',
    ),
    _cli(
        "ds4_strict_told_for_a_lenient_drafter",
        CLI_MAIN_PY,
        '            if speculation.strict\n            else f"up to',
        '            if not speculation.strict\n            else f"up to',
    ),
    # ds4: the chat opened on a terminal
    _cli(
        "ds4_chat_without_its_system_prompt",
        CLI_MAIN_PY,
        "system=args.system,",
        "system=None,",
    ),
    _cli(
        "ds4_chat_without_its_token_limit",
        CLI_MAIN_PY,
        "max_tokens=args.n_predict,",
        "max_tokens=1024,",
    ),
    _cli(
        "ds4_chat_default_context",
        CLI_MAIN_PY,
        "            max_context=options.ctx,\n            sampling=sampling,",
        "            max_context=4096,\n            sampling=sampling,",
    ),
    _cli(
        "ds4_chat_not_verbose",
        CLI_MAIN_PY,
        "verbose=options.verbose,",
        "verbose=False,",
    ),
    _cli(
        "ds4_chat_without_template_exit_0",
        CLI_MAIN_PY,
        '(no real tokenizer)")\n            return 1',
        '(no real tokenizer)")\n            return 0',
    ),
)
MUTATIONS += (
    # ds4 perplexity: the measure
    _cli(
        "perplexity_squares_not_squared",
        CLI_PERPLEXITY_PY,
        "self.nll_squared += float(np.sum(np.square(logprobs)))",
        "self.nll_squared += float(np.sum(np.abs(logprobs)))",
    ),
    _cli(
        "perplexity_variance_adds_the_mean",
        CLI_PERPLEXITY_PY,
        "variance = self.nll_squared / self.count - mean * mean",
        "variance = self.nll_squared / self.count + mean * mean",
    ),
    _cli(
        "perplexity_no_error_is_one",
        CLI_PERPLEXITY_PY,
        "            return 0.0\n        return math.sqrt",
        "            return 1.0\n        return math.sqrt",
    ),
    _cli(
        "perplexity_piece_past_the_start_yields_nothing",
        CLI_PERPLEXITY_PY,
        "        if keep < len(piece):",
        "        if keep <= len(piece):",
    ),
    _cli(
        "perplexity_bos_not_put_first",
        CLI_PERPLEXITY_PY,
        "        if bos is not None:\n            ids[0] = bos",
        "        if bos is None:\n            ids[0] = bos",
    ),
    _cli(
        "perplexity_last_row_scores_past_the_chunk",
        CLI_PERPLEXITY_PY,
        "n = min(len(logits), ctx - 1 - position)",
        "n = min(len(logits), ctx - position)",
    ),
    # ds4 logprobs
    _cli(
        "logprobs_broken_bytes_dropped",
        CLI_PERPLEXITY_PY,
        'return tokenizer.token_bytes(token).decode("utf-8", errors="replace")',
        'return tokenizer.token_bytes(token).decode("utf-8", errors="ignore")',
    ),
    _cli(
        "logprobs_last_vocabulary_id_refused",
        CLI_PERPLEXITY_PY,
        "outside = [t for t in tokens if not 0 <= t < vocab]",
        "outside = [t for t in tokens if not 0 <= t < vocab - 1]",
    ),
    _cli(
        "logprobs_negative_id_accepted",
        CLI_PERPLEXITY_PY,
        "outside = [t for t in tokens if not 0 <= t < vocab]",
        "outside = [t for t in tokens if not t < vocab]",
    ),
    _cli(
        "logprobs_vocabulary_range_told_wrong",
        CLI_PERPLEXITY_PY,
        'is outside the vocabulary (0..{vocab - 1})"',
        'is outside the vocabulary (0..{vocab})"',
    ),
    # ds4 perplexity / logprobs: the command
    _cli(
        "scoring_flag_contradiction_ignored",
        CLI_PERPLEXITY_PY,
        "        options = model_options(args)\n    except ValueError as exc:\n"
        "        parser.error(str(exc))",
        "        options = model_options(args)\n    except ValueError:\n        pass",
    ),
    _cli(
        "scoring_closed_pipe_is_an_error",
        CLI_PERPLEXITY_PY,
        "    except BrokenPipeError:\n        raise",
        "    except EOFError:\n        raise",
    ),
    _cli(
        "scoring_model_not_closed",
        CLI_PERPLEXITY_PY,
        "    finally:\n        model.close()",
        "    finally:\n        pass",
    ),
    _cli(
        "scoring_tokenizer_error_escapes",
        CLI_PERPLEXITY_PY,
        "    except (TokenizerError, ValueError, OSError) as exc:",
        "    except (ValueError, OSError) as exc:",
    ),
    _cli(
        "perplexity_header_scored_count_wrong",
        CLI_PERPLEXITY_PY,
        'f"scoring the last {ctx - 1 - ctx // 2} of each"',
        'f"scoring the last {ctx - ctx // 2} of each"',
    ),
    _cli(
        "perplexity_header_bos_always_told",
        CLI_PERPLEXITY_PY,
        '+ (f", BOS {bos} first" if bos is not None else "")',
        '+ f", BOS {bos} first"',
    ),
    _cli(
        "perplexity_chunks_numbered_from_0",
        CLI_PERPLEXITY_PY,
        "enumerate(perplexity(model, tokens, ctx, chunks, bos), start=1)",
        "enumerate(perplexity(model, tokens, ctx, chunks, bos))",
    ),
    _cli(
        "logprobs_output_file_not_closed",
        CLI_PERPLEXITY_PY,
        "        if args.output:\n            out.close()",
        "        if not args.output:\n            out.close()",
    ),
)
MUTATIONS += (
    # ds4 plan
    _cli(
        "plan_kv_fixed_bytes_dropped",
        CLI_PLAN_PY,
        "{format_size(plan.kv_fixed_bytes or 0)} fixed",
        "{format_size(0)} fixed",
    ),
    _cli(
        "plan_wired_note_at_the_share_exactly",
        CLI_PLAN_PY,
        'verdict.kind == "resident" and verdict.needed_bytes > GPU_WIRED_SHARE * memory',
        'verdict.kind == "resident" and verdict.needed_bytes >= GPU_WIRED_SHARE * memory',
    ),
    _cli(
        "plan_wired_note_for_streamed_plans",
        CLI_PLAN_PY,
        'verdict.kind == "resident" and verdict.needed_bytes > GPU_WIRED_SHARE * memory',
        "verdict.needed_bytes > GPU_WIRED_SHARE * memory",
    ),
    _cli(
        "plan_dense_model_told_one_layers_experts",
        CLI_PLAN_PY,
        "            if plan.routed_bytes\n",
        "            if True\n",
    ),
    _cli(
        "plan_label_keeps_trailing_space",
        CLI_PLAN_PY,
        'return f"{format_size(memory)} {source}".rstrip()',
        'return f"{format_size(memory)} {source}"',
    ),
    _cli(
        "plan_machine_memory_skipped",
        CLI_PLAN_PY,
        "        if total is not None:",
        "        if total is None:",
    ),
)
MUTATIONS += (
    # the shared flags: the lower ends of the ranges
    _cli(
        "flags_greedy_temperature_refused",
        CLI_OPTIONS_PY,
        "type=_float_in(0.0, 100.0),",
        "type=_float_in(0.0, 100.0, low_open=True),",
    ),
    _cli(
        "flags_top_p_zero_accepted",
        CLI_OPTIONS_PY,
        '"--top-p", type=_float_in(0.0, 1.0, low_open=True)',
        '"--top-p", type=_float_in(0.0, 1.0)',
    ),
    _cli(
        "flags_presence_penalty_upper_end_refused",
        CLI_OPTIONS_PY,
        "        type=_float_in(-2.0, 2.0),\n        default=0.0,\n"
        '        help="subtract this from the logits',
        "        type=_float_in(-2.0, 1.0),\n        default=0.0,\n"
        '        help="subtract this from the logits',
    ),
    _cli(
        "flags_frequency_penalty_lower_end_refused",
        CLI_OPTIONS_PY,
        "        type=_float_in(-2.0, 2.0),\n        default=0.0,\n"
        '        help="subtract this per occurrence',
        "        type=_float_in(-1.0, 2.0),\n        default=0.0,\n"
        '        help="subtract this per occurrence',
    ),
    _cli(
        "flags_dspark_confidence_zero_refused",
        CLI_OPTIONS_PY,
        '        type=_float_in(0.0, 1.0),\n        metavar="X",',
        '        type=_float_in(0.0, 1.0, low_open=True),\n        metavar="X",',
    ),
    _cli(
        "flags_mtp_margin_zero_refused",
        CLI_OPTIONS_PY,
        "type=_float_in(0.0, 1000.0),",
        "type=_float_in(0.0, 1000.0, low_open=True),",
    ),
)
