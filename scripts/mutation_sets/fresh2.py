"""The second fresh run (issue 37's follow-up): 52 plausible bugs chosen from the code alone,
none of them in the sets before it or named in the issue, each run against its area's tests."""

from __future__ import annotations

from mutation_sets.base import (
    CHECKPOINTS_PY,
    CHOICES_PY,
    CONVERSATIONS_PY,
    DSPARK_LAYOUT_PY,
    GENERATE_PY,
    GENERATION_PY,
    GGUF,
    GGUF_EDGES,
    LOOKUP_PY,
    OPENAI_CHAT_PY,
    PROMPT_INPUT_PY,
    SAMPLER,
    SAMPLING_PY,
    SCHEDULER,
    SCHEDULER_PY,
    SNAPSHOT_FILE_PY,
    VALIDATE_PY,
    WORKSPACE_PY,
    Mutation,
)

FRESH_SERVER = (
    "tests/server/test_access.py",
    "tests/server/test_bad_requests.py",
    "tests/server/test_server_guards.py",
    "tests/server/test_request_mapping.py",
    "tests/server/test_choices.py",
    "tests/server/test_request_edges.py",
)
FRESH_AGENT = (
    "tests/agent/test_agent_guards.py",
    "tests/agent/test_agent_tool_edges.py",
    "tests/agent/test_agent_safety.py",
    "tests/agent/test_agent_security.py",
    "tests/agent/test_agent_tools.py",
    "tests/agent/test_agent_conversations.py",
    "tests/agent/test_agent_prompt_input.py",
    "tests/robustness/test_agent_paths.py",
)
FRESH_KV = (
    "tests/engine/test_kv_snapshots.py",
    "tests/engine/test_prompt_cache.py",
    "tests/engine/test_prompt_cache_order.py",
    "tests/agent/test_agent_kv_state.py",
)
FRESH_SAMPLER = (*SAMPLER, "tests/server/test_penalties_cached.py")
FRESH_LOOKUP = ("tests/speculation/test_lookup.py",)
FRESH_DSPARK = ("tests/speculation/test_dspark_layout.py", "tests/speculation/test_dspark.py")
FRESH_GGUF = (*GGUF, *GGUF_EDGES, "tests/gguf/test_gguf_reader.py", "tests/gguf/test_gguf_fuzz.py")
FRESH_CONSTRAINED = ("tests/engine/test_constraints.py",)


def _fresh(area: tuple[str, ...], name: str, file: str, old: str, new: str) -> Mutation:
    return Mutation(name, file, old, new, area)


MUTATIONS: tuple[Mutation, ...] = (
    # --- server: access, request validation, n > 1, logprobs, streaming, the queue
    _fresh(
        FRESH_SERVER,
        "server_models_listing_open",
        "ds4mlx/server/access.py",
        'OPEN_PATHS = frozenset({"/health", "/v1/health"})',
        'OPEN_PATHS = frozenset({"/health", "/v1/health", "/v1/models"})',
    ),
    _fresh(
        FRESH_SERVER,
        "server_required_with_empty_tools",
        GENERATION_PY,
        'if choice == "required" and not tools:',
        'if choice == "required" and tools is None:',
    ),
    _fresh(
        FRESH_SERVER,
        "server_top_p_zero_accepted",
        GENERATION_PY,
        "top_p: float | None = Field(None, gt=0.0, le=1.0)",
        "top_p: float | None = Field(None, ge=0.0, le=1.0)",
    ),
    _fresh(
        FRESH_SERVER,
        "server_min_p_one_accepted",
        GENERATION_PY,
        "min_p: float | None = Field(None, ge=0.0, lt=1.0)",
        "min_p: float | None = Field(None, ge=0.0, le=1.0)",
    ),
    _fresh(
        FRESH_SERVER,
        "server_unsigned_random_seed_kept",
        GENERATION_PY,
        "if self.seed in (-1, 0xFFFFFFFF):",
        "if self.seed == -1:",
    ),
    _fresh(
        FRESH_SERVER,
        "server_adaptive_thinking_off",
        GENERATION_PY,
        'return control.type != "disabled"',
        'return control.type == "enabled"',
    ),
    _fresh(
        FRESH_SERVER,
        "server_content_part_without_text",
        GENERATION_PY,
        "if part.type not in text_types or part.text is None:",
        "if part.type not in text_types:",
    ),
    _fresh(
        FRESH_SERVER,
        "server_n_zero_accepted",
        OPENAI_CHAT_PY,
        "n: int = Field(1, ge=1)",
        "n: int = Field(1, ge=0)",
    ),
    _fresh(
        FRESH_SERVER,
        "server_top_logprobs_without_logprobs",
        OPENAI_CHAT_PY,
        "if request.top_logprobs is not None and not request.logprobs:",
        "if request.top_logprobs is not None and request.logprobs is False:",
    ),
    _fresh(
        FRESH_SERVER,
        "server_logprobs_default_one_alternative",
        OPENAI_CHAT_PY,
        "(request.top_logprobs or 0) if request.logprobs else None",
        "(request.top_logprobs or 1) if request.logprobs else None",
    ),
    _fresh(
        FRESH_SERVER,
        "server_max_tokens_over_max_completion_tokens",
        OPENAI_CHAT_PY,
        "request.max_completion_tokens or request.max_tokens",
        "request.max_tokens or request.max_completion_tokens",
    ),
    _fresh(
        FRESH_SERVER,
        "server_stream_usage_unasked",
        OPENAI_CHAT_PY,
        "bool(request.stream_options and request.stream_options.include_usage)",
        "bool(request.stream_options)",
    ),
    _fresh(
        FRESH_SERVER,
        "server_stream_last_logprobs_dropped",
        OPENAI_CHAT_PY,
        "        if self.pending_logprobs:\n            frames.append(",
        "        if not self.pending_logprobs:\n            frames.append(",
    ),
    _fresh(
        FRESH_SERVER,
        "server_choices_share_one_seed",
        CHOICES_PY,
        "(seed + index) % SEED_MODULUS",
        "seed % SEED_MODULUS",
    ),
    _fresh(
        FRESH_SERVER,
        "server_choices_usage_counts_the_first",
        CHOICES_PY,
        "completion_tokens=sum(f.completion_tokens for f in finished)",
        "completion_tokens=first.completion_tokens",
    ),
    _fresh(
        (*FRESH_SERVER, "tests/server/test_batched_sessions.py"),
        "server_queue_admits_one_too_many",
        "ds4mlx/server/queue.py",
        "while self._waiting and len(admitted) < room:",
        "while self._waiting and len(admitted) <= room:",
    ),
    # --- constrained output and tool calls
    _fresh(
        FRESH_CONSTRAINED,
        "constrained_duplicate_tool_names",
        "ds4mlx/engine/chat/call_grammar.py",
        "if not all(names) or len(set(names)) != len(names):",
        "if not all(names):",
    ),
    _fresh(
        FRESH_CONSTRAINED,
        "constrained_forced_call_arguments_free",
        "ds4mlx/engine/chat/call_grammar.py",
        "bound = forced or is_strict(tool)",
        "bound = is_strict(tool)",
    ),
    _fresh(
        FRESH_CONSTRAINED,
        "constrained_glm_parallel_flag_inverted",
        "ds4mlx/engine/chat/glm5.py",
        'more_calls = " more_calls" if parallel else ""',
        'more_calls = " more_calls" if not parallel else ""',
    ),
    # --- agent: confinement, undo, history files
    _fresh(
        FRESH_AGENT,
        "agent_name_of_255_bytes_refused",
        WORKSPACE_PY,
        "> MAX_NAME_BYTES for part in parts",
        ">= MAX_NAME_BYTES for part in parts",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_gitignore_negation_ignored",
        WORKSPACE_PY,
        "if result.include is not None:\n                ignored = result.include",
        "if result.include:\n                ignored = True",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_prefix_rule_covers_home",
        "ds4mlx/agent/permissions.py",
        r'_SHELL_SYNTAX = re.compile(r"[;&|<>`$(){}\n\r\\*?\[\]!#~]")',
        r'_SHELL_SYNTAX = re.compile(r"[;&|<>`$(){}\n\r\\*?\[\]!#]")',
    ),
    _fresh(
        FRESH_AGENT,
        "agent_undo_takes_the_oldest_prompt",
        CHECKPOINTS_PY,
        "checkpoint = self.stack.pop()",
        "checkpoint = self.stack.pop(0)",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_bash_deletion_not_reported",
        CHECKPOINTS_PY,
        "if path not in checkpoint.originals and after.get(path) != state",
        "if path not in checkpoint.originals and after.get(path, state) != state",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_history_file_readable_by_others",
        PROMPT_INPUT_PY,
        "os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)",
        "os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_history_keeps_the_oldest",
        PROMPT_INPUT_PY,
        "del self.entries[:-MAX_HISTORY]",
        "del self.entries[MAX_HISTORY:]",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_fresh_conversation_temporary_removed",
        CONVERSATIONS_PY,
        "if now - path.stat().st_mtime > _STALE_TEMPORARY_SECONDS:",
        "if now - path.stat().st_mtime < _STALE_TEMPORARY_SECONDS:",
    ),
    _fresh(
        FRESH_AGENT,
        "agent_continue_ignores_the_workspace",
        CONVERSATIONS_PY,
        "if not saved.problem and saved.workspace == workspace:",
        "if not saved.problem:",
    ),
    # --- disk KV files
    _fresh(
        FRESH_KV,
        "kvfile_trailing_bytes_accepted",
        SNAPSHOT_FILE_PY,
        "if 8 + length + end != size:",
        "if 8 + length + end > size:",
    ),
    _fresh(
        FRESH_KV,
        "kvfile_missing_version_accepted",
        SNAPSHOT_FILE_PY,
        'if metadata.get("version") != str(FORMAT_VERSION):',
        'if metadata.get("version", str(FORMAT_VERSION)) != str(FORMAT_VERSION):',
    ),
    _fresh(
        FRESH_KV,
        "kvfile_fingerprint_ignores_weights_dtype",
        SNAPSHOT_FILE_PY,
        "{model.gguf.arch} {model.weights_dtype} ",
        "{model.gguf.arch} ",
    ),
    _fresh(
        FRESH_KV,
        "kvfile_checksum_skips_the_tokens",
        SNAPSHOT_FILE_PY,
        'json.dumps({k: v for k, v in metadata.items() if k != "checksum"}, sort_keys=True)',
        'json.dumps({k: v for k, v in metadata.items() if k not in ("checksum", "tokens")}, '
        "sort_keys=True)",
    ),
    # --- sampling
    _fresh(
        FRESH_SAMPLER,
        "sampling_penalty_window_from_the_start",
        SAMPLING_PY,
        "mx.array([*recent, *draft[:i]][-o.repeat_last_n :], dtype=mx.int32)",
        "mx.array([*recent, *draft[:i]][: o.repeat_last_n], dtype=mx.int32)",
    ),
    _fresh(
        FRESH_SAMPLER,
        "sampling_duplicate_logit_bias_ids",
        SAMPLING_PY,
        "if any(token < 0 for token in ids) or len(set(ids)) != len(ids):",
        "if any(token < 0 for token in ids):",
    ),
    _fresh(
        FRESH_SAMPLER,
        "sampling_logprobs_one_alternative_short",
        SAMPLING_PY,
        "best = mx.argpartition(-logprobs, top - 1, axis=-1)[:, :top]",
        "best = mx.argpartition(-logprobs, top - 1, axis=-1)[:, : top - 1]",
    ),
    _fresh(
        FRESH_SAMPLER,
        "sampling_masked_alternatives_listed",
        SAMPLING_PY,
        'top = tuple((int(i), float(v)) for i, v in pairs if v != float("-inf"))',
        "top = tuple((int(i), float(v)) for i, v in pairs)",
    ),
    _fresh(
        FRESH_SAMPLER,
        "sampling_cached_prompt_not_penalised",
        GENERATE_PY,
        "    sampler.record(session.tokens[-sampler.options.repeat_last_n :])\n",
        "",
    ),
    # --- lookup drafting
    _fresh(
        FRESH_LOOKUP,
        "lookup_shortest_ngram_dropped",
        LOOKUP_PY,
        "self.sizes = range(max_n, min_n - 1, -1)",
        "self.sizes = range(max_n, min_n, -1)",
    ),
    _fresh(
        FRESH_LOOKUP,
        "lookup_keeps_the_first_occurrence",
        LOOKUP_PY,
        "self._next[tuple(self.tokens[end - n :])] = end",
        "self._next.setdefault(tuple(self.tokens[end - n :]), end)",
    ),
    _fresh(
        FRESH_LOOKUP,
        "lookup_draft_past_its_cap",
        LOOKUP_PY,
        "n = min(max_tokens, self.max_draft)",
        "n = max(max_tokens, self.max_draft)",
    ),
    _fresh(
        FRESH_LOOKUP,
        "lookup_strong_match_strict",
        LOOKUP_PY,
        "self.lookup.last_match >= self.min_match",
        "self.lookup.last_match > self.min_match",
    ),
    # --- DSpark files
    _fresh(
        FRESH_DSPARK,
        "dspark_d2t_may_name_the_vocabulary_size",
        DSPARK_LAYOUT_PY,
        "d2t.max() >= args.vocab_size",
        "d2t.max() > args.vocab_size",
    ),
    _fresh(
        FRESH_DSPARK,
        "dspark_target_layers_not_shifted",
        DSPARK_LAYOUT_PY,
        "int(t) - 1 if int(t) > 0 else EMBEDDING_TAP",
        "int(t) if int(t) > 0 else EMBEDDING_TAP",
    ),
    _fresh(
        FRESH_DSPARK,
        "dspark_one_token_block_without_anchor",
        DSPARK_LAYOUT_PY,
        "if not config.sample_from_anchor and config.block_size < 2:",
        "if not config.sample_from_anchor and config.block_size < 1:",
    ),
    # --- the speculation scheduler's cost rule
    _fresh(
        SCHEDULER,
        "scheduler_cost_pause_never_grows",
        SCHEDULER_PY,
        "costs.next_pause = min(2 * costs.next_pause, MAX_COST_PAUSE)",
        "costs.next_pause = min(costs.next_pause, MAX_COST_PAUSE)",
    ),
    _fresh(
        SCHEDULER,
        "scheduler_cost_margin_subtracted",
        SCHEDULER_PY,
        "most = plain.per_token * (1 + COST_MARGIN)",
        "most = plain.per_token * (1 - COST_MARGIN)",
    ),
    _fresh(
        SCHEDULER,
        "scheduler_outlier_not_clipped",
        SCHEDULER_PY,
        "seconds = min(seconds, COST_OUTLIER * self.seconds / self.weight)",
        "seconds = max(seconds, COST_OUTLIER * self.seconds / self.weight)",
    ),
    _fresh(
        SCHEDULER,
        "scheduler_stale_plain_cost_trusted",
        SCHEDULER_PY,
        "if not self._plain_measured:",
        "if self._plain_measured:",
    ),
    # --- GGUF validation
    _fresh(
        FRESH_GGUF,
        "gguf_name_of_the_limit_refused",
        VALIDATE_PY,
        "if length > MAX_NAME_BYTES:",
        "if length >= MAX_NAME_BYTES:",
    ),
    _fresh(
        FRESH_GGUF,
        "gguf_tensor_offset_aligned_to_32",
        VALIDATE_PY,
        "if info.relative_offset % alignment:",
        "if info.relative_offset % 32:",
    ),
    _fresh(
        FRESH_GGUF,
        "gguf_arrays_one_level_deeper",
        VALIDATE_PY,
        "if depth >= MAX_ARRAY_NESTING:",
        "if depth > MAX_ARRAY_NESTING:",
    ),
    _fresh(
        FRESH_GGUF,
        "gguf_reserved_kv_count_key_accepted",
        VALIDATE_PY,
        'RESERVED_KEYS = frozenset({"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"})',
        'RESERVED_KEYS = frozenset({"GGUF.version", "GGUF.tensor_count"})',
    ),
)
