"""The fourth fresh run (issue 37's acceptance): plausible one-line bugs written from the guard
code alone, before its tests were read, none of them in the sets before it or named in the
issue. Each runs against the test files of its area (chosen by their names).

Written: 122; 54 left as exact duplicates of earlier mutations (the same file after the change)
and 7 as near duplicates (another spelling of an earlier bug, or one an earlier bug's test must
catch), 1 as an equivalent mutant (``latest`` tried a broken file: such a file has no workspace,
so it never matched). The first pass caught 44 of the 76 left (58 %): agent 9/22, server 9/17,
KV cache 2/4, sampling 2/2, constraints 2/5, detokenizer and templates 5/5, speculation 7/8,
experts 5/10, GGUF 3/3. One survivor (``agent_mention_keeps_a_closing_parenthesis``) is caught
by a test outside the selection (``test_agent_habits``). Since then a test for each survivor,
in six files that run first in their areas' selections; the rerun of the 32 survivors caught
all of them."""

from __future__ import annotations

from mutation_sets import fresh3
from mutation_sets.base import (
    ACCEPTANCE_PY,
    ACCESS_PY,
    ANTHROPIC_PY,
    BODY_PY,
    CHECKPOINTS_PY,
    CHOICES_PY,
    COMPACTION_PY,
    CONSTRAINTS_PY,
    CONVERSATIONS_PY,
    DETOKENIZER_PY,
    FILES_PY,
    GENERATION_PY,
    GLM5_CHAT_PY,
    MENTIONS_PY,
    OPENAI_CHAT_PY,
    POLICY_PY,
    PROMPT_CACHE_PY,
    PROMPT_PY,
    SAMPLING_PY,
    SCHEDULER_PY,
    SNAPSHOT_FILE_PY,
    STREAMED_PY,
    TOOLS_PY,
    UTILITY_PY,
    VALIDATE_PY,
    WORKSPACE_PY,
    Mutation,
)
from mutation_sets.base import in_area as _m

# The tests written for this set's survivors first, then the third set's agent files.
AGENT = ("tests/agent/test_agent_guard_limits.py", *fresh3.AGENT)
AGENT_UNDO = (
    "tests/agent/test_agent_guard_limits.py",
    "tests/agent/test_agent_undo_edges.py",
    "tests/agent/test_agent_sessions.py",
    "tests/agent/test_agent_guards.py",
    "tests/agent/test_agent_safety.py",
)
AGENT_SESSIONS = (
    "tests/agent/test_agent_guard_limits.py",
    "tests/agent/test_agent_prompt_input.py",
    "tests/agent/test_agent_compaction.py",
    "tests/agent/test_agent_conversations.py",
    "tests/agent/test_agent_kv_state.py",
    "tests/agent/test_agent_guards.py",
)
SERVER_ACCESS = (
    "tests/server/test_route_edges.py",
    "tests/server/test_access.py",
    "tests/server/test_server_guards.py",
    "tests/server/test_bad_requests.py",
)
SERVER_REQUESTS = (
    "tests/server/test_route_edges.py",
    "tests/server/test_request_mapping.py",
    "tests/server/test_request_edges.py",
    "tests/server/test_tool_choice.py",
    "tests/robustness/test_server_requests.py",
    "tests/server/test_utility_endpoints.py",
    "tests/server/test_choices.py",
    "tests/server/test_penalties_cached.py",
    "tests/server/test_bad_requests.py",
    "tests/server/test_server_guards.py",
)
SERVER_STREAMS = (
    "tests/server/test_route_edges.py",
    "tests/server/test_streaming.py",
    "tests/server/test_openai_api.py",
    "tests/server/test_anthropic_api.py",
    "tests/server/test_response_edges.py",
)
KV = (
    "tests/engine/test_kv_cache_edges.py",
    "tests/engine/test_prompt_cache.py",
    "tests/engine/test_prompt_cache_order.py",
    "tests/engine/test_kv_snapshots.py",
    "tests/server/test_kv_cache.py",
)
SAMPLING = (
    "tests/engine/test_sampler_filters.py",
    "tests/engine/test_penalties.py",
    "tests/engine/test_pipelined_sampling.py",
    "tests/speculation/test_acceptance.py",
)
CONSTRAINED = (
    "tests/engine/test_constraint_phases.py",
    "tests/engine/test_constraints.py",
    "tests/server/test_constrained_output.py",
    "tests/speculation/test_constrained.py",
)
TEMPLATES = (
    "tests/engine/test_special_tokens_stay_text.py",
    "tests/engine/test_chat.py",
    "tests/engine/test_chat_glm.py",
    "tests/engine/test_tokenizer.py",
    "tests/server/test_prompt_safety.py",
    "tests/engine/test_chat_tool_streaming.py",
)
SPECULATION = (
    "tests/speculation/test_context_edges.py",
    "tests/speculation/test_acceptance.py",
    "tests/speculation/test_exact_acceptance.py",
    "tests/speculation/test_loop.py",
    "tests/speculation/test_scheduler.py",
)
EXPERTS = (
    "tests/experts/test_store_edges.py",
    "tests/experts/test_staging_room.py",
    "tests/experts/test_policy.py",
    "tests/experts/test_failure_modes.py",
    "tests/experts/test_decode_batches.py",
    "tests/experts/test_expert_flags.py",
    "tests/experts/test_reader.py",
)
GGUF = fresh3.GGUF_ALL

SSE_PY = "ds4mlx/server/sse.py"
LOOP_PY = "ds4mlx/speculation/loop.py"


_AGENT = (
    # --- permissions
    _m(
        AGENT,
        "agent_edit_needs_no_permission",
        TOOLS_PY,
        'TOOLS_NEEDING_PERMISSION = frozenset({"write", "edit", "bash"})',
        'TOOLS_NEEDING_PERMISSION = frozenset({"write", "bash"})',
    ),
    # --- workspace
    _m(
        AGENT,
        "agent_path_of_1024_chars_refused",
        WORKSPACE_PY,
        "if len(text) > MAX_PATH_CHARS:",
        "if len(text) >= MAX_PATH_CHARS:",
    ),
    _m(
        AGENT,
        "agent_walk_lists_links_out",
        WORKSPACE_PY,
        "return target.exists() and target.is_relative_to(self.root)",
        "return target.exists() and link.is_relative_to(self.root)",
    ),
    # --- tools
    _m(
        AGENT,
        "agent_read_shows_one_line_too_many",
        TOOLS_PY,
        "end = start + self.read_lines - 1",
        "end = start + self.read_lines",
    ),
    _m(
        AGENT,
        "agent_timed_out_command_not_an_error",
        TOOLS_PY,
        'return ToolResult(output.strip("\\n") or "(no output)", is_error=outcome.exit_code != 0)',
        'return ToolResult(output.strip("\\n") or "(no output)", is_error=bool(outcome.exit_code))',
    ),
    # --- files
    _m(
        AGENT,
        "agent_write_drops_execute_bits",
        FILES_PY,
        "os.fchmod(file.fileno(), mode)",
        "os.fchmod(file.fileno(), mode & 0o666)",
    ),
    _m(
        AGENT,
        "agent_new_files_executable",
        FILES_PY,
        "fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)",
        "fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o777)",
    ),
    # --- jobs
    # --- mentions
    _m(
        AGENT_SESSIONS,
        "agent_mention_keeps_a_closing_parenthesis",
        MENTIONS_PY,
        '_TRAILING = ".,;:!?)]}\\"\'"',
        '_TRAILING = ".,;:!?]}\\"\'"',
    ),
    _m(
        AGENT_SESSIONS,
        "agent_mention_cut_names_the_wrong_line",
        MENTIONS_PY,
        'shown = text[:MAX_ATTACHED_CHARS].count("\\n") + 1',
        'shown = text[:MAX_ATTACHED_CHARS].count("\\n")',
    ),
    _m(
        AGENT_SESSIONS,
        "agent_mention_completes_hidden_files",
        MENTIONS_PY,
        'and (name_part.startswith(".") or not entry.name.startswith("."))',
        "",
    ),
    # --- compaction
    _m(
        AGENT_SESSIONS,
        "agent_compaction_not_at_exactly_85_percent",
        COMPACTION_PY,
        "return tokens >= COMPACT_AT * context_size",
        "return tokens > COMPACT_AT * context_size",
    ),
    _m(
        AGENT_SESSIONS,
        "agent_compaction_drops_a_huge_last_turn",
        COMPACTION_PY,
        "if used > budgets.tail and tail_start < len(body):",
        "if used > budgets.tail:",
    ),
    _m(
        AGENT_SESSIONS,
        "agent_compaction_tail_opens_with_a_tool_result",
        COMPACTION_PY,
        'if body[index]["role"] != "tool":\n            tail_start = index',
        "tail_start = index",
    ),
    _m(
        AGENT_SESSIONS,
        "agent_compaction_repeats_the_task",
        COMPACTION_PY,
        "task_index is not None and task_index < tail_start",
        "task_index is not None and task_index <= tail_start",
    ),
    _m(
        AGENT_SESSIONS,
        "agent_compaction_lists_an_old_summary_as_a_request",
        COMPACTION_PY,
        'if m["role"] == "user" and not m["content"].startswith(SUMMARY_HEADER)',
        'if m["role"] == "user"',
    ),
    # --- conversations
    _m(
        AGENT_SESSIONS,
        "agent_conversation_name_prefix_match",
        CONVERSATIONS_PY,
        "if not _NAME.fullmatch(name):",
        "if not _NAME.match(name):",
    ),
    # --- undo
    _m(
        AGENT_UNDO,
        "agent_written_files_named_beyond_undo",
        CHECKPOINTS_PY,
        "if path not in checkpoint.originals and after.get(path) != state",
        "if after.get(path) != state",
    ),
    _m(
        AGENT_UNDO,
        "agent_second_bash_retakes_the_manifest",
        CHECKPOINTS_PY,
        "if bash and self.git is None and self._current.manifest is None:",
        "if bash and self.git is None:",
    ),
    _m(
        AGENT_UNDO,
        "agent_snapshot_skips_a_16_mib_file",
        CHECKPOINTS_PY,
        "return path.stat().st_size <= MAX_UNTRACKED_SNAPSHOT_BYTES",
        "return path.stat().st_size < MAX_UNTRACKED_SNAPSHOT_BYTES",
    ),
    _m(
        AGENT_UNDO,
        "agent_diff_of_exactly_the_cap_clipped",
        CHECKPOINTS_PY,
        "if len(lines) > MAX_DIFF_LINES:",
        "if len(lines) >= MAX_DIFF_LINES:",
    ),
    _m(
        AGENT_SESSIONS,
        "agent_conversation_name_of_101_chars",
        CONVERSATIONS_PY,
        '_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")',
        '_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}")',
    ),
    _m(
        AGENT_SESSIONS,
        "agent_state_temporaries_never_removed",
        CONVERSATIONS_PY,
        'patterns = (".*.tmp", ".*.tmp.safetensors")',
        'patterns = (".*.tmp",)',
    ),
)

_SERVER = (
    # --- access
    _m(
        SERVER_ACCESS,
        "server_v1_health_needs_a_key",
        ACCESS_PY,
        'OPEN_PATHS = frozenset({"/health", "/v1/health"})',
        'OPEN_PATHS = frozenset({"/health"})',
    ),
    _m(
        SERVER_ACCESS,
        "server_same_origin_ignores_the_port",
        ACCESS_PY,
        "return host is not None and urlsplit(origin).netloc.lower() == host.lower()",
        "return host is not None and urlsplit(origin).hostname == host.lower()",
    ),
    _m(
        SERVER_ACCESS,
        "server_count_tokens_refusal_in_openai_shape",
        ACCESS_PY,
        'if path.startswith("/v1/messages"):',
        'if path == "/v1/messages":',
    ),
    # --- bodies and limits
    _m(
        SERVER_REQUESTS,
        "server_streamed_body_checked_per_chunk",
        BODY_PY,
        "if len(body) > limit:",
        "if len(chunk) > limit:",
    ),
    _m(
        SERVER_REQUESTS,
        "server_tokenize_skips_the_length_check",
        UTILITY_PY,
        'self.limit.check_text(len(body.content), "content")',
        "pass",
    ),
    _m(
        SERVER_REQUESTS,
        "server_slots_fail_on_no_slot_true_ignored",
        UTILITY_PY,
        'if request.query_params.get("fail_on_no_slot") in ("1", "true") and all(',
        'if request.query_params.get("fail_on_no_slot") in ("1",) and all(',
    ),
    # --- request validation
    _m(
        SERVER_REQUESTS,
        "server_negative_logit_bias_key_accepted",
        GENERATION_PY,
        "if not key.isdigit():",
        'if not key.lstrip("-").isdigit():',
    ),
    _m(
        SERVER_REQUESTS,
        "server_top_logprobs_zero_without_logprobs",
        OPENAI_CHAT_PY,
        "if request.top_logprobs is not None and not request.logprobs:",
        "if request.top_logprobs and not request.logprobs:",
    ),
    _m(
        SERVER_REQUESTS,
        "server_choice_seed_not_wrapped",
        CHOICES_PY,
        "return None if seed is None else (seed + index) % SEED_MODULUS",
        "return None if seed is None else seed + index",
    ),
    _m(
        SERVER_REQUESTS,
        "server_cancelled_choice_does_not_end_the_request",
        CHOICES_PY,
        "if len(finished) <= index:",
        "if len(finished) < index:",
    ),
    # --- streaming framing
    _m(
        SERVER_STREAMS,
        "server_keep_alive_frame_unterminated",
        SSE_PY,
        'KEEP_ALIVE_FRAME = b": keep-alive\\n\\n"',
        'KEEP_ALIVE_FRAME = b": keep-alive\\n"',
    ),
    _m(
        SERVER_STREAMS,
        "server_named_event_frame_unterminated",
        SSE_PY,
        'return f"event: {name}\\ndata: {_json(payload)}\\n\\n".encode()',
        'return f"event: {name}\\ndata: {_json(payload)}\\n".encode()',
    ),
    _m(
        SERVER_ACCESS,
        "server_401_without_www_authenticate",
        ACCESS_PY,
        'headers={"WWW-Authenticate": "Bearer"} if error.status == 401 else None',
        'headers={"WWW-Authenticate": "Bearer"} if error.status == 403 else None',
    ),
    _m(
        SERVER_REQUESTS,
        "server_slots_one_busy_too_many",
        UTILITY_PY,
        '"is_processing": index < stats.running}',
        '"is_processing": index <= stats.running}',
    ),
    _m(
        SERVER_REQUESTS,
        "server_seed_of_2_64_accepted",
        GENERATION_PY,
        "seed: int | None = Field(None, ge=-1, le=2**64 - 1)",
        "seed: int | None = Field(None, ge=-1, le=2**64)",
    ),
    _m(
        SERVER_REQUESTS,
        "server_anthropic_disable_parallel_ignored",
        ANTHROPIC_PY,
        "request.tool_choice and request.tool_choice.disable_parallel_tool_use",
        "request.tool_choice and False",
    ),
    _m(
        SERVER_STREAMS,
        "server_data_frame_unterminated",
        SSE_PY,
        'return f"data: {_json(payload)}\\n\\n".encode()',
        'return f"data: {_json(payload)}\\n".encode()',
    ),
)

_CACHES = (
    # --- prompt cache
    _m(
        KV,
        "kv_disk_evicts_one_too_many",
        PROMPT_CACHE_PY,
        "if total <= limit:\n                break",
        "if total < limit:\n                break",
    ),
    _m(
        KV,
        "kv_candidates_shortest_first",
        PROMPT_CACHE_PY,
        "return sorted(found.values(), key=lambda c: (-c.share, c.cut, c.on_disk))",
        "return sorted(found.values(), key=lambda c: (c.share, c.cut, c.on_disk))",
    ),
    # --- snapshot files
    _m(
        KV,
        "kv_snapshot_tokens_accept_booleans",
        SNAPSHOT_FILE_PY,
        "if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):",
        "if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):",
    ),
    _m(
        KV,
        "kv_other_models_files_indexed",
        PROMPT_CACHE_PY,
        'if metadata.get("fingerprint") != self.fingerprint:',
        'if metadata.get("fingerprint") is None:',
    ),
)

_DECODING = (
    # --- sampling
    _m(
        SAMPLING,
        "sampling_window_one_token_longer",
        SAMPLING_PY,
        "self._recent: deque[int] = deque(maxlen=options.repeat_last_n)",
        "self._recent: deque[int] = deque(maxlen=options.repeat_last_n + 1)",
    ),
    _m(
        SAMPLING,
        "sampling_repeat_last_n_zero_accepted",
        SAMPLING_PY,
        "if self.repeat_last_n < 1:",
        "if self.repeat_last_n < 0:",
    ),
    # --- constraints
    _m(
        CONSTRAINED,
        "grammar_consumes_stop_tokens",
        CONSTRAINTS_PY,
        "taken = token not in self._stop_ids",
        "taken = True",
    ),
    _m(
        CONSTRAINED,
        "call_may_open_while_reasoning",
        CONSTRAINTS_PY,
        'self._phase == "text"\n            and self._syntax is not None',
        'self._phase != "call"\n            and self._syntax is not None',
    ),
    _m(
        CONSTRAINED,
        "reasoning_end_split_over_tokens_missed",
        CONSTRAINTS_PY,
        "self._tail = (self._tail + self._tokenizer.token_bytes(token))[-64:]",
        "self._tail = self._tokenizer.token_bytes(token)",
    ),
    # --- detokenizer and templates
    _m(
        TEMPLATES,
        "detokenizer_drops_invalid_bytes",
        DETOKENIZER_PY,
        'self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")',
        'self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")',
    ),
    _m(
        TEMPLATES,
        "detokenizer_ignores_skip_special",
        DETOKENIZER_PY,
        "return self._decoder.decode(self._tokenizer.token_bytes(token_id, self._skip_special))",
        "return self._decoder.decode(self._tokenizer.token_bytes(token_id))",
    ),
    _m(
        TEMPLATES,
        "max_token_bytes_takes_the_shortest",
        PROMPT_PY,
        "return max(len(tokenizer.token_bytes(token_id))",
        "return min(len(tokenizer.token_bytes(token_id))",
    ),
    _m(
        TEMPLATES,
        "glm_history_call_name_parsed_as_template",
        GLM5_CHAT_PY,
        "    out.template(CALL_START)\n    out.caller(call.name)",
        "    out.template(CALL_START)\n    out.template(call.name)",
    ),
    _m(
        CONSTRAINED,
        "verify_masks_rolled_back_one_short",
        CONSTRAINTS_PY,
        "self.rollback(len(draft))",
        "self.rollback(len(draft) - 1)",
    ),
    _m(
        CONSTRAINED,
        "call_openers_only_the_bare_opener",
        CONSTRAINTS_PY,
        "if opening and opens_after and piece.endswith(opens_after.encode())",
        "if opening and opens_after and piece == opens_after.encode()",
    ),
    _m(
        TEMPLATES,
        "detokenizer_reset_keeps_pending_bytes",
        DETOKENIZER_PY,
        "self._decoder.reset()",
        "pass",
    ),
)

_SPECULATION = (
    _m(
        SPECULATION,
        "opportunistic_mismatch_takes_greedy",
        ACCEPTANCE_PY,
        "return Verdict(i, sampler.draw(logits[i]))",
        "return Verdict(i, greedy[i])",
    ),
    _m(
        SPECULATION,
        "verify_rollback_keeps_one_row_less",
        LOOP_PY,
        "session.truncate(pos + 1 + len(committed))",
        "session.truncate(pos + len(committed))",
    ),
    _m(
        SPECULATION,
        "verify_stop_token_dropped",
        LOOP_PY,
        "return committed[: stop_at + 1]",
        "return committed[:stop_at]",
    ),
    _m(
        SPECULATION,
        "draft_room_overshoots_max_tokens",
        LOOP_PY,
        "room = limits.max_tokens - stats.generated_tokens - 1",
        "room = limits.max_tokens - stats.generated_tokens",
    ),
    _m(
        SPECULATION,
        "drafting_over_one_token_late",
        SCHEDULER_PY,
        "return remaining_budget - 1 < min(MIN_TAIL_DRAFT, self.max_draft)",
        "return remaining_budget < min(MIN_TAIL_DRAFT, self.max_draft)",
    ),
    _m(
        SPECULATION,
        "no_draft_pause_index_past_the_table",
        SCHEDULER_PY,
        "NO_DRAFT_PAUSES[min(self._no_draft_streak, len(NO_DRAFT_PAUSES) - 1)]",
        "NO_DRAFT_PAUSES[min(self._no_draft_streak, len(NO_DRAFT_PAUSES))]",
    ),
    _m(
        SPECULATION,
        "draft_room_overshoots_the_context",
        LOOP_PY,
        "room = min(room, limits.max_context - session.n_tokens - 1)",
        "room = min(room, limits.max_context - session.n_tokens)",
    ),
    _m(
        SPECULATION,
        "verify_stop_token_rolled_back",
        LOOP_PY,
        "session.truncate(pos + 1 + stop_at)",
        "session.truncate(pos + stop_at)",
    ),
)

_EXPERTS = (
    _m(
        EXPERTS,
        "experts_index_of_n_experts_accepted",
        STREAMED_PY,
        "if flat.size and (flat.min() < 0 or flat.max() >= layer.n_experts):",
        "if flat.size and (flat.min() < 0 or flat.max() > layer.n_experts):",
    ),
    _m(
        EXPERTS,
        "experts_budget_at_the_minimum_refused",
        STREAMED_PY,
        "if budget < minimum:",
        "if budget <= minimum:",
    ),
    _m(
        EXPERTS,
        "experts_slots_max_instead_of_min",
        STREAMED_PY,
        "slots = min(total, low + int(spare * share // size))",
        "slots = max(total, low + int(spare * share // size))",
    ),
    _m(
        EXPERTS,
        "experts_reserve_past_the_minimum",
        STREAMED_PY,
        "reserved = min(2 * window + WRITE_SLOTS, slots - low)",
        "reserved = max(2 * window + WRITE_SLOTS, slots - low)",
    ),
    _m(
        EXPERTS,
        "experts_prefetches_of_other_layers_dropped",
        STREAMED_PY,
        "for key in [k for k in pool.inflight if layer.key_base <= k < end and k not in wanted]:",
        "for key in [k for k in pool.inflight if k not in wanted]:",
    ),
    _m(
        EXPERTS,
        "experts_uncached_protected_key_blocks_the_last_slot",
        POLICY_PY,
        "candidates[held[held >= 0]] = False",
        "candidates[held] = False",
    ),
    _m(
        EXPERTS,
        "experts_eviction_by_recency_before_hotness",
        POLICY_PY,
        "order = np.lexsort((slots, recent, hot))",
        "order = np.lexsort((slots, hot, recent))",
    ),
    _m(
        EXPERTS,
        "experts_evicted_key_still_looks_cached",
        POLICY_PY,
        "        if old >= 0:\n            self.key_slot[old] = -1\n",
        "",
    ),
    _m(
        EXPERTS,
        "experts_hotlist_expert_of_n_experts_accepted",
        STREAMED_PY,
        "or not 0 <= expert < layer.n_experts",
        "or not 0 <= expert <= layer.n_experts",
    ),
    _m(
        EXPERTS,
        "experts_hotlist_coldest_first",
        POLICY_PY,
        'order = np.argsort(-hot, kind="stable")[:limit]',
        'order = np.argsort(hot, kind="stable")[:limit]',
    ),
)

_GGUF = (
    _m(
        GGUF,
        "gguf_zero_dimensions_accepted",
        VALIDATE_PY,
        "if not 1 <= n_dims <= MAX_TENSOR_DIMS:",
        "if not 0 <= n_dims <= MAX_TENSOR_DIMS:",
    ),
    _m(
        GGUF,
        "gguf_unaligned_tensor_offset_accepted",
        VALIDATE_PY,
        "if info.relative_offset % alignment:",
        "if info.relative_offset % alignment and False:",
    ),
    _m(
        GGUF,
        "gguf_tensor_ending_at_eof_refused",
        VALIDATE_PY,
        "if start + nbytes > cursor.size:",
        "if start + nbytes >= cursor.size:",
    ),
)

MUTATIONS: tuple[Mutation, ...] = (
    *_AGENT,
    *_SERVER,
    *_CACHES,
    *_DECODING,
    *_SPECULATION,
    *_EXPERTS,
    *_GGUF,
)
