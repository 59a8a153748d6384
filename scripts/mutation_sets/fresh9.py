"""DOCSTRING"""

from __future__ import annotations

from mutation_sets.base import (
    AGENT_LOOP_PY,
    APP_PY,
    CHAT_BASE_PY,
    CHECKPOINTS_PY,
    CHOICES_PY,
    CONSTRAINTS_PY,
    DEEPSEEK4_CHAT_PY,
    DETOKENIZER_PY,
    EXPERT_OPTIONS_PY,
    EXPERT_READER_PY,
    FILES_PY,
    GENERATE_PY,
    GENERATION_PY,
    GGUF_READER_PY,
    GLM5_CHAT_PY,
    JOBS_PY,
    KV_STATE_PY,
    METRICS_PY,
    POLICY_PY,
    PROMPT_CACHE_PY,
    QUEUE_PY,
    SNAPSHOT_FILE_PY,
    STORE_PY,
    STREAMED_PY,
    TOKENIZER_PY,
    TURN_PY,
    UTILITY_PY,
    Mutation,
)
from mutation_sets.base import in_agent_folder as _agent
from mutation_sets.base import in_cli_folder as _cli
from mutation_sets.base import in_engine_folder as _engine
from mutation_sets.base import in_experts_folder as _experts
from mutation_sets.base import in_gguf_folder as _gguf
from mutation_sets.base import in_server_folder as _server
from mutation_sets.base import in_speculation_folder as _speculation

# Files no earlier set names in base.py.
AGENT_APP_PY = "ds4mlx/agent/app.py"
AGENT_WIDGETS_PY = "ds4mlx/agent/widgets.py"
CHAT_EVENTS_PY = "ds4mlx/engine/chat/events.py"
CHAT_INIT_PY = "ds4mlx/engine/chat/__init__.py"
DRAFTER_PY = "ds4mlx/speculation/drafter.py"
SPECULATION_INIT_PY = "ds4mlx/speculation/__init__.py"
SPEC_LOOP_PY = "ds4mlx/speculation/loop.py"
MTP_PY = "ds4mlx/speculation/mtp.py"
QUANTS_PY = "ds4mlx/gguf/quants.py"
PERPLEXITY_PY = "ds4mlx/cli/perplexity.py"
CLI_DISTRIBUTED_PY = "ds4mlx/cli/distributed.py"
CLI_BENCH_PY = "ds4mlx/cli/bench.py"

_AGENT = (
    _agent(
        "app_deleted_conversation_saved_again",
        AGENT_APP_PY,
        'if not line.startswith("/del"):  # a deleted conversation is saved again by a new turn',
        'if line.startswith("/del"):  # a deleted conversation is saved again by a new turn',
    ),
    _agent(
        "app_stopped_run_shown_as_an_error",
        AGENT_APP_PY,
        'if event.reason == "cancelled":\n            self._note("stopped")',
        'if event.reason == "canceled":\n            self._note("stopped")',
    ),
    _agent(
        "app_unanswered_permission_allows_once",
        AGENT_APP_PY,
        "decisions.append((decision or Decision.DENY, reason))",
        "decisions.append((decision or Decision.ALLOW_ONCE, reason))",
    ),
    _agent(
        "app_live_output_shows_the_first_lines",
        AGENT_APP_PY,
        'panel.show_live("\\n".join(text.splitlines()[-_LIVE_LINES:]))',
        'panel.show_live("\\n".join(text.splitlines()[:_LIVE_LINES]))',
    ),
    _agent(
        "widgets_prefix_key_without_a_prefix",
        AGENT_WIDGETS_PY,
        'if event.key == "p" and self.prefix:',
        'if event.key == "p":',
    ),
    _agent(
        "widgets_escape_quits_with_jobs_running",
        AGENT_WIDGETS_PY,
        'answer = {"y": True, "n": False, "escape": False}.get(event.key)',
        'answer = {"y": True, "n": False, "escape": True}.get(event.key)',
    ),
    _agent(
        "loop_turn_context_size_without_the_answer",
        AGENT_LOOP_PY,
        "turn.finished, turn.finished.prompt_tokens + turn.finished.completion_tokens",
        "turn.finished, turn.finished.prompt_tokens",
    ),
    _agent(
        "loop_held_back_text_lost_at_the_end",
        AGENT_LOOP_PY,
        "                if isinstance(event, Finished):  # what the filter held back comes first\n"
        "                    yield from self._answer_text(turn, markup.finish())\n",
        "",
    ),
    _agent(
        "loop_call_that_would_fail_still_asked_and_run",
        AGENT_LOOP_PY,
        "            yield ToolFinished(call_id, call, failure)\n            return\n",
        "            yield ToolFinished(call_id, call, failure)\n",
    ),
    _agent(
        "loop_every_tool_result_marked_failed",
        AGENT_LOOP_PY,
        "self._add_tool_result(call_id, result.output, result.is_error)",
        "self._add_tool_result(call_id, result.output)",
    ),
    _agent(
        "loop_summary_transcript_keeps_the_oldest",
        AGENT_LOOP_PY,
        "text = text[len(text) - int(len(text) * 0.8) :]",
        "text = text[: int(len(text) * 0.8)]",
    ),
    _agent(
        "loop_strip_counts_stripped_results_again",
        AGENT_LOOP_PY,
        'if message["role"] == "tool" and message["content"] != _STRIPPED:',
        'if message["role"] == "tool":',
    ),
    _agent(
        "loop_refused_mentions_not_reported",
        AGENT_LOOP_PY,
        "if attachments.attached or attachments.refused:",
        "if attachments.attached:",
    ),
    _agent(
        "jobs_cancelled_command_reports_an_exit_code",
        JOBS_PY,
        "stopped = timed_out or cancelled",
        "stopped = timed_out",
    ),
    _agent(
        "checkpoints_file_bash_created_missing_from_diff",
        CHECKPOINTS_PY,
        "            checkpoint.originals[path] = None\n"
        "            self._session_originals.setdefault(path, None)\n",
        "            checkpoint.originals[path] = None\n",
    ),
    _agent(
        "files_file_of_exactly_the_limit_refused_after_reading",
        FILES_PY,
        "if len(data) > limit:  # it grew while being read",
        "if len(data) >= limit:  # it grew while being read",
    ),
    _agent(
        "kv_state_backend_without_states_counted_as_keeping_them",
        KV_STATE_PY,
        'return bool(getattr(agent.backend, "keeps_states", False))',
        'return bool(getattr(agent.backend, "keeps_states", True))',
    ),
)

_SERVER = (
    _server(
        "metrics_throughput_inverted",
        METRICS_PY,
        "self.predicted_tokens / self.generation_seconds",
        "self.generation_seconds / self.predicted_tokens",
    ),
    _server(
        "metrics_prompt_total_counts_generated_tokens",
        METRICS_PY,
        "self.prompt_tokens += finished.prompt_tokens",
        "self.prompt_tokens += finished.completion_tokens",
    ),
    _server(
        "metrics_cancelled_total_shows_the_failures",
        METRICS_PY,
        '"Generations stopped because the client went away.",\n'
        "                    queue.cancelled,",
        '"Generations stopped because the client went away.",\n                    queue.failed,',
    ),
    _server(
        "metrics_ttft_sum_and_count_swapped",
        METRICS_PY,
        'lines += [f"{name}_sum {ttft[0]}", f"{name}_count {ttft[1]}"]',
        'lines += [f"{name}_sum {ttft[1]}", f"{name}_count {ttft[0]}"]',
    ),
    _server(
        "queue_batched_steps_not_counted",
        QUEUE_PY,
        "            self._stats.batched_steps += 1\n",
        "",
    ),
    _server(
        "queue_request_refused_at_start_answered_500",
        QUEUE_PY,
        "self._fail(job, exc, started=False)",
        "self._fail(job, exc, started=True)",
    ),
    _server(
        "turn_text_after_reasoning_joins_its_block",
        TURN_PY,
        "opens = not self.blocks or self.blocks[-1].kind != kind",
        "opens = not self.blocks",
    ),
    _server(
        "turn_usage_cached_tokens_shows_the_prompt",
        TURN_PY,
        '"prompt_tokens_details": {"cached_tokens": finished.cached_tokens},',
        '"prompt_tokens_details": {"cached_tokens": finished.prompt_tokens},',
    ),
    _server(
        "utility_props_top_p_shows_min_p",
        UTILITY_PY,
        '"top_p": sampling.top_p,',
        '"top_p": sampling.min_p,',
    ),
    _server(
        "utility_count_tokens_error_in_openai_shape",
        UTILITY_PY,
        "return JSONResponse(anthropic_error_body(error), status_code=error.status)",
        "return JSONResponse(openai_error_body(error), status_code=error.status)",
    ),
    _server(
        "utility_partial_utf8_piece_replaced",
        UTILITY_PY,
        'return raw.decode("utf-8")',
        'return raw.decode("utf-8", "replace")',
    ),
    _server(
        "choices_total_takes_the_last_choice",
        CHOICES_PY,
        "    first = finished[0]\n",
        "    first = finished[-1]\n",
    ),
    _server(
        "choices_each_choice_given_the_request_finish",
        CHOICES_PY,
        "choices[event.index] = (own, event.event)",
        "choices[event.index] = (own, ended)",
    ),
    _server(
        "app_finished_requests_not_counted",
        APP_PY,
        "                self.metrics.finished(item)\n",
        "",
    ),
    _server(
        "app_cors_middleware_without_cors",
        APP_PY,
        "    if config.cors:\n        middleware.insert(",
        "    if not config.cors:\n        middleware.insert(",
    ),
    _server(
        "generation_none_effort_rendered_as_an_effort",
        GENERATION_PY,
        'return None if effort in (None, "none") else effort',
        "return None if effort is None else effort",
    ),
    _server(
        "generation_text_parts_joined_without_newline",
        GENERATION_PY,
        '    return "\\n".join(texts)\n',
        '    return "".join(texts)\n',
    ),
)

_ENGINE = (
    _engine(
        "events_reasoning_counted_as_content",
        CHAT_EVENTS_PY,
        "            elif isinstance(event, ReasoningDelta):\n"
        "                turn.reasoning += event.text\n",
        "            elif isinstance(event, ReasoningDelta):\n"
        "                turn.content += event.text\n",
    ),
    _engine(
        "detokenizer_reset_keeps_the_tokens",
        DETOKENIZER_PY,
        "        self.tokens.clear()\n",
        "",
    ),
    _engine(
        "chat_glm_architecture_has_no_format",
        CHAT_INIT_PY,
        '{"deepseek4": DEEPSEEK_V4, "glm5-next": GLM5}',
        '{"deepseek4": DEEPSEEK_V4, "glm5": GLM5}',
    ),
    _engine(
        "chat_effort_order_xhigh_below_high",
        CHAT_BASE_PY,
        'REASONING_EFFORT_ORDER = ("minimal", "low", "medium", "high", "xhigh", "max")',
        'REASONING_EFFORT_ORDER = ("minimal", "low", "medium", "xhigh", "high", "max")',
    ),
    _engine(
        "chat_forced_prefix_events_lost",
        CHAT_BASE_PY,
        "        self._carried = self.feed(prefix)\n",
        "        self.feed(prefix)\n",
    ),
    _engine(
        "chat_parser_empty_text_before_a_marker",
        CHAT_BASE_PY,
        "        if position:\n            events.append(delta(self._pending[:position]))\n",
        "        events.append(delta(self._pending[:position]))\n",
    ),
    _engine(
        "generate_pipelined_run_loses_its_stop_token",
        GENERATE_PY,
        "            tokens = tokens[: stop_at + 1]\n",
        "            tokens = tokens[:stop_at]\n",
    ),
    _engine(
        "constraints_allowed_prefix_leaves_the_draft_advanced",
        CONSTRAINTS_PY,
        "            taken += 1\n        self.rollback(taken)\n",
        "            taken += 1\n",
    ),
    _engine(
        "constraints_call_may_open_inside_reasoning",
        CONSTRAINTS_PY,
        'self._phase = "reasoning" if reasoning_end else "text"',
        'self._phase = "text"',
    ),
    _engine(
        "tokenizer_bracketed_ids_dropped",
        TOKENIZER_PY,
        "number = piece.group(1) or piece.group(2)",
        "number = piece.group(2)",
    ),
    _engine(
        "tokenizer_missing_add_bos_read_as_true",
        TOKENIZER_PY,
        'add_bos=bool(gguf_file.get("tokenizer.ggml.add_bos_token", False)),',
        'add_bos=bool(gguf_file.get("tokenizer.ggml.add_bos_token", True)),',
    ),
    _engine(
        "snapshot_checksum_ignores_the_array_bytes",
        SNAPSHOT_FILE_PY,
        "        digest.update(bytes(memoryview(array)))\n",
        "",
    ),
    _engine(
        "kvcache_failing_writes_warned_every_time",
        PROMPT_CACHE_PY,
        "            self._write_failing = True\n",
        "",
    ),
    _engine(
        "kvcache_unreadable_file_stays_indexed",
        PROMPT_CACHE_PY,
        "        except SnapshotFileError as exc:\n            del self._index[tokens]\n",
        "        except SnapshotFileError as exc:\n",
    ),
    _engine(
        "glm_tool_choice_none_still_parses_calls",
        GLM5_CHAT_PY,
        "self._content_markers = (CALL_START, *_STOPS) if parse_tools else _STOPS",
        "self._content_markers = (CALL_START, *_STOPS)",
    ),
    _engine(
        "glm_cut_call_start_of_five_characters_kept_as_text",
        GLM5_CHAT_PY,
        'if held < len("<tool"):',
        'if held <= len("<tool"):',
    ),
    _engine(
        "glm_duplicate_argument_accepted",
        GLM5_CHAT_PY,
        "            if key in arguments:\n"
        '                return ToolCallError(raw, f"duplicate argument {key!r}")\n',
        "",
    ),
    _engine(
        "glm_streamed_string_argument_read_as_json",
        GLM5_CHAT_PY,
        "arguments.append((key, value if key in strings else _json_or_text(value)))",
        "arguments.append((key, _json_or_text(value)))",
    ),
    _engine(
        "glm_clear_thinking_keeps_the_older_reasoning",
        GLM5_CHAT_PY,
        "keep = reasoning is not None and (not clear_thinking or index > last_user)",
        "keep = reasoning is not None and (not clear_thinking or index < last_user)",
    ),
    _engine(
        "dsml_broken_invoke_still_streamed",
        DEEPSEEK4_CHAT_PY,
        "if not self._stream_arguments or invoke.problems or invoke.name is None:",
        "if not self._stream_arguments or invoke.name is None:",
    ),
    _engine(
        "dsml_cut_block_start_of_the_ascii_spelling_kept_as_text",
        DEEPSEEK4_CHAT_PY,
        'if not tail.lstrip("\\n").startswith(("<｜", "<D")):',
        'if not tail.lstrip("\\n").startswith("<｜"):',
    ),
)

_SPECULATION = (
    _speculation(
        "drafter_taken_rows_keep_every_layer_row",
        DRAFTER_PY,
        "{i: h[:n] for i, h in self.layers.items()},",
        "{i: h for i, h in self.layers.items()},",
    ),
    _speculation(
        "speculation_files_checked_without_a_drafter",
        SPECULATION_INIT_PY,
        "    if config.kind is DrafterKind.NONE:\n        return\n",
        "",
    ),
    _speculation(
        "spec_loop_position_acceptance_one_past_the_accepted",
        SPEC_LOOP_PY,
        "self.position_accepted[k] += k < accepted",
        "self.position_accepted[k] += k <= accepted",
    ),
    _speculation(
        "spec_loop_extension_credited_with_the_block_acceptance",
        SPEC_LOOP_PY,
        "counts[2] += min(max(accepted - start, 0), count)",
        "counts[2] += min(accepted, count)",
    ),
    _speculation(
        "spec_loop_confidence_at_the_threshold_cut",
        SPEC_LOOP_PY,
        "if confidence < threshold:",
        "if confidence <= threshold:",
    ),
    _speculation(
        "spec_loop_draft_longer_than_the_option_allows",
        SPEC_LOOP_PY,
        "n = min(room, drafter.max_draft, options.max_draft, max_draft_for_parity)",
        "n = min(room, drafter.max_draft, max_draft_for_parity)",
    ),
    _speculation(
        "spec_loop_verify_passes_not_counted",
        SPEC_LOOP_PY,
        "        stats.verify_passes += 1\n",
        "",
    ),
    _speculation(
        "mtp_max_draft_of_sixteen_refused",
        MTP_PY,
        "if not 1 <= max_draft <= MAX_DRAFT:",
        "if not 1 <= max_draft < MAX_DRAFT:",
    ),
    _speculation(
        "mtp_gap_equal_to_the_margin_stops_the_draft",
        MTP_PY,
        "return None if float(gap) < self.margin else int(best)",
        "return None if float(gap) <= self.margin else int(best)",
    ),
)

_EXPERTS = (
    _experts(
        "expert_summary_prefetch_counts_swapped",
        STORE_PY,
        'f"{self.read_gbps:.2f} GB/s | prefetch {self.prefetch_used}/{self.prefetched} "',
        'f"{self.read_gbps:.2f} GB/s | prefetch {self.prefetched}/{self.prefetch_used} "',
    ),
    _experts(
        "policy_slab_of_no_slots_accepted",
        POLICY_PY,
        "if capacity <= 0:",
        "if capacity < 0:",
    ),
    _experts(
        "policy_use_order_not_recorded",
        POLICY_PY,
        "        self._last_use[keys] = self._seq\n",
        "",
    ),
    _experts(
        "expert_cache_auto_refused",
        EXPERT_OPTIONS_PY,
        '    if text == "auto":\n        return None\n',
        "",
    ),
    _experts(
        "reader_unsupported_expert_type_accepted",
        EXPERT_READER_PY,
        "if info.qtype not in SUPPORTED_TYPES:",
        "if info.qtype not in GGML_QUANT_SIZES:",
    ),
    _experts(
        "streamed_misses_count_the_hits",
        STREAMED_PY,
        "self._stats.misses += int((~cached).sum())",
        "self._stats.misses += int(cached.sum())",
    ),
    _experts(
        "streamed_prefetch_use_not_counted",
        STREAMED_PY,
        "                if read is not None:\n"
        "                    self._stats.prefetch_used += 1\n",
        "                if read is not None:\n                    pass\n",
    ),
    _experts(
        "streamed_hotlist_to_save_refused_while_missing",
        STREAMED_PY,
        "elif self.options.hotlist is not None and not self.options.save_hotlist:",
        "elif self.options.hotlist is not None:",
    ),
    _experts(
        "streamed_hotlist_written_without_being_asked",
        STREAMED_PY,
        "            self.options.save_hotlist\n            and self.options.hotlist is not None\n",
        "            self.options.hotlist is not None\n",
    ),
)

_GGUF = (
    _gguf(
        "quants_model_of_exactly_one_gib_kept_as_blocks",
        QUANTS_PY,
        "float32_bytes <= CPU_FLOAT32_MODEL_BYTES",
        "float32_bytes < CPU_FLOAT32_MODEL_BYTES",
    ),
    _gguf(
        "quants_f16_row_codes_counted_as_float32",
        QUANTS_PY,
        "        return 2 * n\n",
        "        return 4 * n\n",
    ),
    _gguf(
        "quants_resident_bytes_without_the_biases",
        QUANTS_PY,
        "return n * bits // 8 + 2 * 4 * groups",
        "return n * bits // 8 + 4 * groups",
    ),
    _gguf(
        "quants_row_code_of_127_refused",
        QUANTS_PY,
        "codes.max(initial=0) > 127",
        "codes.max(initial=0) >= 127",
    ),
    _gguf(
        "gguf_reader_int16_metadata_read_unsigned",
        GGUF_READER_PY,
        'GGUFValueType.INT16: "<h",',
        'GGUFValueType.INT16: "<H",',
    ),
    _gguf(
        "gguf_reader_mapped_tensors_not_counted",
        GGUF_READER_PY,
        "            self.mapped_tensors += 1\n",
        "",
    ),
    _gguf(
        "gguf_reader_loaded_shard_reported_whole",
        GGUF_READER_PY,
        "self.on_tensor_loaded(name, info.nbytes if nbytes is None else nbytes)",
        "self.on_tensor_loaded(name, info.nbytes)",
    ),
)

_CLI = (
    _cli(
        "perplexity_error_divides_by_the_count",
        PERPLEXITY_PY,
        "return math.sqrt(variance / (self.count - 1)) * self.value",
        "return math.sqrt(variance / self.count) * self.value",
    ),
    _cli(
        "perplexity_text_of_exactly_two_chunks_refused",
        PERPLEXITY_PY,
        "    if n_tokens < 2 * ctx:\n",
        "    if n_tokens <= 2 * ctx:\n",
    ),
    _cli(
        "logprobs_text_of_exactly_the_context_refused",
        PERPLEXITY_PY,
        "    if len(tokens) > args.ctx:\n",
        "    if len(tokens) >= args.ctx:\n",
    ),
    _cli(
        "distributed_given_seed_replaced_by_a_drawn_one",
        CLI_DISTRIBUTED_PY,
        "    if seed is not None:\n        return seed\n",
        "",
    ),
    _cli(
        "bench_context_of_zero_tokens_accepted",
        CLI_BENCH_PY,
        "if not values or min(values) < 1:",
        "if not values or min(values) < 0:",
    ),
    _cli(
        "bench_empty_section_list_accepted",
        CLI_BENCH_PY,
        "    if unknown or not names:\n",
        "    if unknown:\n",
    ),
)

MUTATIONS: tuple[Mutation, ...] = (
    *_AGENT,
    *_SERVER,
    *_ENGINE,
    *_SPECULATION,
    *_EXPERTS,
    *_GGUF,
    *_CLI,
)
