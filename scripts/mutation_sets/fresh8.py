"""The eighth fresh run (issue 37's acceptance: "a fresh mutation run next time, with mutations
this issue does not name, catches >= 90 %"). Plausible one-line bugs in guard and logic code
(off-by-ones, flipped comparisons, an element dropped from a set or tuple, a wrong default or
constant, swapped values, a missing early return, a counter not incremented, a wrong key, a
wrong field of a response), written from the code under ``ds4mlx/`` alone, without opening
anything under ``tests/`` or any mutation report, in the code earlier sets touched least: the
agent's OpenAI backend, markup filter, event notes, slash commands, compaction and loop; the
server's errors, turn blocks, metrics, request limits, choices, queue and app; the engine's
tokenizer, detokenizer, chat helpers and events, batched sessions, generation loop, snapshot
files, state codec, constraints and call grammar; the speculation support files, DSpark and
NextN drafters and config; the expert store choice, stats, batches, reader, options and policy;
the GGUF quantizer, reader and writer; the command line's server, prompt cache, prompt source,
plan, REPL and oversize refusal. No behaviour issue 37 lists is mutated (clip and
bounded-output splits, undo of two edits, LRU order, fingerprints in file names, the staging
room, fields ending at end of file, the data section's alignment, special tokens kept as text,
permission prefixes, confinement, access keys and body limits).

Checked against every earlier set (core, guards, fresh2 to fresh7) by a script that applies
each mutation here and each earlier one to today's code and diffs the results: each mutation
here applies exactly once, none gives the same file as an earlier mutation, none changes a line
an earlier mutation changes, and no two here share a line.

Left out while writing, of the candidates read off the code:
- Exact duplicates: none (the script found none; lines earlier sets change were skipped).
- Near duplicates, 6 (the same bug as an earlier mutation on a neighbouring field or type):
  the choices' reasoning tokens taken from the first choice (fresh2's
  ``server_choices_usage_counts_the_first``); the deferred-requests gauge showing the running
  ones (the mirror of fresh6's ``metrics_processing_gauge_shows_the_queue``);
  ``repeat_penalty != 1.0`` dropped from ``penalizes`` (fresh3's
  ``sampling_presence_penalty_alone_ignored``); a numpy array coming back from the state codec
  as an MLX one (fresh6's ``state_codec_ndarray_comes_back_as_mlx``); I16 dropped from the
  reader's element types (fresh6's ``reader_i32_tensor_as_bytes``); the JSON layout dropped from
  ``json_lexeme`` (next to fresh6's ``call_grammar_items_without_space``).
- Equivalent or as good as equivalent, 7: the OpenAI backend's decode time for ``chunks > 1``
  as ``> 0`` (with one chunk the first and last token times are equal: 0 either way); the
  expert tensor's byte-count check ``!=`` as ``>`` (``validate_gguf`` computes ``nbytes`` from
  the shape and type, so the check never fires for a file's tensor); ``marker_prefix_length``
  without its ``- 1`` (a tail as long as a marker that starts one is the whole marker, which
  ``first_marker`` finds first); ``parameter_sequence``'s ``'""'`` fallback (``parameters``
  gives None, never [], for no parameters); the queue's lone-job test on ``waiting`` instead of
  ``_running`` (after admission every running job waits on a step); ``enter_forced_call``
  without its ``if prefix`` (feeding "" changes nothing); the penalty-window clamp ``>`` as
  ``>=`` (it replaces the window by the same value).
- Would hang rather than fail, 2: the expert reader's short-read test ``n <= 0`` as ``< 0`` (a
  zero-byte read loops forever: a TIMEOUT, not a test's verdict); the queue's ``close``
  without cancelling its running jobs (a 30 s join per test).
- Too close to what issue 37 names, 3: stripping of ``--api-key`` values (access keys);
  compaction's own ``_clip`` boundary (beside ``tools._clip``'s split); the expert read's
  end-of-file bound (beside "fields ending exactly at end of file").
- Others as weaker or to keep the brief's shares (agent 20 %, server 20 %, engine 25 %,
  speculation 10 %, experts 10 %, GGUF 8 %, CLI 7 %), e.g. TypeError dropped from the limits'
  rendering errors (request validation leaves little to raise it), ``--keepalive 0`` beside
  ``--tokens 0``, the byte map's last printable range (only byte 0xFF, which no UTF-8 text
  holds), the model fingerprint's tail read (files up to 1 MiB are read whole by the first).

The 86 written: agent 17, server 17, engine 22, speculation 9, experts 8, GGUF 7, CLI 6. Each
applies (``--list``). 78 were run with and without the change (a copy of the package with the
mutation applied, a few lines each, fakes for the model, service and backend); each behaved
differently, e.g.:
- ``markup_single_opening_character_not_held_back``: "see <" then a DSML block gives the text
  "see <" and the block's markup as text, not a ToolCallError;
- ``commands_history_zero_shows_everything``: 25 messages for ``/history 0``, not 20;
- ``compaction_summary_budget_capped_at_32``: 32 summary tokens for a 4096 context, not 256;
- ``loop_unanswered_permission_allows``: the bash call runs (1 run, not 0);
- ``loop_compaction_of_equal_size_kept``: 9 messages become 4 for no gain;
- ``backend_state_cut_of_exactly_max_cut_refused``: a state 4 tokens (MAX_CUT) ahead refused;
- ``turn_streamed_call_completed_by_another_tool``: a streamed "a" completed by a call of "b";
- ``metrics_ttft_quantile_one_rank_low``: 1.0 for the median of [1, 2], not 2.0;
- ``limits_chat_prompt_not_counted``: a 50-token chat in a 32-token context accepted;
- ``queue_cancelled_job_still_started``: a job cancelled while queued starts (1 start, 0
  cancelled, not 0 and 1);
- ``app_refusals_not_counted``: ``ds4mlx:requests_refused_total 0`` after a 400;
- ``chat_effort_falls_to_the_weakest_below``: DeepSeek's "max" becomes "high", GLM's "high"
  "low";
- ``chat_parser_final_text_held_back``: a final "<" lost by both formats' parsers;
- ``grammar_rollback_of_zero_forgets_everything``: ``rollback(0)`` after two tokens leaves
  none taken;
- ``tokenizer_missing_pre_read_as_gpt2``, ``tokenizer_eom_token_not_read``: a file without
  ``pre`` read as "gpt-2"; stop ids (0,) without the eom id 1;
- ``snapshot_header_of_invalid_utf8_raises_unicode_error``: UnicodeDecodeError out of
  ``read_header``;
- ``support_identity_depends_on_tensor_order``: two files with the tensors in another order
  get different identities;
- ``writer_given_file_type_overridden``: ``general.file_type`` 7 written as 0;
- ``reader_writer_type_of_arrays_and_scalars_swapped``: (INT16, ARRAY) for a UINT32 and a
  STRING list;
- ``policy_slot_of_key_zero_counted_empty``: the hot expert 0 evicted before a colder one;
- ``cli_server_zero_tokens_accepted``: ``--tokens 0`` gets to loading the model;
- ``cli_streamed_model_refused_as_oversized``: the oversize check runs for a streamed model
  (a ValueError for a missing file, where it gave None).
The other 8 were reasoned out on the code: ``loop_turn_with_no_room_left_started`` (a model
turn of at most 0 tokens instead of "context_full"); ``app_cancelled_generation_answered_500``
(the endpoint builds a response from no ``Finished``: a 500, not a 503);
``generate_pipelined_run_not_cut_at_a_call_opener`` (a static constraint's opener no longer
cuts the queued steps); ``store_refillable_batch_results_not_evaluated`` (a batch's result is
read after ``experts/streamed.py`` wrote the next batch into its slots in place);
``dspark_rows_after_a_gap_accepted``, ``dspark_ring_forgets_the_rows_it_held``,
``dspark_target_check_inverted`` and ``dspark_draft_rows_from_the_wrong_first_row`` (the
drafter's position check, ring length, identity check and first draft row). The set itself
was not run here.

Test selection as in fresh5 to fresh7 (``base.in_*_folder``): the whole ``tests/`` folder of
the mutated code's package, with ``-x``; the engine's folder holds its chat templates' and KV
cache's tests too.
"""

from __future__ import annotations

from mutation_sets.base import (
    AGENT_LOOP_PY,
    APP_PY,
    CALL_GRAMMAR_PY,
    CHAT_BASE_PY,
    CHOICES_PY,
    CLI_SERVER_PY,
    COMMANDS_PY,
    COMPACTION_PY,
    CONSTRAINTS_PY,
    DETOKENIZER_PY,
    DSPARK_PY,
    ERRORS_PY,
    EXPERT_OPTIONS_PY,
    EXPERT_READER_PY,
    GENERATE_PY,
    GGUF_READER_PY,
    KV_OPTIONS_PY,
    LIMITS_PY,
    MARKUP_PY,
    METRICS_PY,
    NEXTN_PY,
    POLICY_PY,
    PROMPT_SOURCE_PY,
    QUEUE_PY,
    SESSION_PY,
    SNAPSHOT_FILE_PY,
    SPECULATION_CONFIG_PY,
    STATE_CODEC_PY,
    STORE_PY,
    SUPPORT_GGUF_PY,
    TOKENIZER_PY,
    TURN_PY,
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

BACKEND_PY = "ds4mlx/agent/backend.py"
EVENT_NOTES_PY = "ds4mlx/agent/event_notes.py"
CHAT_EVENTS_PY = "ds4mlx/engine/chat/events.py"
EXPERTS_INIT_PY = "ds4mlx/experts/__init__.py"
QUANTIZE_PY = "ds4mlx/gguf/quantize.py"
CLI_PLAN_PY = "ds4mlx/cli/plan.py"
REPL_PY = "ds4mlx/cli/repl.py"
CLI_MAIN_PY = "ds4mlx/cli/main.py"

_AGENT = (
    _agent(
        "backend_orphan_tool_result_sent_as_tool",
        BACKEND_PY,
        'elif role == "tool" and message.get("tool_call_id") not in open_call_ids:',
        'elif role == "tool" and message.get("tool_call_id") in open_call_ids:',
    ),
    _agent(
        "backend_tool_result_loses_its_call_id",
        BACKEND_PY,
        'for key in ("role", "content", "tool_call_id") if key in message',
        'for key in ("role", "content") if key in message',
    ),
    _agent(
        "backend_non_object_arguments_complete_a_call",
        BACKEND_PY,
        "    if not isinstance(arguments, dict):\n"
        '        return ToolCallError(raw, "arguments are not a JSON object")\n',
        "",
    ),
    _agent(
        "backend_characters_per_token_inverted",
        BACKEND_PY,
        "self.chars_per_token = self._request_chars / prompt",
        "self.chars_per_token = prompt / self._request_chars",
    ),
    _agent(
        "backend_state_cut_of_exactly_max_cut_refused",
        BACKEND_PY,
        "if snapshot.n_tokens - share > MAX_CUT:",
        "if snapshot.n_tokens - share >= MAX_CUT:",
    ),
    _agent(
        "markup_single_opening_character_not_held_back",
        MARKUP_PY,
        "for length in range(min(len(text), longest), 0, -1):",
        "for length in range(min(len(text), longest), 1, -1):",
    ),
    _agent(
        "markup_invoke_block_ends_at_its_tag",
        MARKUP_PY,
        '_ENCLOSING = ("tool_calls", "invoke")',
        '_ENCLOSING = ("tool_calls",)',
    ),
    _agent(
        "event_notes_empty_attached_line",
        EVENT_NOTES_PY,
        '[("attached " + ", ".join(event.attached), False)] if event.attached else []',
        '[("attached " + ", ".join(event.attached), False)]',
    ),
    _agent(
        "commands_history_zero_shows_everything",
        COMMANDS_PY,
        "if argument.isdigit() and int(argument) > 0 else 20",
        "if argument.isdigit() and int(argument) >= 0 else 20",
    ),
    _agent(
        "compaction_summary_budget_capped_at_32",
        COMPACTION_PY,
        "summary=max(context_size // 16, 32),",
        "summary=min(context_size // 16, 32),",
    ),
    _agent(
        "compaction_transcript_empty_assistant_lines",
        COMPACTION_PY,
        '            if content:\n                lines.append(f"Assistant: {content}")\n',
        '            lines.append(f"Assistant: {content}")\n',
    ),
    _agent(
        "compaction_clips_everything_but_tool_results",
        COMPACTION_PY,
        '    if message["role"] != "tool":\n        return message\n',
        '    if message["role"] == "tool":\n        return message\n',
    ),
    _agent(
        "loop_turn_with_no_room_left_started",
        AGENT_LOOP_PY,
        "            if room <= 0:\n",
        "            if room < 0:\n",
    ),
    _agent(
        "loop_unanswered_permission_allows",
        AGENT_LOOP_PY,
        "decision = request.decision or Decision.DENY",
        "decision = request.decision or Decision.ALLOW_ONCE",
    ),
    _agent(
        "loop_unrun_call_results_not_errors",
        AGENT_LOOP_PY,
        "def _add_tool_result(self, call_id: str, output: str, is_error: bool = True) -> None:",
        "def _add_tool_result(self, call_id: str, output: str, is_error: bool = False) -> None:",
    ),
    _agent(
        "loop_compaction_of_equal_size_kept",
        AGENT_LOOP_PY,
        "        if after >= before:\n",
        "        if after > before:\n",
    ),
    _agent(
        "loop_strip_count_not_incremented",
        AGENT_LOOP_PY,
        '                message["content"] = _STRIPPED\n                stripped += 1\n',
        '                message["content"] = _STRIPPED\n',
    ),
)

_SERVER = (
    _server(
        "errors_anthropic_404_as_invalid_request",
        ERRORS_PY,
        '    404: "not_found_error",\n',
        "",
    ),
    _server(
        "errors_openai_param_carries_the_code",
        ERRORS_PY,
        '"param": error.param,',
        '"param": error.code,',
    ),
    _server(
        "turn_streamed_call_completed_by_another_tool",
        TURN_PY,
        "if streamed is not None and streamed.name == event.call.name:",
        "if streamed is not None:",
    ),
    _server(
        "turn_total_tokens_without_the_prompt",
        TURN_PY,
        '"total_tokens": finished.prompt_tokens + finished.completion_tokens,',
        '"total_tokens": finished.completion_tokens,',
    ),
    _server(
        "turn_cut_off_call_listed_as_a_tool_call",
        TURN_PY,
        'return [block for block in self.blocks if block.kind == "tool_call" and block.call]',
        'return [block for block in self.blocks if block.kind == "tool_call"]',
    ),
    _server(
        "metrics_ttft_quantile_one_rank_low",
        METRICS_PY,
        "return recent[min(len(recent) - 1, int(q * len(recent)))]",
        "return recent[min(len(recent) - 1, int(q * (len(recent) - 1)))]",
    ),
    _server(
        "metrics_cached_tokens_count_the_prompt",
        METRICS_PY,
        "self.cached_tokens += finished.cached_tokens",
        "self.cached_tokens += finished.prompt_tokens",
    ),
    _server(
        "limits_chat_errors_name_the_prompt",
        LIMITS_PY,
        'param = "messages" if call.messages is not None else "prompt"',
        'param = "messages" if call.messages is None else "prompt"',
    ),
    _server(
        "limits_chat_prompt_not_counted",
        LIMITS_PY,
        "        if call.messages is None:\n            return call\n",
        "        if call.messages is not None:\n            return call\n",
    ),
    _server(
        "choices_split_one_choice_short",
        CHOICES_PY,
        "count = 1 + max(e.index for e in events if isinstance(e, ChoiceEvent))",
        "count = max(e.index for e in events if isinstance(e, ChoiceEvent))",
    ),
    _server(
        "choices_one_call_short",
        CHOICES_PY,
        "        for index in range(call.n)\n",
        "        for index in range(1, call.n)\n",
    ),
    _server(
        "queue_zero_sessions_accepted",
        QUEUE_PY,
        "        if max_sessions < 1:\n",
        "        if max_sessions < 0:\n",
    ),
    _server(
        "queue_cancelled_job_still_started",
        QUEUE_PY,
        "        if job.cancelled:\n"
        '            self._end(job, "cancelled")\n'
        "            return\n"
        "        try:\n"
        "            events = job.start()\n",
        "        try:\n            events = job.start()\n",
    ),
    _server(
        "queue_submissions_not_counted",
        QUEUE_PY,
        "            self._stats.submitted += 1\n",
        "",
    ),
    _server(
        "app_cancelled_generation_answered_500",
        APP_PY,
        "        if finished is None:\n"
        '            return _error_response(APIError(503, "the generation was cancelled"), '
        "endpoint)\n"
        "        return JSONResponse(",
        "        return JSONResponse(",
    ),
    _server(
        "app_refusals_not_counted",
        APP_PY,
        "            self.metrics.refuse()\n",
        "",
    ),
    _server(
        "app_v1_health_route_missing",
        APP_PY,
        '        Route("/v1/health", server.health, methods=["GET"]),\n',
        "",
    ),
)

_ENGINE = (
    _engine(
        "tokenizer_special_id_at_the_vocabulary_size_accepted",
        TOKENIZER_PY,
        "if token_id is not None and not 0 <= token_id < len(self._tokens):",
        "if token_id is not None and not 0 <= token_id <= len(self._tokens):",
    ),
    _engine(
        "tokenizer_duplicate_tokens_accepted",
        TOKENIZER_PY,
        "if len(self._token_to_id) != len(self._tokens):",
        "if len(self._token_to_id) > len(self._tokens):",
    ),
    _engine(
        "tokenizer_eom_token_not_read",
        TOKENIZER_PY,
        'for key in ("eot_token_id", "eom_token_id")',
        'for key in ("eot_token_id",)',
    ),
    _engine(
        "tokenizer_missing_pre_read_as_gpt2",
        TOKENIZER_PY,
        'gguf_file.get("tokenizer.ggml.pre") or "default",',
        'gguf_file.get("tokenizer.ggml.pre") or "gpt-2",',
    ),
    _engine(
        "tokenizer_bracketed_id_list_refused",
        TOKENIZER_PY,
        '_ID_LIST_PIECE = re.compile(r"<(\\d+)>|(\\d+)|[\\s,\\[\\]]+")',
        '_ID_LIST_PIECE = re.compile(r"<(\\d+)>|(\\d+)|[\\s,]+")',
    ),
    _engine(
        "tokenizer_vocab_size_equal_to_the_tokens_refused",
        TOKENIZER_PY,
        "        if vocab_size < n_tokens:\n",
        "        if vocab_size <= n_tokens:\n",
    ),
    _engine(
        "detokenizer_finish_keeps_partial_bytes",
        DETOKENIZER_PY,
        'return self._decoder.decode(b"", final=True)',
        'return self._decoder.decode(b"", final=False)',
    ),
    _engine(
        "chat_effort_falls_to_the_weakest_below",
        CHAT_BASE_PY,
        "return weaker[-1] if weaker else self.reasoning_efforts[0]",
        "return weaker[0] if weaker else self.reasoning_efforts[0]",
    ),
    _engine(
        "chat_unparsable_string_arguments_dropped",
        CHAT_BASE_PY,
        '        except json.JSONDecodeError:\n            arguments = {"arguments": arguments}\n',
        "        except json.JSONDecodeError:\n            arguments = {}\n",
    ),
    _engine(
        "argument_stream_separator_without_space",
        CHAT_BASE_PY,
        'separator = ", " if self.sent else "{"',
        'separator = "," if self.sent else "{"',
    ),
    _engine(
        "chat_parser_final_text_held_back",
        CHAT_BASE_PY,
        "keep = 0 if final else marker_prefix_length(self._pending, markers)",
        "keep = marker_prefix_length(self._pending, markers)",
    ),
    _engine(
        "assistant_turn_keeps_only_the_last_text",
        CHAT_EVENTS_PY,
        "                turn.content += event.text\n",
        "                turn.content = event.text\n",
    ),
    _engine(
        "batched_step_of_mixed_models_accepted",
        SESSION_PY,
        "if any(session.model is not model for session in sessions):",
        "if all(session.model is not model for session in sessions):",
    ),
    _engine(
        "batched_step_token_ids_unchecked",
        SESSION_PY,
        "    sessions[0].check_tokens(tokens)\n",
        "",
    ),
    _engine(
        "generate_context_stop_one_token_late",
        GENERATE_PY,
        "if max_context is not None and session_tokens >= max_context:",
        "if max_context is not None and session_tokens > max_context:",
    ),
    _engine(
        "generate_pipelined_run_not_cut_at_a_call_opener",
        GENERATE_PY,
        "cuts = limits.stop_tokens | (constraint.cut_tokens if constraint is not None else set())",
        "cuts = limits.stop_tokens",
    ),
    _engine(
        "snapshot_header_of_invalid_utf8_raises_unicode_error",
        SNAPSHOT_FILE_PY,
        "except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:",
        "except (OSError, json.JSONDecodeError) as exc:",
    ),
    _engine(
        "state_codec_numpy_bool_refused",
        STATE_CODEC_PY,
        "if isinstance(obj, (np.integer, np.floating, np.bool_)):",
        "if isinstance(obj, (np.integer, np.floating)):",
    ),
    _engine(
        "grammar_rollback_of_zero_forgets_everything",
        CONSTRAINTS_PY,
        "        if not count:\n            return\n        taken = sum(",
        "        taken = sum(",
    ),
    _engine(
        "markup_ban_never_constrains",
        CONSTRAINTS_PY,
        "return self._syntax is not None or self._marker.any_banned",
        "return self._syntax is not None and self._marker.any_banned",
    ),
    _engine(
        "call_marker_allowed_without_tools",
        CONSTRAINTS_PY,
        '            self._phase == "text"\n            and self._syntax is not None\n',
        '            self._phase == "text"\n',
    ),
    _engine(
        "call_grammar_unoffered_named_tool_accepted",
        CALL_GRAMMAR_PY,
        "    if not chosen:\n"
        '        raise ValueError(f"tool_choice names {named!r}, which is not offered")\n',
        "",
    ),
)

_SPECULATION = (
    _speculation(
        "support_identity_of_a_one_mib_tensor_windowed",
        SUPPORT_GGUF_PY,
        "    if nbytes <= FULL_HASH_BYTES:\n",
        "    if nbytes < FULL_HASH_BYTES:\n",
    ),
    _speculation(
        "support_identity_depends_on_tensor_order",
        SUPPORT_GGUF_PY,
        "for info in sorted(gguf.layout.tensors.values(), key=lambda info: info.name):",
        "for info in gguf.layout.tensors.values():",
    ),
    _speculation(
        "support_two_dimensional_matrices_stored_f32",
        SUPPORT_GGUF_PY,
        "is_matrix = len(shape) >= 2 and not name.endswith(",
        "is_matrix = len(shape) > 2 and not name.endswith(",
    ),
    _speculation(
        "dspark_rows_after_a_gap_accepted",
        DSPARK_PY,
        "if self._next_pos is not None and pos0 != self._next_pos:",
        "if self._next_pos is not None and pos0 < self._next_pos:",
    ),
    _speculation(
        "dspark_ring_forgets_the_rows_it_held",
        DSPARK_PY,
        "kept = min(window, held + n)",
        "kept = min(window, n)",
    ),
    _speculation(
        "dspark_target_check_inverted",
        DSPARK_PY,
        "    if check_target_id:\n",
        "    if not check_target_id:\n",
    ),
    _speculation(
        "dspark_draft_rows_from_the_wrong_first_row",
        DSPARK_PY,
        "first = 0 if self.config.sample_from_anchor else 1",
        "first = 1 if self.config.sample_from_anchor else 0",
    ),
    _speculation(
        "nextn_position_set_not_advanced",
        NEXTN_PY,
        "self._next_pos += rows.n_rows",
        "self._next_pos = rows.n_rows",
    ),
    _speculation(
        "speculation_config_zero_mtp_draft_accepted",
        SPECULATION_CONFIG_PY,
        "        if self.mtp_draft < 1:\n",
        "        if self.mtp_draft < 0:\n",
    ),
)

_EXPERTS = (
    _experts(
        "experts_non_streaming_options_stream",
        EXPERTS_INIT_PY,
        "if options is None or not options.stream:",
        "if options is None:",
    ),
    _experts(
        "store_read_rate_in_gibibytes",
        STORE_PY,
        "return self.bytes_read / self.read_seconds / 1e9 if self.read_seconds else 0.0",
        "return self.bytes_read / self.read_seconds / 2**30 if self.read_seconds else 0.0",
    ),
    _experts(
        "store_refillable_batch_results_not_evaluated",
        STORE_PY,
        "            if batch.pairs is not None:\n                mx.eval(result)\n",
        "            if batch.pairs is None:\n                mx.eval(result)\n",
    ),
    _experts(
        "reader_single_expert_tensor_refused",
        EXPERT_READER_PY,
        "        if len(shape) == 2:  # writers drop a trailing ne of 1: a single expert\n"
        "            shape = (1, *shape)\n",
        "",
    ),
    _experts(
        "reader_empty_expert_tensor_accepted",
        EXPERT_READER_PY,
        "if len(shape) != 3 or min(shape) <= 0:",
        "if len(shape) != 3 or min(shape) < 0:",
    ),
    _experts(
        "expert_options_zero_read_threads_accepted",
        EXPERT_OPTIONS_PY,
        "        if self.read_threads < 1:\n",
        "        if self.read_threads < 0:\n",
    ),
    _experts(
        "policy_hotness_decays_by_e",
        POLICY_PY,
        "return self._hot[keys] * np.exp2(-age / self.half_life)",
        "return self._hot[keys] * np.exp(-age / self.half_life)",
    ),
    _experts(
        "policy_slot_of_key_zero_counted_empty",
        POLICY_PY,
        "        empty = keys < 0\n",
        "        empty = keys <= 0\n",
    ),
)

_GGUF = (
    _gguf(
        "quantize_scalar_raises_index_error",
        QUANTIZE_PY,
        "if values.ndim == 0 or values.shape[-1] % block_size:",
        "if values.shape[-1] % block_size:",
    ),
    _gguf(
        "quantize_mxfp4_refused",
        QUANTIZE_PY,
        "GGUF_QUANTIZED_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.MXFP4})",
        "GGUF_QUANTIZED_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0})",
    ),
    _gguf(
        "reader_writer_type_of_arrays_and_scalars_swapped",
        GGUF_READER_PY,
        "        if value_type != GGUFValueType.ARRAY:\n",
        "        if value_type == GGUFValueType.ARRAY:\n",
    ),
    _gguf(
        "reader_converted_tensors_not_counted",
        GGUF_READER_PY,
        "        self.converted_tensors += 1\n",
        "",
    ),
    _gguf(
        "writer_file_type_counts_integer_tensors",
        WRITER_PY,
        "        if qtype not in INTEGER_TYPES:\n            weights[qtype] += n_elements\n",
        "        weights[qtype] += n_elements\n",
    ),
    _gguf(
        "writer_booleans_typed_as_integers",
        WRITER_PY,
        "defaults = ((bool, V.BOOL), (int, V.UINT32), (float, V.FLOAT32), (str, V.STRING))",
        "defaults = ((int, V.UINT32), (bool, V.BOOL), (float, V.FLOAT32), (str, V.STRING))",
    ),
    _gguf(
        "writer_given_file_type_overridden",
        WRITER_PY,
        "typed.setdefault(FILE_TYPE_KEY, _TypedValue(int(_file_type(encoded)), V.UINT32))",
        "typed[FILE_TYPE_KEY] = _TypedValue(int(_file_type(encoded)), V.UINT32)",
    ),
)

_CLI = (
    _cli(
        "cli_server_zero_tokens_accepted",
        CLI_SERVER_PY,
        "if args.tokens is not None and args.tokens <= 0:",
        "if args.tokens is not None and args.tokens < 0:",
    ),
    _cli(
        "cli_kv_zero_disk_space_accepted",
        KV_OPTIONS_PY,
        "    if args.kv_disk_space <= 0:\n",
        "    if args.kv_disk_space < 0:\n",
    ),
    _cli(
        "prompt_source_empty_system_prompt_dropped",
        PROMPT_SOURCE_PY,
        'messages = [{"role": "system", "content": system}] if system is not None else []',
        'messages = [{"role": "system", "content": system}] if system else []',
    ),
    _cli(
        "plan_bare_memory_size_in_bytes",
        CLI_PLAN_PY,
        '"t": 2**40, "": 2**30}[match[2]]',
        '"t": 2**40, "": 1}[match[2]]',
    ),
    _cli(
        "repl_continued_line_keeps_its_backslash",
        REPL_PY,
        "        lines.append(line[:-1])\n",
        "        lines.append(line)\n",
    ),
    _cli(
        "cli_streamed_model_refused_as_oversized",
        CLI_MAIN_PY,
        "    if options.experts.stream or options.distributed:\n",
        "    if options.distributed:\n",
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
