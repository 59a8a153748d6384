"""The seventh fresh run (issue 37's acceptance: "a fresh mutation run next time, with mutations
this issue does not name, catches >= 90 %"). Plausible one-line bugs in guard and logic code
(off-by-ones, flipped comparisons, an element dropped from a set or tuple, a wrong default or
constant, swapped values, a missing early return, a counter not incremented, a wrong key),
written from the code alone, without opening anything under ``tests/``, in the code earlier
sets touched least: the agent's symbols, display, model states, project instructions, mentions,
files, tools, prompt history, conversations and permissions; the server's chat, completions,
responses and messages adapters, utility routes and app; the engine's generation loop, session,
tokenizer, chat helpers, call grammar, prompt cache, state codec and sampling options; the
speculation config, probe, NextN and MTP drafters; the expert options, store, resident store,
policy and reader; the GGUF writer and quants; the command-line options (a first: their tests
are ``tests/cli``). No behaviour issue 37 lists is mutated (clip and bounded-output splits, undo
of two edits, LRU order, fingerprints in file names, the staging room, fields ending at end of
file, the data section's alignment, special tokens kept as text, permission prefixes,
confinement, access keys and body limits).

Checked against every earlier set (core, guards, fresh2 to fresh6) by a script that applies
each mutation here and each earlier one to today's code: no mutation here gives the same file as
an earlier one, none changes a line an earlier mutation changes, and no two here share a line.

Left out while writing, of the candidates read off the code:
- Exact duplicates: none (the script found none; lines earlier sets change were skipped).
- Near duplicates, 2: ``with_logprobs`` taking a top of 0 as none (``logprobs`` true without
  ``top_logprobs`` gives nothing: fresh5's ``chat_logprobs_without_top_logprobs_dropped``); the
  memory tier's ``drop`` not giving back its bytes (``put`` is its only caller, so a replaced
  entry counts twice: fresh3's ``kvcache_replaced_entry_counted_twice``). Also kept only one of
  the two ``1 <= MIN <= MAX`` n-gram checks (the command line's; ``SpeculationConfig``'s refuses
  the same configurations behind it).
- Equivalent or as good as equivalent, 5: ``parse_cache_budget`` stripping "g" before "gib"
  (the same value for every spelling but "12gibg"); the app's ``except ValueError`` as
  ``TypeError`` (no ``endpoint.call`` raises a bare ValueError today: sampling errors are
  turned into APIError before); the writer's alignment check without ``<= 0`` and its shape
  check from 0 dims (ggml's own checks behind them refuse the same with another ValueError,
  run here: same exception, no file written); the MTP margin test as ``< 0`` (a gap is never
  negative).
- Others as weaker or to keep the brief's shares (agent 20 %, server 20 %, engine 25 %,
  speculation 10 %, experts 10 %, GGUF 8 %, CLI 7 %), e.g. a C symbol's end line, C1 controls
  as \\u escapes, the mention line count, /switch restoring a missing state, Down on the last
  line, the keep-alive counted as first output.

The 86 written: agent 18, server 16, engine 22, speculation 8, experts 8, GGUF 7, CLI 7. Each
applies (``--list``) and was reasoned to change what the code does. The doubtful ones were run
with and without the change (a copy of the package with the mutation applied); each behaved
differently:
- ``symbols_c_forward_declarations_listed``: ``struct foo;`` listed beside its definition;
- ``prompt_history_draft_overwritten_while_walking_back``: up, up, down, down ends at "b", not
  the draft;
- ``conversations_one_valid_message_enough``: a list holding a string loads;
- ``instructions_of_exactly_the_limit_cut``: a file of exactly 16 000 characters is cut;
- ``call_grammar_empty_properties_allow_no_arguments``: ``properties: {}`` gives [] not None;
- ``policy_set_hotness_decays_from_the_old_clock``: 0.25 for 2.0 set after 3 ticks (a hot-list
  loaded before any step, at clock 0, is not affected);
- ``state_codec_trusted_prefix_without_its_dot``: ``ds4mlxevil`` is imported (and fails as
  "no longer exists") instead of refused as outside ds4mlx;
- ``expert_cache_budget_case_sensitive``: "12GiB" refused;
- ``writer_int_list_written_unsigned``: [1, 2] as UINT32;
- ``writer_alignment_key_accepted_in_metadata``, ``writer_64_byte_tensor_name_accepted``,
  ``writer_float_infinity_refused``, ``writer_integer_maximum_refused``;
- ``tools_write_to_a_blank_path``: a file named "  " is written;
- ``tools_unknown_job_raises_key_error``: KeyError out of ``run``;
- ``responses_assistant_items_merge_across_a_user_message``: one assistant message "AUB";
- ``prompt_caller_characters_count_the_template``: 3 for 5.
The set itself was not run here.

Test selection as in fresh5 and fresh6 (``base.in_*_folder``), mechanical rather than chosen
per mutation: the whole ``tests/`` folder of the mutated code's package (``tests/agent``,
``tests/server``, ``tests/engine`` for the engine with its chat templates and KV cache,
``tests/speculation``, ``tests/experts``, ``tests/gguf``, ``tests/cli``), with ``-x``. A test
elsewhere does not count: the issue asks for the guarding test in the folder of the code.
"""

from __future__ import annotations

from mutation_sets.base import (
    ANTHROPIC_PY,
    APP_PY,
    CALL_GRAMMAR_PY,
    CHAT_BASE_PY,
    CLI_OPTIONS_PY,
    COMPLETIONS_PY,
    CONVERSATIONS_PY,
    EXPERT_OPTIONS_PY,
    EXPERT_READER_PY,
    FILES_PY,
    GENERATE_PY,
    KV_OPTIONS_PY,
    KV_STATE_PY,
    MENTIONS_PY,
    NEXTN_PY,
    OPENAI_CHAT_PY,
    PERMISSIONS_PY,
    POLICY_PY,
    PROBE_PY,
    PROMPT_CACHE_PY,
    PROMPT_INPUT_PY,
    PROMPT_PY,
    PROMPT_SOURCE_PY,
    RESPONSES_PY,
    SAMPLING_PY,
    SESSION_PY,
    SPECULATION_CONFIG_PY,
    STATE_CODEC_PY,
    STORE_PY,
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

SYMBOLS_PY = "ds4mlx/agent/symbols.py"
DISPLAY_PY = "ds4mlx/agent/display.py"
INSTRUCTIONS_PY = "ds4mlx/agent/instructions.py"
MTP_PY = "ds4mlx/speculation/mtp.py"
RESIDENT_PY = "ds4mlx/experts/resident.py"
QUANTS_PY = "ds4mlx/gguf/quants.py"

_AGENT = (
    _agent(
        "symbols_nested_definitions_at_the_same_depth",
        SYMBOLS_PY,
        "yield from _definitions(child, language, depth + 1, cancelled)",
        "yield from _definitions(child, language, depth, cancelled)",
    ),
    _agent(
        "symbols_c_forward_declarations_listed",
        SYMBOLS_PY,
        "return _text(name) if name is not None and has_body else None",
        "return _text(name) if name is not None else None",
    ),
    _agent(
        "display_delete_character_passes",
        DISPLAY_PY,
        "\\x7f-\\x9f",
        "\\x80-\\x9f",
    ),
    _agent(
        "kv_state_invalidate_keeps_the_state",
        KV_STATE_PY,
        "        if agent.conversation.name is not None:\n",
        "        if agent.conversation.name is None:\n",
    ),
    _agent(
        "instructions_claude_md_before_agents_md",
        INSTRUCTIONS_PY,
        'INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md")',
        'INSTRUCTION_FILES = ("CLAUDE.md", "AGENTS.md")',
    ),
    _agent(
        "instructions_of_exactly_the_limit_cut",
        INSTRUCTIONS_PY,
        "if len(text) > MAX_INSTRUCTION_CHARS:",
        "if len(text) >= MAX_INSTRUCTION_CHARS:",
    ),
    _agent(
        "mentions_repeated_mention_attached_twice",
        MENTIONS_PY,
        "return list(dict.fromkeys(path for path in paths if path))",
        "return [path for path in paths if path]",
    ),
    _agent(
        "mentions_completed_folder_without_slash",
        MENTIONS_PY,
        'entry.name + ("/" if entry.is_dir() else "")',
        "entry.name",
    ),
    _agent(
        "files_fifo_named_not_a_regular_file",
        FILES_PY,
        '    (stat.S_ISFIFO, "a FIFO"),\n',
        "",
    ),
    _agent(
        "tools_read_to_the_end_announces_zero_more_lines",
        TOOLS_PY,
        "        if remaining > 0:\n",
        "        if remaining >= 0:\n",
    ),
    _agent(
        "tools_write_to_a_blank_path",
        TOOLS_PY,
        "        if not path.strip():\n"
        '            raise ToolError("the path is empty; give the file to write")',
        "        if not path:\n"
        '            raise ToolError("the path is empty; give the file to write")',
    ),
    _agent(
        "tools_unknown_job_raises_key_error",
        TOOLS_PY,
        "        if number not in self.jobs.jobs:\n"
        '            raise ToolError(f"there is no job {number}")\n',
        "",
    ),
    _agent(
        "tools_call_description_keeps_newlines",
        TOOLS_PY,
        '" ".join(str(value).split())',
        "str(value)",
    ),
    _agent(
        "prompt_history_draft_overwritten_while_walking_back",
        PROMPT_INPUT_PY,
        "        if self.position == len(self.entries):\n            self.draft = current\n",
        "        self.draft = current\n",
    ),
    _agent(
        "conversations_resave_takes_a_new_name",
        CONVERSATIONS_PY,
        "name = name or conversation.name or default_name()",
        "name = name or default_name()",
    ),
    _agent(
        "conversations_one_valid_message_enough",
        CONVERSATIONS_PY,
        "if not isinstance(messages, list) or not all(",
        "if not isinstance(messages, list) or not any(",
    ),
    _agent(
        "permissions_yolo_still_asks",
        PERMISSIONS_PY,
        "            and not self.yolo\n",
        "",
    ),
    _agent(
        "permissions_tool_rule_never_allows",
        PERMISSIONS_PY,
        "        return True\n\n    def describe",
        "        return False\n\n    def describe",
    ),
)

_SERVER = (
    _server(
        "chat_tool_calls_finish_as_stop",
        OPENAI_CHAT_PY,
        '    "tool_calls": "tool_calls",\n}',
        '    "tool_calls": "stop",\n}',
    ),
    _server(
        "chat_logprobs_returned_unasked",
        OPENAI_CHAT_PY,
        '"logprobs": chat_logprobs(logprobs) if with_logprobs else None,',
        '"logprobs": chat_logprobs(logprobs),',
    ),
    _server(
        "completion_offsets_at_token_ends",
        COMPLETIONS_PY,
        "        offsets.append(offset)\n        offset += len(entry.text)\n",
        "        offset += len(entry.text)\n        offsets.append(offset)\n",
    ),
    _server(
        "completion_stream_offsets_restart_each_chunk",
        COMPLETIONS_PY,
        "        self.sent_characters += sum(len(entry.text) for entry in entries)\n",
        "",
    ),
    _server(
        "completion_echo_ignored",
        COMPLETIONS_PY,
        "        if request.echo:\n"
        '            raise unsupported("echo", "the prompt is not repeated in the output")\n',
        "",
    ),
    _server(
        "completion_zero_logprobs_omitted",
        COMPLETIONS_PY,
        "                    if request.logprobs is not None\n",
        "                    if request.logprobs\n",
    ),
    _server(
        "responses_store_keeps_one_fewer",
        RESPONSES_PY,
        "while len(self._items) > self.capacity:",
        "while len(self._items) >= self.capacity:",
    ),
    _server(
        "responses_assistant_items_merge_across_a_user_message",
        RESPONSES_PY,
        "        elif not is_assistant_side:\n            assistant = None\n",
        "",
    ),
    _server(
        "responses_unknown_previous_response_starts_afresh",
        RESPONSES_PY,
        "stored = self.store.conversation(request.previous_response_id)\n",
        "stored = self.store.conversation(request.previous_response_id) or []\n",
    ),
    _server(
        "anthropic_redacted_thinking_refused",
        ANTHROPIC_PY,
        'elif block.type != "redacted_thinking":',
        "else:",
    ),
    _server(
        "anthropic_assistant_text_blocks_not_joined",
        ANTHROPIC_PY,
        '            message["content"] += block.text\n',
        '            message["content"] = block.text\n',
    ),
    _server(
        "count_tokens_of_the_served_model_refused",
        UTILITY_PY,
        "            if not self.serves(body.model):\n",
        "            if self.serves(body.model):\n",
    ),
    _server(
        "tokenize_pieces_inverted",
        UTILITY_PY,
        "        if not body.with_pieces:\n",
        "        if body.with_pieces:\n",
    ),
    _server(
        "app_responses_without_v1_not_routed",
        APP_PY,
        'if endpoint.path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):',
        'if endpoint.path in ("/v1/chat/completions", "/v1/completions"):',
    ),
    _server(
        "app_deleted_response_still_stored",
        APP_PY,
        "            self.responses.store.delete(response_id)\n",
        "",
    ),
    _server(
        "app_response_names_the_requested_model",
        APP_PY,
        "meta = ResponseMeta(self.config.model_id, prompt_tokens=",
        "meta = ResponseMeta(parsed.model, prompt_tokens=",
    ),
)

_ENGINE = (
    _engine(
        "generate_one_token_past_max_tokens",
        GENERATE_PY,
        "    if generated >= max_tokens:\n",
        "    if generated > max_tokens:\n",
    ),
    _engine(
        "generate_prompt_filling_the_context_refused",
        GENERATE_PY,
        "session.n_tokens + len(prompt) > max_context:",
        "session.n_tokens + len(prompt) >= max_context:",
    ),
    _engine(
        "generate_prompt_not_in_the_penalty_window",
        GENERATE_PY,
        "    sampler.record(prompt)\n",
        "",
    ),
    _engine(
        "generate_pipelined_context_stop_ignores_pending_tokens",
        GENERATE_PY,
        "            session.n_tokens - len(pending),\n",
        "            session.n_tokens,\n",
    ),
    _engine(
        "generate_decode_rate_counts_the_prefill_token",
        GENERATE_PY,
        "        decoded = self.generated_tokens - 1\n",
        "        decoded = self.generated_tokens\n",
    ),
    _engine(
        "session_id_equal_to_the_vocabulary_size_accepted",
        SESSION_PY,
        "(ids < 0) | (ids >= vocab_size)",
        "(ids < 0) | (ids > vocab_size)",
    ),
    _engine(
        "session_float_ids_accepted",
        SESSION_PY,
        'if ids.dtype.kind not in "iu":',
        'if ids.dtype.kind not in "iuf":',
    ),
    _engine(
        "tokenizer_user_defined_tokens_skipped_as_special",
        TOKENIZER_PY,
        "        if token_type in _SPECIAL_TYPES and skip_special:\n",
        "        if token_type in _ATOMIC_TYPES and skip_special:\n",
    ),
    _engine(
        "tokenizer_eos_not_a_stop",
        TOKENIZER_PY,
        "dict.fromkeys(i for i in (eos_id, *end_of_generation_ids) if i is not None)",
        "dict.fromkeys(i for i in end_of_generation_ids if i is not None)",
    ),
    _engine(
        "tokenizer_bos_added_without_add_bos",
        TOKENIZER_PY,
        "        if add_special and self.add_bos and self.bos_id is not None:\n",
        "        if add_special and self.bos_id is not None:\n",
    ),
    _engine(
        "tokenizer_id_at_the_vocabulary_size_raises_index_error",
        TOKENIZER_PY,
        "        if not 0 <= token_id < len(self._tokens):\n",
        "        if not 0 <= token_id <= len(self._tokens):\n",
    ),
    _engine(
        "tokenizer_model_none_not_numeric",
        TOKENIZER_PY,
        'if model in (None, "none", "test"):',
        'if model in (None, "test"):',
    ),
    _engine(
        "chat_non_object_arguments_kept",
        CHAT_BASE_PY,
        '    if not isinstance(arguments, dict):\n        arguments = {"arguments": arguments}\n',
        "",
    ),
    _engine(
        "prompt_caller_characters_count_the_template",
        PROMPT_PY,
        "for text, from_template in self.pieces if not from_template)",
        "for text, from_template in self.pieces if from_template)",
    ),
    _engine(
        "call_grammar_empty_properties_allow_no_arguments",
        CALL_GRAMMAR_PY,
        "if not isinstance(properties, Mapping) or not properties:",
        "if not isinstance(properties, Mapping):",
    ),
    _engine(
        "call_grammar_required_parameter_mandatory_without_a_schema",
        CALL_GRAMMAR_PY,
        "items.append((rule, parameter.required and bound))",
        "items.append((rule, parameter.required))",
    ),
    _engine(
        "prompt_cache_memory_hit_ignored_with_a_disk",
        PROMPT_CACHE_PY,
        "if snapshot is not None or self.disk is None:",
        "if snapshot is not None and self.disk is None:",
    ),
    _engine(
        "prompt_cache_disk_remove_keeps_the_file",
        PROMPT_CACHE_PY,
        "        path = self._index.pop(tokens, None)\n"
        "        if path is not None:\n"
        "            path.unlink(missing_ok=True)\n",
        "        self._index.pop(tokens, None)\n",
    ),
    _engine(
        "state_codec_trusted_prefix_without_its_dot",
        STATE_CODEC_PY,
        '_TRUSTED_PREFIX = "ds4mlx."',
        '_TRUSTED_PREFIX = "ds4mlx"',
    ),
    _engine(
        "sampling_top_p_zero_accepted",
        SAMPLING_PY,
        "if not 0.0 < self.top_p <= 1.0:",
        "if not 0.0 <= self.top_p <= 1.0:",
    ),
    _engine(
        "sampling_zero_repeat_penalty_accepted",
        SAMPLING_PY,
        "if self.repeat_penalty <= 0:",
        "if self.repeat_penalty < 0:",
    ),
    _engine(
        "sampler_committed_token_not_recorded",
        SAMPLING_PY,
        "        self.record([token])\n",
        "",
    ),
)

_SPECULATION = (
    _speculation(
        "speculation_config_exact_sampling_inverted",
        SPECULATION_CONFIG_PY,
        "AcceptanceMode.EXACT if self.exact_sampling else AcceptanceMode.OPPORTUNISTIC",
        "AcceptanceMode.OPPORTUNISTIC if self.exact_sampling else AcceptanceMode.EXACT",
    ),
    _speculation(
        "speculation_config_mtp_without_its_file_accepted",
        SPECULATION_CONFIG_PY,
        "        if self.kind is DrafterKind.MTP and self.support_path is None:\n"
        '            raise ValueError("--mtp-draft needs the MTP file: --mtp-model FILE")\n',
        "",
    ),
    _speculation(
        "speculation_config_confidence_one_refused",
        SPECULATION_CONFIG_PY,
        "if not 0.0 <= self.confidence <= 1.0:",
        "if not 0.0 <= self.confidence < 1.0:",
    ),
    _speculation(
        "probe_tau_without_the_target_token",
        PROBE_PY,
        "return (self.accepted + self.cycles) / self.cycles if self.cycles else 0.0",
        "return self.accepted / self.cycles if self.cycles else 0.0",
    ),
    _speculation(
        "probe_stats_sum_drops_accepted",
        PROBE_PY,
        "        self.accepted += other.accepted\n",
        "",
    ),
    _speculation(
        "probe_empty_draft_counted_as_a_cycle",
        PROBE_PY,
        "        if tokens:\n            stats.cycles += 1\n",
        "        if tokens is not None:\n            stats.cycles += 1\n",
    ),
    _speculation(
        "nextn_one_token_draft_refused",
        NEXTN_PY,
        "        if max_tokens < 1:\n",
        "        if max_tokens <= 1:\n",
    ),
    _speculation(
        "mtp_draft_past_max_draft",
        MTP_PY,
        "        n = min(max_tokens, self.max_draft)\n",
        "        n = max_tokens\n",
    ),
)

_EXPERTS = (
    _experts(
        "expert_options_zero_cache_accepted",
        EXPERT_OPTIONS_PY,
        "if self.cache_gib is not None and not self.cache_gib > 0:",
        "if self.cache_gib is not None and not self.cache_gib >= 0:",
    ),
    _experts(
        "expert_options_save_hotlist_without_a_file_accepted",
        EXPERT_OPTIONS_PY,
        "        if self.save_hotlist and self.hotlist is None:\n"
        '            raise ValueError("--save-expert-hotlist needs --expert-hotlist FILE")\n',
        "",
    ),
    _experts(
        "expert_cache_budget_case_sensitive",
        EXPERT_OPTIONS_PY,
        "    text = text.strip().lower()\n",
        "    text = text.strip()\n",
    ),
    _experts(
        "expert_weight_bytes_without_biases",
        STORE_PY,
        "for a in (w.packed, w.scales, w.biases) if a is not None",
        "for a in (w.packed, w.scales) if a is not None",
    ),
    _experts(
        "resident_store_counts_only_the_last_layer",
        RESIDENT_PY,
        "        self._bytes += sum(weight_nbytes(w) for w in (gate, up, down))\n",
        "        self._bytes = sum(weight_nbytes(w) for w in (gate, up, down))\n",
    ),
    _experts(
        "policy_set_hotness_decays_from_the_old_clock",
        POLICY_PY,
        "        self._hot[keys] = values\n        self._hot_clock[keys] = self.clock\n",
        "        self._hot[keys] = values\n",
    ),
    _experts(
        "policy_exactly_enough_slots_refused",
        POLICY_PY,
        "        if len(slots) < n:\n",
        "        if len(slots) <= n:\n",
    ),
    _experts(
        "expert_reader_partial_block_rows_accepted",
        EXPERT_READER_PY,
        "        if inner % block:\n"
        "            raise GGUFError(\n"
        "                f\"{path}: tensor '{info.name}' rows of {inner} values are not \"\n"
        '                f"whole {info.qtype.name} blocks of {block}"\n'
        "            )\n",
        "",
    ),
)

_GGUF = (
    _gguf(
        "writer_alignment_key_accepted_in_metadata",
        WRITER_PY,
        "for key in (ARCHITECTURE_KEY, ALIGNMENT_KEY):",
        "for key in (ARCHITECTURE_KEY,):",
    ),
    _gguf(
        "writer_duplicate_tensor_names_accepted",
        WRITER_PY,
        '        if tensor.name in encoded:\n            raise ValueError(f"duplicate {where}")\n',
        "",
    ),
    _gguf(
        "writer_64_byte_tensor_name_accepted",
        WRITER_PY,
        "MAX_TENSOR_NAME_BYTES = 63",
        "MAX_TENSOR_NAME_BYTES = 64",
    ),
    _gguf(
        "writer_int_list_written_unsigned",
        WRITER_PY,
        "    if kinds == {V.UINT32}:\n        return V.INT32\n",
        "",
    ),
    _gguf(
        "writer_integer_maximum_refused",
        WRITER_PY,
        "int(limits.min) <= value <= int(limits.max)",
        "int(limits.min) <= value < int(limits.max)",
    ),
    _gguf(
        "writer_float_infinity_refused",
        WRITER_PY,
        "fits = not math.isfinite(value) or abs(value) <= float(np.finfo(np.float32).max)",
        "fits = abs(value) <= float(np.finfo(np.float32).max)",
    ),
    _gguf(
        "quants_mxfp4_bytes_without_scales",
        QUANTS_PY,
        "        return n // 2 + groups  # e2m1 codes, one e8m0 byte a group\n",
        "        return n // 2  # e2m1 codes, one e8m0 byte a group\n",
    ),
)

_CLI = (
    _cli(
        "cli_number_at_the_top_of_its_range_refused",
        CLI_OPTIONS_PY,
        "        if too_low or value > high:\n",
        "        if too_low or value >= high:\n",
    ),
    _cli(
        "cli_logit_bias_for_token_zero_refused",
        CLI_OPTIONS_PY,
        "if pair[0] < 0 or not -100.0 <= pair[1] <= 100.0:",
        "if pair[0] <= 0 or not -100.0 <= pair[1] <= 100.0:",
    ),
    _cli(
        "cli_non_negative_zero_refused",
        CLI_OPTIONS_PY,
        "    if value < 0:\n",
        "    if value <= 0:\n",
    ),
    _cli(
        "cli_ngram_equal_bounds_refused",
        CLI_OPTIONS_PY,
        "    if not 1 <= sizes[0] <= sizes[1]:\n",
        "    if not 1 <= sizes[0] < sizes[1]:\n",
    ),
    _cli(
        "cli_mtp_with_an_mtp_model_accepted",
        CLI_OPTIONS_PY,
        "    if kind is DrafterKind.NEXTN and args.mtp_model:\n"
        '        raise ValueError("--mtp uses the draft block inside the main model; '
        'drop --mtp-model")\n',
        "",
    ),
    _cli(
        "cli_kv_disk_only_cache_dropped",
        KV_OPTIONS_PY,
        "    if disk is None and memory == 0:\n",
        "    if disk is None or memory == 0:\n",
    ),
    _cli(
        "prompt_source_trailing_spaces_stripped",
        PROMPT_SOURCE_PY,
        '    return text.rstrip("\\r\\n")\n',
        "    return text.rstrip()\n",
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
