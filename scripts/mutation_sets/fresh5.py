"""The fifth fresh run (issue 37's acceptance: "a fresh mutation run, with mutations this issue
does not name, catches >= 90 %"). Plausible one-line bugs in guard code (off-by-ones, flipped
comparisons, an element dropped from a set or tuple, a wrong default or constant, swapped sort
keys, a missing early return, a counter not incremented), written from the code alone: the
agent, the server, the KV cache, constraints, sampling, the chat templates, speculation, the
expert stores and GGUF, read before any test and without looking at the tests written for
issue 37 meanwhile; no behaviour the issue lists is mutated.

Written: 179. Left out: 72 exact duplicates of earlier sets' mutations (the same file after the
change), 8 near duplicates (another spelling with the same effect, or a bug an earlier
mutation's test must catch: e.g. ``token_id < 0`` dropped where an earlier set lets -1 through),
2 equivalent mutants (``_TRUSTED_PREFIX`` without its dot: a module outside ds4mlx still fails
to import, with the same error; missing dataclass fields accepted: the KeyError that follows
becomes the same ``SnapshotFileError`` where files are read), and 15 drawn at random
(``random.Random(5)``) from the areas over the brief's shares. The 82 left: agent 20, server 18,
KV cache 8, constraints 6, sampling 4, templates 5, speculation 8, experts 8, GGUF 5.

Test selection, mechanical rather than chosen per mutation: the whole ``tests/`` folder of the
mutated code's package (``tests/agent``, ``tests/server``, ``tests/engine`` for the KV cache,
constraints, sampling and templates, ``tests/speculation``, ``tests/experts``, ``tests/gguf``),
with ``-x``. A test elsewhere (``tests/robustness``, or a template checked only through the
server) does not count: the issue asks for the guarding test in the folder of the code.
Whole folders, measured unmutated on the shared 2-core machine (load 5 to 14): agent 185 s,
server 514 s, engine 241 s, speculation 332 s, experts 143 s, GGUF 31 s; the run is at most
about 6 h (every mutation through its whole folder) and, with ``-x`` ending caught ones early,
about 3 to 4 h at that load.
"""

from __future__ import annotations

from mutation_sets.base import (
    ANTHROPIC_PY,
    CHOICES_PY,
    COMPLETIONS_PY,
    CONSTRAINTS_PY,
    DEEPSEEK4_CHAT_PY,
    DSPARK_LAYOUT_PY,
    ERRORS_PY,
    EXPERT_OPTIONS_PY,
    EXPERT_READER_PY,
    GENERATION_PY,
    GLM5_CHAT_PY,
    JOBS_PY,
    KV_STATE_PY,
    LIMITS_PY,
    LOOKUP_PY,
    MARKUP_PY,
    MENTIONS_PY,
    METRICS_PY,
    OPENAI_CHAT_PY,
    POLICY_PY,
    PROMPT_CACHE_PY,
    PROMPT_INPUT_PY,
    QUEUE_PY,
    SAMPLING_PY,
    SCHEDULER_PY,
    STATE_CODEC_PY,
    STORE_PY,
    STREAMED_PY,
    SUPPORT_GGUF_PY,
    TOOLS_PY,
    UTILITY_PY,
    VALIDATE_PY,
    WORKSPACE_PY,
    WRITER_PY,
    Mutation,
)
from mutation_sets.base import in_agent_folder as _agent
from mutation_sets.base import in_engine_folder as _engine
from mutation_sets.base import in_experts_folder as _experts
from mutation_sets.base import in_gguf_folder as _gguf
from mutation_sets.base import in_server_folder as _server
from mutation_sets.base import in_speculation_folder as _speculation

_AGENT = (
    _agent(
        "workspace_tilde_only_with_slash",
        WORKSPACE_PY,
        'if text.startswith("~"):',
        'if text.startswith("~/"):',
    ),
    _agent(
        "workspace_lists_dangling_links",
        WORKSPACE_PY,
        "return target.exists() and target.is_relative_to(self.root)",
        "return target.is_relative_to(self.root)",
    ),
    _agent(
        "workspace_outer_gitignore_overrides_inner",
        WORKSPACE_PY,
        "for folder in reversed(start.parents):",
        "for folder in start.parents:",
    ),
    _agent(
        "jobs_omitted_marker_always",
        JOBS_PY,
        "if omitted > 0:",
        "if omitted >= 0:",
    ),
    _agent(
        "jobs_timed_out_reports_leftovers",
        JOBS_PY,
        "leftovers = not (timed_out or cancelled)",
        "leftovers = True",
    ),
    _agent(
        "jobs_cancelled_keeps_exit_code",
        JOBS_PY,
        "None if stopped else handle.process.returncode",
        "None if timed_out else handle.process.returncode",
    ),
    _agent(
        "mentions_parenthesis_not_an_opener",
        MENTIONS_PY,
        r"""MENTION = re.compile(r"(?:(?<=[\s(\[{\"'])|^)@(\S+)")""",
        r"""MENTION = re.compile(r"(?:(?<=[\s\[{\"'])|^)@(\S+)")""",
    ),
    _agent(
        "mentions_colon_kept_in_path",
        MENTIONS_PY,
        """_TRAILING = ".,;:!?)]}\\"'\"""",
        """_TRAILING = ".,;!?)]}\\"'\"""",
    ),
    _agent(
        "mentions_completion_never_hidden_files",
        MENTIONS_PY,
        'and (name_part.startswith(".") or not entry.name.startswith("."))',
        'and not entry.name.startswith(".")',
    ),
    _agent(
        "tools_read_empty_file_refused",
        TOOLS_PY,
        "if lines and start > len(lines):",
        "if start > len(lines):",
    ),
    _agent(
        "tools_integer_refuses_negative_string",
        TOOLS_PY,
        r're.fullmatch(r"\s*-?\d+\s*", value)',
        r're.fullmatch(r"\s*\d+\s*", value)',
    ),
    _agent(
        "tools_string_accepts_bool",
        TOOLS_PY,
        "if isinstance(value, (int, float)) and not isinstance(value, bool):\n        return str(",
        "if isinstance(value, (int, float)):\n        return str(",
    ),
    _agent(
        "tools_walk_one_entry_too_many",
        TOOLS_PY,
        "if count >= MAX_WALK_ENTRIES:",
        "if count > MAX_WALK_ENTRIES:",
    ),
    _agent(
        "tools_describe_cuts_a_line_that_fits",
        TOOLS_PY,
        "len(line) <= width else",
        "len(line) < width else",
    ),
    _agent(
        "workspace_hides_every_git_prefixed_name",
        WORKSPACE_PY,
        'if entry.name == ".git" or self._ignored(path, is_folder, rules):',
        'if entry.name.startswith(".git") or self._ignored(path, is_folder, rules):',
    ),
    _agent(
        "tools_more_takes_a_negative_count",
        TOOLS_PY,
        "count = count if count and count > 0 else self.read_lines",
        "count = count if count else self.read_lines",
    ),
    _agent(
        "prompt_history_keeps_repeated_prompts",
        PROMPT_INPUT_PY,
        "if prompt and (not self.entries or self.entries[-1] != prompt):",
        "if prompt:",
    ),
    _agent(
        "prompt_history_keeps_the_oldest",
        PROMPT_INPUT_PY,
        "return entries[-MAX_HISTORY:]",
        "return entries[:MAX_HISTORY]",
    ),
    _agent(
        "markup_holds_back_one_character_too_few",
        MARKUP_PY,
        "longest = max(map(len, _OPENERS)) - 1",
        "longest = max(map(len, _OPENERS)) - 2",
    ),
    _agent(
        "kv_state_saved_while_a_turn_runs",
        KV_STATE_PY,
        "if name is None or not self._usable(agent) or agent.running:",
        "if name is None or not self._usable(agent):",
    ),
)

_SERVER = (
    _server(
        "limits_penalty_window_not_clamped",
        LIMITS_PY,
        "return dataclasses.replace(sampling, repeat_last_n=self.max_context)",
        "return sampling",
    ),
    _server(
        "choices_seconds_summed",
        CHOICES_PY,
        "seconds=max(f.seconds for f in finished),",
        "seconds=sum(f.seconds for f in finished),",
    ),
    _server(
        "generation_tool_results_not_counted",
        GENERATION_PY,
        'if message.get("role") in ("system", "user", "tool"):',
        'if message.get("role") in ("system", "user"):',
    ),
    _server(
        "generation_seed_upper_bound_int63",
        GENERATION_PY,
        "seed: int | None = Field(None, ge=-1, le=2**64 - 1)",
        "seed: int | None = Field(None, ge=-1, le=2**63 - 1)",
    ),
    _server(
        "chat_empty_messages_accepted",
        OPENAI_CHAT_PY,
        "messages: list[ChatMessage] = Field(min_length=1)",
        "messages: list[ChatMessage] = Field(min_length=0)",
    ),
    _server(
        "chat_max_tokens_zero_accepted",
        OPENAI_CHAT_PY,
        "    max_tokens: int | None = Field(None, ge=1)\n    max_completion_tokens",
        "    max_tokens: int | None = Field(None, ge=0)\n    max_completion_tokens",
    ),
    _server(
        "chat_top_logprobs_zero_refused",
        OPENAI_CHAT_PY,
        "top_logprobs: int | None = Field(None, ge=0, le=20)",
        "top_logprobs: int | None = Field(None, ge=1, le=20)",
    ),
    _server(
        "chat_logprobs_without_top_logprobs_dropped",
        OPENAI_CHAT_PY,
        "(request.top_logprobs or 0) if request.logprobs else None,",
        "request.top_logprobs if request.logprobs else None,",
    ),
    _server(
        "messages_max_tokens_zero_accepted",
        ANTHROPIC_PY,
        "max_tokens: int = Field(ge=1)",
        "max_tokens: int = Field(ge=0)",
    ),
    _server(
        "messages_empty_messages_accepted",
        ANTHROPIC_PY,
        "messages: list[Message] = Field(min_length=1)",
        "messages: list[Message] = Field(min_length=0)",
    ),
    _server(
        "messages_custom_tool_type_refused",
        ANTHROPIC_PY,
        'if tool.type not in (None, "custom") or tool.input_schema is None:',
        "if tool.type is not None or tool.input_schema is None:",
    ),
    _server(
        "completions_empty_prompt_list_accepted",
        COMPLETIONS_PY,
        "if len(prompt) != 1:",
        "if len(prompt) > 1:",
    ),
    _server(
        "completions_logprobs_capped_at_five",
        COMPLETIONS_PY,
        "logprobs: int | None = Field(None, ge=0, le=20)",
        "logprobs: int | None = Field(None, ge=0, le=5)",
    ),
    _server(
        "completions_zero_choices_accepted",
        COMPLETIONS_PY,
        "    n: int = Field(1, ge=1)\n    best_of",
        "    n: int = Field(1, ge=0)\n    best_of",
    ),
    _server(
        "utility_partial_utf8_piece_as_text",
        UTILITY_PY,
        "            return list(raw)",
        '            return raw.decode("utf-8", "replace")',
    ),
    _server(
        "queue_refused_jobs_stay_queued",
        QUEUE_PY,
        "self._stats.queued -= len(admitted) + len(refused)",
        "self._stats.queued -= len(admitted)",
    ),
    _server(
        "errors_500_not_a_server_fault",
        ERRORS_PY,
        "return self.status >= 500",
        "return self.status > 500",
    ),
    _server(
        "metrics_first_token_times_not_counted",
        METRICS_PY,
        "            self.ttft_count += 1\n",
        "",
    ),
)

_KVCACHE = (
    _engine(
        "prompt_cache_indexes_other_models_files",
        PROMPT_CACHE_PY,
        '"quantization"\n                )\n                continue\n',
        '"quantization"\n                )\n',
    ),
    _engine(
        "prompt_cache_write_failure_warned_once_forever",
        PROMPT_CACHE_PY,
        "        self._write_failing = False\n        self._index[snapshot.tokens] = path",
        "        self._index[snapshot.tokens] = path",
    ),
    _engine(
        "prompt_cache_disk_hit_not_kept_in_memory",
        PROMPT_CACHE_PY,
        "        if snapshot is not None:\n            self.memory.put(snapshot)\n",
        "",
    ),
    _engine(
        "prompt_cache_disk_before_memory_on_a_tie",
        PROMPT_CACHE_PY,
        "key=lambda c: (-c.share, c.cut, c.on_disk)",
        "key=lambda c: (-c.share, c.on_disk, c.cut)",
    ),
    _engine(
        "prompt_cache_underestimated_write_not_evicted",
        PROMPT_CACHE_PY,
        "the budget still holds\n            self._evict(self.budget)\n",
        "the budget still holds\n            pass\n",
    ),
    _engine(
        "state_codec_tuples_come_back_as_lists",
        STATE_CODEC_PY,
        'return {"tuple": [walk(item) for item in obj]}',
        'return {"list": [walk(item) for item in obj]}',
    ),
    _engine(
        "state_codec_integer_keys_saved",
        STATE_CODEC_PY,
        "if not all(isinstance(key, str) for key in obj):",
        "if not all(isinstance(key, (str, int)) for key in obj):",
    ),
    _engine(
        "prompt_cache_evicted_files_stay_indexed",
        PROMPT_CACHE_PY,
        "self._index = {tokens: path for tokens, path in self._index.items() if path.exists()}",
        "pass",
    ),
)

_CONSTRAINTS = (
    _engine(
        "constraints_draft_skips_a_forbidden_token",
        CONSTRAINTS_PY,
        "            if mask is not None and not bool(mask[token]):\n                break",
        "            if mask is not None and not bool(mask[token]):\n                continue",
    ),
    _engine(
        "constraints_masks_along_misses_the_bonus_row",
        CONSTRAINTS_PY,
        "            self.advance(token)\n        masks.append(self.mask())\n",
        "            self.advance(token)\n",
    ),
    _engine(
        "constraints_opening_token_any_starting_with_marker",
        CONSTRAINTS_PY,
        "if pieces[token] == marker.encode())",
        "if pieces[token].startswith(marker.encode()))",
    ),
    _engine(
        "constraints_reasoning_end_only_at_the_end",
        CONSTRAINTS_PY,
        "if self._reasoning_end in self._tail:",
        "if self._tail.endswith(self._reasoning_end):",
    ),
    _engine(
        "constraints_grammar_tokenizes_special_text",
        CONSTRAINTS_PY,
        "return self._tokenizer.encode(text, parse_special=False)",
        "return self._tokenizer.encode(text, parse_special=True)",
    ),
    _engine(
        "constraints_openers_contain_the_prefix_anywhere",
        CONSTRAINTS_PY,
        "if opening and opens_after and piece.endswith(opens_after.encode())",
        "if opening and opens_after and opens_after.encode() in piece",
    ),
)

_SAMPLING = (
    _engine(
        "sampling_logprobs_max_refused",
        SAMPLING_PY,
        "not 0 <= self.logprobs <= MAX_TOP_LOGPROBS",
        "not 0 <= self.logprobs < MAX_TOP_LOGPROBS",
    ),
    _engine(
        "sampling_frequency_and_presence_swapped",
        SAMPLING_PY,
        "penalties = penalties - counts * o.frequency_penalty - o.presence_penalty",
        "penalties = penalties - counts * o.presence_penalty - o.frequency_penalty",
    ),
    _engine(
        "sampling_padded_vocabulary_not_masked",
        SAMPLING_PY,
        "    if pad > 0:\n        mask = mx.pad(",
        "    if pad < 0:\n        mask = mx.pad(",
    ),
    _engine(
        "sampling_min_p_one_accepted",
        SAMPLING_PY,
        "if not 0.0 <= self.min_p < 1.0:",
        "if not 0.0 <= self.min_p <= 1.0:",
    ),
)

_TEMPLATES = (
    _engine(
        "deepseek4_last_developer_message_dropped",
        DEEPSEEK4_CHAT_PY,
        'if turn.role != "developer" or index >= last_user',
        'if turn.role != "developer" or index > last_user',
    ),
    _engine(
        "deepseek4_max_effort_without_thinking",
        DEEPSEEK4_CHAT_PY,
        'if turns and thinking and reasoning_effort == "max":',
        'if turns and reasoning_effort == "max":',
    ),
    _engine(
        "glm5_strict_key_rendered",
        GLM5_CHAT_PY,
        'if k not in ("defer_loading", "strict")',
        'if k not in ("defer_loading",)',
    ),
    _engine(
        "deepseek4_forced_call_keeps_thinking",
        DEEPSEEK4_CHAT_PY,
        "        thinking = thinking and not forced\n        turns = _preprocess(messages, tools)",
        "        turns = _preprocess(messages, tools)",
    ),
    _engine(
        "glm5_answer_not_stripped",
        GLM5_CHAT_PY,
        "out.caller(content.strip())",
        "out.caller(content)",
    ),
)

_SPECULATION = (
    _speculation(
        "lookup_extension_max_draft_is_the_shorter",
        LOOKUP_PY,
        "self.max_draft = max(learned.max_draft, lookup.max_draft)",
        "self.max_draft = min(learned.max_draft, lookup.max_draft)",
    ),
    _speculation(
        "dspark_largest_block_refused",
        DSPARK_LAYOUT_PY,
        "if not 1 <= config.block_size <= MAX_BLOCK_SIZE:",
        "if not 1 <= config.block_size < MAX_BLOCK_SIZE:",
    ),
    _speculation(
        "support_empty_tokenizer_arrays_copied",
        SUPPORT_GGUF_PY,
        'if key.startswith("tokenizer.") and value != []:',
        'if key.startswith("tokenizer."):',
    ),
    _speculation(
        "lookup_repeating_copy_off_by_one",
        LOOKUP_PY,
        "copied[i - end - 1]",
        "copied[i - end]",
    ),
    _speculation(
        "scheduler_cost_pause_halves_below_its_floor",
        SCHEDULER_PY,
        "costs.next_pause = max(COST_PAUSE, costs.next_pause // 2)",
        "costs.next_pause = costs.next_pause // 2",
    ),
    _speculation(
        "scheduler_cost_pause_grows_without_cap",
        SCHEDULER_PY,
        "costs.next_pause = min(2 * costs.next_pause, MAX_COST_PAUSE)",
        "costs.next_pause = 2 * costs.next_pause",
    ),
    _speculation(
        "scheduler_no_draft_pauses_never_grow",
        SCHEDULER_PY,
        "            self._no_draft_streak += 1\n",
        "",
    ),
    _speculation(
        "scheduler_drafted_cycle_counted_as_no_draft",
        SCHEDULER_PY,
        "self.stats.drafted_cycles += 1",
        "self.stats.no_draft_cycles += 1",
    ),
)

_EXPERTS = (
    _experts(
        "policy_use_sequence_not_advanced",
        POLICY_PY,
        "        self._seq += 1\n",
        "",
    ),
    _experts(
        "options_infinite_cache_accepted",
        EXPERT_OPTIONS_PY,
        'if not value > 0 or value != value or value == float("inf"):',
        "if not value > 0 or value != value:",
    ),
    _experts(
        "options_hotlist_without_streaming_accepted",
        EXPERT_OPTIONS_PY,
        "if not self.stream and (self.cache_gib is not None or self.hotlist is not None):",
        "if not self.stream and self.cache_gib is not None:",
    ),
    _experts(
        "store_hit_rate_zero_before_any_step",
        STORE_PY,
        "return self.hits / total if total else 1.0",
        "return self.hits / total if total else 0.0",
    ),
    _experts(
        "streamed_all_experts_routed_refused",
        STREAMED_PY,
        "if not 0 < n_used <= layer.n_experts:",
        "if not 0 < n_used < layer.n_experts:",
    ),
    _experts(
        "streamed_routing_steps_not_counted",
        STREAMED_PY,
        "        self._stats.routing_steps += 1\n",
        "",
    ),
    _experts(
        "streamed_hotlist_warm_start_coldest_first",
        STREAMED_PY,
        "key=lambda s: -s[0])",
        "key=lambda s: s[0])",
    ),
    _experts(
        "reader_expert_index_n_experts_read",
        EXPERT_READER_PY,
        "if not 0 <= expert < tensor.n_experts:",
        "if not 0 <= expert <= tensor.n_experts:",
    ),
)

_GGUF = (
    _gguf(
        "validate_most_dimensions_refused",
        VALIDATE_PY,
        "if not 1 <= n_dims <= MAX_TENSOR_DIMS:",
        "if not 1 <= n_dims < MAX_TENSOR_DIMS:",
    ),
    _gguf(
        "writer_name_limit_in_characters",
        WRITER_PY,
        'if len(tensor.name.encode("utf-8")) > MAX_TENSOR_NAME_BYTES:',
        "if len(tensor.name) > MAX_TENSOR_NAME_BYTES:",
    ),
    _gguf(
        "writer_mixed_float_and_int_array_refused",
        WRITER_PY,
        "if kinds == {V.FLOAT32} or kinds == {V.FLOAT32, V.UINT32}:",
        "if kinds == {V.FLOAT32}:",
    ),
    _gguf(
        "writer_unsigned_values_refused",
        WRITER_PY,
        'if values.dtype.kind not in "iu"',
        'if values.dtype.kind not in "i"',
    ),
    _gguf(
        "validate_largest_element_count_refused",
        VALIDATE_PY,
        "if n_elements > INT64_MAX:",
        "if n_elements >= INT64_MAX:",
    ),
)

MUTATIONS: tuple[Mutation, ...] = (
    *_AGENT,
    *_SERVER,
    *_KVCACHE,
    *_CONSTRAINTS,
    *_SAMPLING,
    *_TEMPLATES,
    *_SPECULATION,
    *_EXPERTS,
    *_GGUF,
)
