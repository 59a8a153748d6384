"""DOCSTRING"""

from __future__ import annotations

from mutation_sets.base import (
    AGENT_BACKEND_PY,
    AGENT_SYMBOLS_PY,
    AGENT_TOOL_SCHEMAS_PY,
    ANTHROPIC_PY,
    APP_PY,
    CHAT_BASE_PY,
    CHECKPOINTS_PY,
    CLI_AGENT_PY,
    CLI_PERPLEXITY_PY,
    CLI_PLAN_PY,
    COMMANDS_PY,
    COMPACTION_PY,
    CONSTRAINTS_PY,
    CONVERSATIONS_PY,
    DEEPSEEK4_CHAT_PY,
    ERRORS_PY,
    FILES_PY,
    GENERATE_PY,
    GENERATION_PY,
    GGUF_READER_PY,
    GLM5_CHAT_PY,
    KV_STATE_PY,
    MENTIONS_PY,
    METRICS_PY,
    MTP_PY,
    OPENAI_CHAT_PY,
    POLICY_PY,
    PROMPT_CACHE_PY,
    PROMPT_INPUT_PY,
    QUEUE_PY,
    RESIDENT_PY,
    RESPONSES_PY,
    SCHEDULER_PY,
    STATE_CODEC_PY,
    STORE_PY,
    STREAMED_PY,
    TOKENIZER_PY,
    TOOLS_PY,
    UTILITY_PY,
    WRITER_PY,
    Mutation,
)
from mutation_sets.base import in_agent_folder as _agent
from mutation_sets.base import in_cli_folder as _cli
from mutation_sets.base import in_engine_folder as _engine
from mutation_sets.base import in_experts_folder as _experts
from mutation_sets.base import in_gguf_folder as _gguf
from mutation_sets.base import in_server_folder as _server
from mutation_sets.base import in_speculation_folder as _speculation

# Files no name in base.py covers.
CHAT_EVENTS_PY = "ds4mlx/engine/chat/events.py"
SPEC_LOOP_PY = "ds4mlx/speculation/loop.py"
SPECULATION_INIT_PY = "ds4mlx/speculation/__init__.py"
QUANTIZE_PY = "ds4mlx/gguf/quantize.py"

_AGENT = (
    _agent(
        "files_socket_open_error_escapes_as_os_error",
        FILES_PY,
        "if exc.errno == errno.ENXIO:",
        "if exc.errno == errno.ENOENT:",
    ),
    _agent(
        "compaction_task_is_the_first_request",
        COMPACTION_PY,
        'task_index = max((i for i, m in enumerate(body) if m["role"] == "user"), default=None)',
        'task_index = min((i for i, m in enumerate(body) if m["role"] == "user"), default=None)',
    ),
    _agent(
        "compaction_task_before_the_summary",
        COMPACTION_PY,
        "return [*plan.system, summary, *task, *plan.tail]",
        "return [*plan.system, *task, summary, *plan.tail]",
    ),
    _agent(
        "compaction_kept_task_also_summarised",
        COMPACTION_PY,
        "        older = [m for m in older if m is not task]\n",
        "",
    ),
    _agent(
        "kv_state_restored_through_a_backend_without_states",
        KV_STATE_PY,
        "        if name is None or not self._usable(agent):\n",
        "        if name is None:\n",
    ),
    _agent(
        "tool_schemas_list_path_not_required",
        AGENT_TOOL_SCHEMAS_PY,
        '_tool("list", "List files and folders with their sizes.", {"path": _PATH}, ["path"]),',
        '_tool("list", "List files and folders with their sizes.", {"path": _PATH}, []),',
    ),
    _agent(
        "mentions_refused_mention_changes_the_prompt",
        MENTIONS_PY,
        "    if blocks:\n",
        "    if result.attached or result.refused:\n",
    ),
    _agent(
        "prompt_history_down_walks_past_the_draft",
        PROMPT_INPUT_PY,
        "        if self.position >= len(self.entries):\n            return None\n",
        "        if self.position > len(self.entries):\n            return None\n",
    ),
    _agent(
        "prompt_input_ctrl_j_sends_the_prompt",
        PROMPT_INPUT_PY,
        'NEWLINE_KEYS = frozenset({"shift+enter", "ctrl+j", "alt+enter", "newline"})',
        'NEWLINE_KEYS = frozenset({"shift+enter", "alt+enter", "newline"})',
    ),
    _agent(
        "conversations_saved_conversation_keeps_no_name",
        CONVERSATIONS_PY,
        "        conversation.name = name\n",
        "",
    ),
    _agent(
        "symbols_depth_grows_through_plain_nodes",
        AGENT_SYMBOLS_PY,
        "        else:\n            yield from _definitions(child, language, depth, cancelled)",
        "        else:\n            yield from _definitions(child, language, depth + 1, cancelled)",
    ),
    _agent(
        "symbols_c_typedef_names_lost",
        AGENT_SYMBOLS_PY,
        '        "type_identifier",\n        "field_identifier",\n',
        '        "field_identifier",\n',
    ),
    _agent(
        "commands_think_without_argument_keeps_the_setting",
        COMMANDS_PY,
        "value = _on_off(argument, not self.agent.settings.thinking)",
        "value = _on_off(argument, self.agent.settings.thinking)",
    ),
    _agent(
        "backend_empty_tool_list_sent",
        AGENT_BACKEND_PY,
        "        if tools:  # an explicit null is refused by some servers\n",
        "        if tools is not None:  # an explicit null is refused by some servers\n",
    ),
    _agent(
        "backend_first_token_time_overwritten",
        AGENT_BACKEND_PY,
        "first_token_at = first_token_at or last_token_at",
        "first_token_at = last_token_at",
    ),
    _agent(
        "tools_outline_of_a_file_needs_a_name",
        TOOLS_PY,
        "if name in (None, s.name)]",
        "if name == s.name]",
    ),
    _agent(
        "checkpoints_ignored_files_snapshotted",
        CHECKPOINTS_PY,
        '"ls-files", "--others", "--exclude-standard", "-z", "--", self.prefix, env=env',
        '"ls-files", "--others", "-z", "--", self.prefix, env=env',
    ),
)

_SERVER = (
    _server(
        "errors_anthropic_405_typed_not_found",
        ERRORS_PY,
        '    405: "invalid_request_error",\n',
        '    405: "not_found_error",\n',
    ),
    _server(
        "metrics_predicted_tokens_count_the_prompt",
        METRICS_PY,
        "self.predicted_tokens += finished.completion_tokens",
        "self.predicted_tokens += finished.prompt_tokens",
    ),
    _server(
        "metrics_failed_counter_shows_cancellations",
        METRICS_PY,
        '                    "Generations that failed.",\n                    queue.failed,\n',
        '                    "Generations that failed.",\n                    queue.cancelled,\n',
    ),
    _server(
        "metrics_ttft_sum_keeps_the_last",
        METRICS_PY,
        "self.ttft_sum += seconds",
        "self.ttft_sum = seconds",
    ),
    _server(
        "metrics_ttft_quantile_0_9_for_0_99",
        METRICS_PY,
        "for q in (0.5, 0.99):",
        "for q in (0.5, 0.9):",
    ),
    _server(
        "request_top_k_ignored",
        GENERATION_PY,
        '                "top_p",\n                "top_k",\n',
        '                "top_p",\n',
    ),
    _server(
        "responses_each_assistant_item_starts_a_message",
        RESPONSES_PY,
        "        if is_assistant_side and assistant is None:\n",
        "        if is_assistant_side:\n",
    ),
    _server(
        "tool_choice_unoffered_named_function_accepted",
        GENERATION_PY,
        "        if named not in offered_names:\n",
        "        if not offered_names:\n",
    ),
    _server(
        "utility_tokenize_piece_id_under_the_wrong_key",
        UTILITY_PY,
        '{"id": token_id, "piece": self._piece(token_id)}',
        '{"token": token_id, "piece": self._piece(token_id)}',
    ),
    _server(
        "utility_props_min_p_shows_top_p",
        UTILITY_PY,
        '"min_p": sampling.min_p,',
        '"min_p": sampling.top_p,',
    ),
    _server(
        "app_unknown_model_generates",
        APP_PY,
        "            if not self.config.serves(parsed.model):\n"
        "                raise self._unknown_model(parsed.model)\n",
        "",
    ),
    _server(
        "chat_stream_text_and_reasoning_keys_swapped",
        OPENAI_CHAT_PY,
        'delta = {"reasoning_content" if block.kind == "reasoning" else "content": text}',
        'delta = {"reasoning_content" if block.kind == "text" else "content": text}',
    ),
    _server(
        "chat_length_finish_reported_as_stop",
        OPENAI_CHAT_PY,
        '    "length": "length",\n',
        '    "length": "stop",\n',
    ),
    _server(
        "anthropic_thinking_history_refused",
        ANTHROPIC_PY,
        '        if block.type == "thinking":\n',
        '        if block.type == "redacted_thinking":\n',
    ),
    _server(
        "responses_incomplete_reason_misnamed",
        RESPONSES_PY,
        'incomplete = {"reason": "max_output_tokens"} if truncated else None',
        'incomplete = {"reason": "max_tokens"} if truncated else None',
    ),
    _server(
        "queue_admits_past_the_session_count",
        QUEUE_PY,
        "room = 0 if closing else self.max_sessions - len(self._running)",
        "room = 0 if closing else self.max_sessions",
    ),
    _server(
        "request_non_object_body_blamed_on_no_field",
        GENERATION_PY,
        '    if not errors[0]["loc"]:\n'
        "        raise APIError(400, f\"the body must be a JSON object: {errors[0]['msg']}\")\n",
        "",
    ),
)

_ENGINE = (
    _engine(
        "events_turn_loses_its_call_errors",
        CHAT_EVENTS_PY,
        "            elif isinstance(event, ToolCallError):\n"
        "                turn.errors.append(event)\n",
        "",
    ),
    _engine(
        "tokenizer_byte_map_shifted_by_the_byte",
        TOKENIZER_PY,
        "mapping[byte] = chr(256 + shifted)",
        "mapping[byte] = chr(256 + byte)",
    ),
    _engine(
        "tokenizer_add_eos_read_from_add_bos",
        TOKENIZER_PY,
        'add_eos=bool(gguf_file.get("tokenizer.ggml.add_eos_token", False)),',
        'add_eos=bool(gguf_file.get("tokenizer.ggml.add_bos_token", False)),',
    ),
    _engine(
        "tokenizer_eos_id_outside_the_vocabulary_accepted",
        TOKENIZER_PY,
        '            ("eos", eos_id),\n',
        "",
    ),
    _engine(
        "token_ids_text_between_ids_skipped",
        TOKENIZER_PY,
        "        if piece.start() != position:\n            break\n",
        "",
    ),
    _engine(
        "numeric_tokenizer_chunks_of_four_bytes",
        TOKENIZER_PY,
        "    _CHUNK_BYTES = 5\n",
        "    _CHUNK_BYTES = 4\n",
    ),
    _engine(
        "state_codec_float_field_cannot_be_saved",
        STATE_CODEC_PY,
        "        if isinstance(obj, (int, float)):\n",
        "        if isinstance(obj, int):\n",
    ),
    _engine(
        "argument_stream_announces_the_call_again",
        CHAT_BASE_PY,
        "            events.append(ToolCallStart(name))\n            self.announced = True\n",
        "            events.append(ToolCallStart(name))\n",
    ),
    _engine(
        "chat_parser_keeps_parsing_after_finish",
        CHAT_BASE_PY,
        'self._state, self._pending = _DONE, ""',
        'self._pending = ""',
    ),
    _engine(
        "chat_tool_call_id_read_from_the_function",
        CHAT_BASE_PY,
        'return ToolCall(function["name"], arguments), entry.get("id")',
        'return ToolCall(function["name"], arguments), function.get("id")',
    ),
    _engine(
        "constraints_last_token_outside_a_call_not_recorded",
        CONSTRAINTS_PY,
        "        self._last = token\n",
        "",
    ),
    _engine(
        "json_constraint_without_schema_allows_any_value",
        CONSTRAINTS_PY,
        'value = json_lexeme(schema if schema is not None else {"type": "object"})',
        "value = json_lexeme(schema if schema is not None else {})",
    ),
    _engine(
        "deepseek_tool_choice_none_still_renders_tools",
        DEEPSEEK4_CHAT_PY,
        '        if tool_choice == "none":\n            tools = None\n',
        "",
    ),
    _engine(
        "deepseek_forced_prefix_without_a_generation_prompt",
        DEEPSEEK4_CHAT_PY,
        "        if forced and add_generation_prompt:\n",
        "        if forced:\n",
    ),
    _engine(
        "deepseek_tool_message_refused",
        DEEPSEEK4_CHAT_PY,
        '        if role in ("user", "tool"):\n',
        '        if role == "user":\n',
    ),
    _engine(
        "dsml_block_without_a_blank_line_not_parsed",
        DEEPSEEK4_CHAT_PY,
        'for start in (f"\\n\\n<{dsml}tool_calls>", f"<{dsml}tool_calls>")',
        'for start in (f"\\n\\n<{dsml}tool_calls>",)',
    ),
    _engine(
        "dsml_free_string_parameters_written_as_json",
        DEEPSEEK4_CHAT_PY,
        "if parameter.plain_string or (parameter.is_string and not schema_bound):",
        "if parameter.plain_string or (parameter.is_string and schema_bound):",
    ),
    _engine(
        "glm_string_enum_enforced_without_a_schema_bound",
        GLM5_CHAT_PY,
        'choices = parameter.schema.get("enum") if schema_bound else None',
        'choices = parameter.schema.get("enum")',
    ),
    _engine(
        "glm_developer_message_rendered_as_user",
        GLM5_CHAT_PY,
        'out.template(USER if role == "user" else SYSTEM)',
        'out.template(USER if role != "system" else SYSTEM)',
    ),
    _engine(
        "kvcache_first_failing_write_not_warned",
        PROMPT_CACHE_PY,
        "            if not self._write_failing:\n",
        "            if self._write_failing:\n",
    ),
    _engine(
        "generate_batched_step_leaves_the_drafter_attached",
        GENERATE_PY,
        "            decoder.batched()\n",
        "",
    ),
)

_SPECULATION = (
    _speculation(
        "spec_loop_drafter_told_one_row_short",
        SPEC_LOOP_PY,
        "_rows(out, pos).take(1 + len(committed))",
        "_rows(out, pos).take(len(committed))",
    ),
    _speculation(
        "spec_loop_parity_bound_one_row_long",
        SPEC_LOOP_PY,
        'max_draft_for_parity = getattr(session.model, "max_invariant_rows", 1 << 30) - 1',
        'max_draft_for_parity = getattr(session.model, "max_invariant_rows", 1 << 30)',
    ),
    _speculation(
        "scheduler_cost_pause_applies_to_sampled_requests",
        SCHEDULER_PY,
        "if self._measure_left > 0 or (self.weighs_cost and self.costs.pause_left > 0):",
        "if self._measure_left > 0 or self.costs.pause_left > 0:",
    ),
    _speculation(
        "scheduler_cost_restart_keeps_the_sample_count",
        SCHEDULER_PY,
        "self.seconds, self.tokens, self.weight, self.samples = 0.0, 0.0, 0.0, 0",
        "self.seconds, self.tokens, self.weight = 0.0, 0.0, 0.0",
    ),
    _speculation(
        "scheduler_cannot_pay_bound_without_the_target_token",
        SCHEDULER_PY,
        "most = (self.max_draft + 1) * (1 + CANNOT_PAY_MARGIN)",
        "most = self.max_draft * (1 + CANNOT_PAY_MARGIN)",
    ),
    _speculation(
        "mtp_rowless_observe_one_position_short",
        MTP_PY,
        "self._next_pos += len(tokens)",
        "self._next_pos += len(tokens) - 1",
    ),
    _speculation(
        "mtp_draft_positions_one_early",
        MTP_PY,
        "pos = self._next_pos + 1  # the first draft token's position",
        "pos = self._next_pos  # the first draft token's position",
    ),
    _speculation(
        "speculation_lookup_replaces_the_learned_drafter",
        SPECULATION_INIT_PY,
        "return lookup if learned is None else LookupExtension(learned, lookup, COPY_MIN_MATCH)",
        "return lookup",
    ),
    _speculation(
        "check_drafter_nextn_model_asked_for_a_support_file",
        SPECULATION_INIT_PY,
        "            )\n        return\n    if config.kind is DrafterKind.DSPARK:",
        "            )\n    if config.kind is DrafterKind.DSPARK:",
    ),
)

_EXPERTS = (
    _experts(
        "stats_summary_budget_shows_the_capacity",
        STORE_PY,
        "(budget {format_size(self.budget_bytes)}",
        "(budget {format_size(self.capacity_bytes)}",
    ),
    _experts(
        "resident_stats_budget_left_at_zero",
        RESIDENT_PY,
        "            budget_bytes=self._bytes,\n",
        "",
    ),
    _experts(
        "policy_assigned_key_not_mapped_to_its_slot",
        POLICY_PY,
        "        self.key_slot[key] = slot\n",
        "",
    ),
    _experts(
        "policy_hotlist_hotness_not_decayed",
        POLICY_PY,
        "        hot = self.hotness(keys)\n",
        "        hot = self._hot[keys]\n",
    ),
    _experts(
        "streamed_auto_budget_holds_every_expert",
        STREAMED_PY,
        "budget = AUTO_SHARE * self.routed_bytes",
        "budget = self.routed_bytes",
    ),
    _experts(
        "streamed_hotlist_saved_coldest_first",
        STREAMED_PY,
        "entries.sort(key=lambda e: -e[0])",
        "entries.sort(key=lambda e: e[0])",
    ),
    _experts(
        "streamed_hotlist_of_another_format_accepted",
        STREAMED_PY,
        'if not isinstance(document, dict) or document.get("format") != HOTLIST_FORMAT:',
        "if not isinstance(document, dict):",
    ),
    _experts(
        "streamed_hits_count_every_expert",
        STREAMED_PY,
        "self._stats.hits += int(cached.sum())",
        "self._stats.hits += int(cached.size)",
    ),
    _experts(
        "streamed_layer_without_staging_claims_prefetch",
        STREAMED_PY,
        "return self.pool is not None and self.pool.staging > 0",
        "return self.pool is not None and self.pool.staging >= 0",
    ),
)

_GGUF = (
    _gguf(
        "quantize_q2_k_not_offered",
        QUANTIZE_PY,
        "    T.Q2_K: _q2_k,\n",
        "",
    ),
    _gguf(
        "quantize_k_quant_scale_overflow_unreported",
        QUANTIZE_PY,
        "    if not np.isfinite(half).all():\n        raise _ScaleOverflowError\n",
        "",
    ),
    _gguf(
        "quantize_iq2_xxs_sign_parity_inverted",
        QUANTIZE_PY,
        "odd = negative.sum(axis=-1) % 2 == 1",
        "odd = negative.sum(axis=-1) % 2 == 0",
    ),
    _gguf(
        "writer_empty_tensor_name_accepted",
        WRITER_PY,
        "if not isinstance(tensor.name, str) or not tensor.name:",
        "if not isinstance(tensor.name, str):",
    ),
    _gguf(
        "writer_q4_k_file_type_small",
        WRITER_PY,
        "T.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,",
        "T.Q4_K: LlamaFileType.MOSTLY_Q4_K_S,",
    ),
    _gguf(
        "reader_raw_of_a_missing_tensor_raises_key_error",
        GGUF_READER_PY,
        "        self._info(name)\n        return self._data[name]\n",
        "        return self._data[name]\n",
    ),
    _gguf(
        "reader_converted_weight_not_reported_loaded",
        GGUF_READER_PY,
        "        self.mark_loaded(name)\n        return weight\n",
        "        return weight\n",
    ),
)

_CLI = (
    _cli(
        "perplexity_chunks_beyond_the_text",
        CLI_PERPLEXITY_PY,
        "return most if chunks is None else min(chunks, most)",
        "return most if chunks is None else chunks",
    ),
    _cli(
        "perplexity_bos_without_add_bos",
        CLI_PERPLEXITY_PY,
        'if getattr(tokenizer, "add_bos", False) and tokenizer.bos_id is not None:',
        "if tokenizer.bos_id is not None:",
    ),
    _cli(
        "logprobs_top_lists_the_least_likely",
        CLI_PERPLEXITY_PY,
        'best = np.argsort(-row, kind="stable")[:top]',
        'best = np.argsort(row, kind="stable")[:top]',
    ),
    _cli(
        "plan_zero_memory_accepted",
        CLI_PLAN_PY,
        "if match is None or float(match[1]) <= 0:",
        "if match is None or float(match[1]) < 0:",
    ),
    _cli(
        "plan_wired_limit_hint_only_past_all_memory",
        CLI_PLAN_PY,
        "verdict.needed_bytes > GPU_WIRED_SHARE * memory:",
        "verdict.needed_bytes > memory:",
    ),
    _cli(
        "agent_cli_max_steps_default_halved",
        CLI_AGENT_PY,
        '"--max-steps", type=int, default=20,',
        '"--max-steps", type=int, default=10,',
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
