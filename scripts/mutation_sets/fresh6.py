"""The sixth fresh run (issue 37's acceptance: "a fresh mutation run next time, with mutations
this issue does not name, catches >= 90 %"). Plausible one-line bugs in guard and logic code
(off-by-ones, flipped comparisons, an element dropped from a set or tuple, a wrong default or
constant, a sort dropped, a missing early return, a counter not incremented or not reset, a
wrong clamp, swapped values), written from the code alone, without opening anything under
``tests/``, in the areas earlier sets probed least: the agent's tools, jobs, checkpoints, slash
commands and loop; the server's adapters, stream writers, errors, metrics and queue; the
constraints, chat templates, snapshot files, state codec and prompt cache; the scheduler,
lookup and acceptance; the expert policy, reader and streamed store; GGUF validation and the
reader. No behaviour issue 37 lists is mutated (clip and bounded-output splits, undo of two
edits, LRU order, fingerprints in file names, the staging room, fields ending at end of file,
the data section's alignment, special tokens, permission prefixes, confinement, access keys
and body limits).

Checked against every earlier set (core, guards, fresh2 to fresh5) by applying each mutation
and each earlier one to today's code: no mutation here gives the same file as an earlier one,
and none changes a line an earlier mutation changes, except ``lookup_extension_of_an_empty_block``
(fresh3's ``lookup_extension_without_agreement`` drops the other half of that condition: a
block the copy disagrees with, not an empty block); ``anthropic_tool_calls_stop_as_end_turn``
only borders fresh3's swapped stop reasons.

Left out while writing, of the candidates read off the code:
- Exact duplicates: none written; every line an earlier mutation changes was skipped.
- Near duplicates, 7: save_hotlist's sort turned coldest first (the file fresh4's
  ``experts_hotlist_coldest_first`` writes); GLM's forced call keeping thinking (fresh5's
  ``deepseek4_forced_call_keeps_thinking`` in the other template); and 5 pairs within this set,
  one kept of each (the expert reader's end-of-file check in ``read_bytes`` beside
  ``from_info``'s; GLM's results with duplicate ids beside unmatched ones; the weakest effort
  beside the off-by-one one; a failure after output counted as before it through ``not
  started`` beside the flag never set; DeepSeek's and GLM's duplicate-argument checks).
- Equivalent, 20, each reasoned out on the code: ``masks_along`` returning None when any row is
  free (no constraint returns a free row); ``room > 0`` as ``>= 0`` in ``BoundedOutput.append``
  and ``>`` as ``>=`` for its tail trim (a zero-length copy or delete); ``JobRunner.start``
  numbering by ``len`` (jobs are never removed); the ``/proc`` digit check and the environment
  split on NULs (the agent's own environment has no marker; markers are unique); the
  checkpoint's ``folder.is_relative_to`` (parents outside the workspace exist); files-mode
  copies kept in git mode too (git's undo and diff never read them); ``_compare`` without the
  originals' keys (it sets what is already None); the queue's ``len(self._running) == 1`` as
  ``len(waiting)`` (every running job waits on a step after ``_advance``); ``Job.events``
  clearing ``_ready`` unconditionally (the deque is checked first); ``map_batches`` without its
  ``mx.eval`` (the streamed store evaluates ``newest_result`` before it writes a slot; resident
  batches have no ``pairs``); ``first_marker`` preferring the shorter of two markers at one place
  (no two markers of a format match there) and ``marker_prefix_length`` up to a whole marker (a
  whole one is found first); ``skip_strings``' fast path giving up one byte early (the slow path
  gives the same result); ``_reject_overlaps`` without its ``nbytes`` filter (zero dimensions
  are refused before); the default alignment spelled 32 (it is 32); both templates keeping an
  assistant turn's reasoning from ``index >= last_user`` (an assistant turn is never the last
  user turn); the TTFT quantile without its ``min`` (the page asks for 0.5 and 0.99 only).
- Others as unlikely slips, or as a hang rather than a failure (the expert reader's short-read
  check as ``n < 0`` loops forever on a truncated file), or to keep the brief's shares with a
  few mutations per file and different kinds of bug in each.

The 82 written: agent 17, server 16, engine (constraints, templates, KV cache) 21, speculation
10, experts 10, GGUF 8. Each applies (``--list``) and was reasoned to change what the code does.
The doubtful ones were run with and without the change on a small input (a copy of the package
with the mutation applied); each behaved differently:
- ``turn_completed_call_takes_the_next_call_of_its_name``: two calls of one tool become one;
- ``block_stream_open_block_closed_again``: a text block before a whole call is stopped twice
  (3 ``content_block_stop`` for 2);
- ``chat_stream_tool_call_index_counts_text_blocks``: index 1 for the first call after text;
- ``chat_effort_of_the_same_name_skipped``: GLM's "high" becomes "low";
- ``glm5_unmatched_tool_result_dropped``: a result naming no call disappears;
- ``deepseek4_last_user_turn_closes_thinking``: a thinking prompt ends with ``</think>``;
- ``lookup_longest_ngram_never_tried``: a 3-gram's copy where a 4-gram matched;
- ``scheduler_pause_extension_one_step_long``: 4 cycles covered by 3 steps;
- ``state_codec_ndarray_comes_back_as_mlx``, ``state_codec_extra_fields_accepted``;
- ``policy_use_adds_to_undecayed_hotness``: 2.0 where the decayed sum is 1.125;
- ``argument_stream_empty_arguments_unopened``: ``}`` alone;
- ``validate_big_endian_hint_lost``.
The set itself was not run here.

Test selection as in fresh5 (``base.in_*_folder``), mechanical rather than chosen per
mutation: the whole ``tests/`` folder of the mutated code's package (``tests/agent``,
``tests/server``, ``tests/engine`` for the constraints, templates and KV cache,
``tests/speculation``, ``tests/experts``, ``tests/gguf``), with ``-x``. A test elsewhere does
not count: the issue asks for the guarding test in the folder of the code.
"""

from __future__ import annotations

from mutation_sets.base import (
    ACCEPTANCE_PY,
    AGENT_LOOP_PY,
    ANTHROPIC_PY,
    CALL_GRAMMAR_PY,
    CHAT_BASE_PY,
    CHECKPOINTS_PY,
    COMMANDS_PY,
    CONSTRAINTS_PY,
    DEEPSEEK4_CHAT_PY,
    ERRORS_PY,
    EXPERT_READER_PY,
    GGUF_READER_PY,
    GLM5_CHAT_PY,
    JOBS_PY,
    LOOKUP_PY,
    METRICS_PY,
    OPENAI_CHAT_PY,
    POLICY_PY,
    PROMPT_CACHE_PY,
    QUEUE_PY,
    RESPONSES_PY,
    SCHEDULER_PY,
    SNAPSHOT_FILE_PY,
    STATE_CODEC_PY,
    STREAMED_PY,
    TOOLS_PY,
    TURN_PY,
    VALIDATE_PY,
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
        "tools_read_of_one_line_refused",
        TOOLS_PY,
        "        if end < start:\n",
        "        if end <= start:\n",
    ),
    _agent(
        "tools_edit_summary_lists_the_file_header",
        TOOLS_PY,
        "for line in diff.splitlines()[2:]",
        "for line in diff.splitlines()[1:]",
    ),
    _agent(
        "tools_write_into_a_new_folder_refused",
        TOOLS_PY,
        "                and folder.exists()\n",
        "",
    ),
    _agent(
        "tools_call_description_shows_the_content",
        TOOLS_PY,
        '_UNDESCRIBED = {"old", "new", "content"}',
        '_UNDESCRIBED = {"old", "new"}',
    ),
    _agent(
        "tools_more_shows_one_line_too_many",
        TOOLS_PY,
        "position.next_line + count - 1",
        "position.next_line + count",
    ),
    _agent(
        "jobs_stop_never_escalates_to_kill",
        JOBS_PY,
        "        _signal_all(self.process, self.marker, signal.SIGKILL)",
        "        _signal_all(self.process, self.marker, signal.SIGTERM)",
    ),
    _agent(
        "jobs_status_rereads_from_the_start",
        JOBS_PY,
        "text, self.read_offset = self.output.text_since(self.read_offset, limit)",
        "text, _ = self.output.text_since(self.read_offset, limit)",
    ),
    _agent(
        "checkpoints_unchanged_git_prompt_kept",
        CHECKPOINTS_PY,
        "            if not self.git.changed(current.before, current.after):\n"
        "                return\n",
        "",
    ),
    _agent(
        "checkpoints_removed_folders_not_named",
        CHECKPOINTS_PY,
        "if not any(f != o and f.is_relative_to(o) for o in removed)",
        "if not any(f.is_relative_to(o) for o in removed)",
    ),
    _agent(
        "checkpoints_created_empty_file_called_removed",
        CHECKPOINTS_PY,
        '"created)" if after is not None else "removed)"',
        '"created)" if after is None else "removed)"',
    ),
    _agent(
        "commands_history_shows_the_first_messages",
        COMMANDS_PY,
        '[m for m in self.agent.messages if m["role"] != "system"][-count:]',
        '[m for m in self.agent.messages if m["role"] != "system"][:count]',
    ),
    _agent(
        "commands_deleting_another_conversation_unnames_this_one",
        COMMANDS_PY,
        "if self.agent.conversation.name == name:",
        "if self.agent.conversation.name != name:",
    ),
    _agent(
        "commands_on_off_case_sensitive",
        COMMANDS_PY,
        '{"on": True, "off": False}.get(argument.lower())',
        '{"on": True, "off": False}.get(argument)',
    ),
    _agent(
        "loop_turn_not_clamped_to_the_room_left",
        AGENT_LOOP_PY,
        "max_tokens=min(self.settings.max_tokens, room),",
        "max_tokens=self.settings.max_tokens,",
    ),
    _agent(
        "loop_one_model_turn_short",
        AGENT_LOOP_PY,
        "for step in range(1, self.settings.max_steps + 1):",
        "for step in range(1, self.settings.max_steps):",
    ),
    _agent(
        "loop_allow_always_not_remembered",
        AGENT_LOOP_PY,
        "            self.permissions.record(call, decision)\n",
        "",
    ),
    _agent(
        "loop_earlier_stop_cancels_the_next_prompt",
        AGENT_LOOP_PY,
        "        self.cancel.clear()\n        attachments = attach_mentions(",
        "        attachments = attach_mentions(",
    ),
)

# ``queue_type_error_before_start_is_a_server_fault``: the service raises TypeError for a
# malformed message before it generates (``_fail``'s comment), so the request gets 500, not 400.
_SERVER = (
    _server(
        "errors_request_too_large_typed_as_invalid_request",
        ERRORS_PY,
        '    413: "request_too_large",\n',
        "",
    ),
    _server(
        "metrics_ttft_quantile_of_unsorted_times",
        METRICS_PY,
        "recent = sorted(self.recent_ttft)",
        "recent = list(self.recent_ttft)",
    ),
    _server(
        "metrics_finished_requests_not_counted",
        METRICS_PY,
        "            self.requests += 1\n",
        "",
    ),
    _server(
        "metrics_processing_gauge_shows_the_queue",
        METRICS_PY,
        '"Requests generating now.",\n                    queue.running,',
        '"Requests generating now.",\n                    queue.queued,',
    ),
    _server(
        "queue_type_error_before_start_is_a_server_fault",
        QUEUE_PY,
        "isinstance(exc, (ValueError, TypeError)) and not started",
        "isinstance(exc, ValueError) and not started",
    ),
    _server(
        "queue_max_batch_is_the_last_batch",
        QUEUE_PY,
        "self._stats.max_batch = max(self._stats.max_batch, len(steps))",
        "self._stats.max_batch = len(steps)",
    ),
    _server(
        "queue_failure_after_output_as_client_error",
        QUEUE_PY,
        "                run.started = True\n",
        "",
    ),
    _server(
        "responses_input_text_parts_refused",
        RESPONSES_PY,
        '_TEXT_PART_TYPES = ("input_text", "output_text",',
        '_TEXT_PART_TYPES = ("output_text",',
    ),
    _server(
        "responses_stream_sequence_number_stuck",
        RESPONSES_PY,
        "        self.sequence += 1\n",
        "",
    ),
    _server(
        "responses_streamed_response_not_stored",
        RESPONSES_PY,
        "        self.keep(self.request, response, self.turn.blocks)\n",
        "",
    ),
    _server(
        "turn_completed_call_takes_the_next_call_of_its_name",
        TURN_PY,
        'last.kind == "tool_call" and last.call is None else None',
        'last.kind == "tool_call" else None',
    ),
    _server(
        "block_stream_open_block_closed_again",
        TURN_PY,
        "index, self.open_index = self.open_index, None",
        "index = self.open_index",
    ),
    _server(
        "anthropic_tool_calls_stop_as_end_turn",
        ANTHROPIC_PY,
        '    if finished.finish_reason == "tool_calls":\n        return "tool_use"\n',
        "",
    ),
    _server(
        "chat_stream_logprobs_sent_again",
        OPENAI_CHAT_PY,
        "            self.pending_logprobs = []\n",
        "",
    ),
    _server(
        "chat_stream_tool_call_index_counts_text_blocks",
        OPENAI_CHAT_PY,
        'index = [b for b in self.turn.blocks if b.kind == "tool_call"].index(block)',
        "index = self.turn.blocks.index(block)",
    ),
    _server(
        "chat_thinking_false_yields_to_template_kwargs",
        OPENAI_CHAT_PY,
        "request.thinking if request.thinking is not None else template_thinking,",
        "request.thinking or template_thinking,",
    ),
)

# ``constraints_cut_tokens_swapped``: both branches are live (GLM's marker opens a call
# anywhere, DeepSeek's only after "<"), so each format's pipelined runs cut at the wrong tokens.
# ``call_grammar_items_without_space``: the templates render arguments with json.dumps' ", ".
_ENGINE = (
    _engine(
        "constraints_cut_tokens_swapped",
        CONSTRAINTS_PY,
        "return self._marker.opening if self._marker.anywhere else self._marker.openers",
        "return self._marker.openers if self._marker.anywhere else self._marker.opening",
    ),
    _engine(
        "constraints_marker_anywhere_never_opens_a_call",
        CONSTRAINTS_PY,
        "and (self._marker.anywhere or self._last in self._marker.openers)",
        "and self._last in self._marker.openers",
    ),
    _engine(
        "call_grammar_items_without_space",
        CALL_GRAMMAR_PY,
        '"item_separator": ", "',
        '"item_separator": ","',
    ),
    _engine(
        "deepseek4_tool_results_in_arrival_order",
        DEEPSEEK4_CHAT_PY,
        "ordered = iter(sorted(results, key=lambda block: call_order.get(block[2], 0)))",
        "ordered = iter(results)",
    ),
    _engine(
        "deepseek4_user_blocks_one_newline_apart",
        DEEPSEEK4_CHAT_PY,
        'out.template("\\n\\n" if index else "")',
        'out.template("\\n" if index else "")',
    ),
    _engine(
        "deepseek4_last_user_turn_closes_thinking",
        DEEPSEEK4_CHAT_PY,
        "opens_thinking = thinking and (keep_all_reasoning or index >= last_user)",
        "opens_thinking = thinking and (keep_all_reasoning or index > last_user)",
    ),
    _engine(
        "deepseek4_tools_drop_earlier_reasoning",
        DEEPSEEK4_CHAT_PY,
        "keep_all_reasoning = not drop_thinking or bool(tools)",
        "keep_all_reasoning = not drop_thinking",
    ),
    _engine(
        "deepseek4_first_bar_drift_not_parsed",
        DEEPSEEK4_CHAT_PY,
        "_DSML_SPELLINGS = (DSML, DSML[1:])",
        "_DSML_SPELLINGS = (DSML,)",
    ),
    _engine(
        "deepseek4_unflagged_parameter_read_as_json",
        DEEPSEEK4_CHAT_PY,
        'is_string = attributes.get("string", "true")',
        'is_string = attributes.get("string", "false")',
    ),
    _engine(
        "glm5_unmatched_tool_result_dropped",
        GLM5_CHAT_PY,
        "        and set(ids) <= set(call_ids)\n",
        "",
    ),
    _engine(
        "glm5_tool_choice_none_renders_the_tools",
        GLM5_CHAT_PY,
        'tools = [] if tool_choice == "none" else list(tools or ())',
        "tools = list(tools or ())",
    ),
    _engine(
        "glm5_empty_arg_key_accepted",
        GLM5_CHAT_PY,
        '    if not key:\n        return "", "", "", "empty arg_key"\n',
        "",
    ),
    _engine(
        "glm5_observation_not_a_stop_string",
        GLM5_CHAT_PY,
        "        return [USER, OBSERVATION, END_OF_TEXT]",
        "        return [USER, END_OF_TEXT]",
    ),
    _engine(
        "chat_effort_of_the_same_name_skipped",
        CHAT_BASE_PY,
        "if rank(e) <= rank(effort)]",
        "if rank(e) < rank(effort)]",
    ),
    _engine(
        "argument_stream_resends_every_argument",
        CHAT_BASE_PY,
        "            self.sent += 1\n",
        "",
    ),
    _engine(
        "argument_stream_empty_arguments_unopened",
        CHAT_BASE_PY,
        'ToolCallArguments("}" if self.sent else "{}")',
        'ToolCallArguments("}")',
    ),
    _engine(
        "snapshot_state_behind_its_tokens_read",
        SNAPSHOT_FILE_PY,
        'if getattr(state, "pos", len(tokens)) != len(tokens):',
        'if getattr(state, "pos", len(tokens)) > len(tokens):',
    ),
    _engine(
        "state_codec_ndarray_comes_back_as_mlx",
        STATE_CODEC_PY,
        'return {"ndarray": _add(arrays, mx.array(obj))}',
        'return {"array": _add(arrays, mx.array(obj))}',
    ),
    _engine(
        "state_codec_extra_fields_accepted",
        STATE_CODEC_PY,
        "if set(fields) != set(values):",
        "if not set(fields) <= set(values):",
    ),
    _engine(
        "prompt_cache_codec_failure_keeps_caching",
        PROMPT_CACHE_PY,
        "            self._unsupported = True\n",
        "",
    ),
    _engine(
        "prompt_cache_state_behind_its_tokens_cached",
        PROMPT_CACHE_PY,
        'return getattr(snapshot.state, "pos", len(snapshot.tokens)) == len(snapshot.tokens)',
        'return getattr(snapshot.state, "pos", len(snapshot.tokens)) <= len(snapshot.tokens)',
    ),
)

# ``lookup_extension_of_an_empty_block``: with an empty learned block the whole copy becomes the
# draft (or, where the block has confidences, indexing its last one fails).
_SPECULATION = (
    _speculation(
        "scheduler_every_cycle_a_warm_up",
        SCHEDULER_PY,
        "        self.warmed_lengths.add(draft_length)\n",
        "",
    ),
    _speculation(
        "scheduler_pause_extension_one_step_long",
        SCHEDULER_PY,
        "more = min(self._pause_left, steps - 1)",
        "more = min(self._pause_left, steps)",
    ),
    _speculation(
        "scheduler_plain_age_never_reset",
        SCHEDULER_PY,
        "            self.costs.drafted_since_plain = 0\n",
        "",
    ),
    _speculation(
        "scheduler_plain_max_age_one_late",
        SCHEDULER_PY,
        "if costs.drafted_since_plain >= PLAIN_MAX_AGE:",
        "if costs.drafted_since_plain > PLAIN_MAX_AGE:",
    ),
    _speculation(
        "scheduler_free_proposals_pause_by_loss",
        SCHEDULER_PY,
        "        elif not self.free_proposals:\n",
        "        elif self.free_proposals:\n",
    ),
    _speculation(
        "scheduler_mean_at_the_threshold_pauses",
        SCHEDULER_PY,
        "if sum(window) / len(window) < threshold:",
        "if sum(window) / len(window) <= threshold:",
    ),
    _speculation(
        "lookup_equal_ngram_sizes_refused",
        LOOKUP_PY,
        "if not 1 <= min_n <= max_n:",
        "if not 1 <= min_n < max_n:",
    ),
    _speculation(
        "lookup_longest_ngram_never_tried",
        LOOKUP_PY,
        "            if n > len(tail):\n",
        "            if n >= len(tail):\n",
    ),
    _speculation(
        "lookup_extension_of_an_empty_block",
        LOOKUP_PY,
        "if not draft.tokens or copy[: len(draft.tokens)] != draft.tokens:",
        "if copy[: len(draft.tokens)] != draft.tokens:",
    ),
    _speculation(
        "acceptance_next_token_logprob_not_noted",
        ACCEPTANCE_PY,
        "[*draft[: verdict.accepted], verdict.next_token]",
        "[*draft[: verdict.accepted]]",
    ),
)

_EXPERTS = (
    _experts(
        "policy_hotlist_lists_unused_keys",
        POLICY_PY,
        "keys = np.flatnonzero(self._hot > 0)",
        "keys = np.flatnonzero(self._hot >= 0)",
    ),
    _experts(
        "policy_use_adds_to_undecayed_hotness",
        POLICY_PY,
        "self._hot[keys] = self.hotness(keys) + counts",
        "self._hot[keys] = self._hot[keys] + counts",
    ),
    _experts(
        "policy_zero_half_life_accepted",
        POLICY_PY,
        "if half_life <= 0:",
        "if half_life < 0:",
    ),
    _experts(
        "reader_expert_tensor_ending_at_eof_refused",
        EXPERT_READER_PY,
        "info.file_offset + info.nbytes > file_size:",
        "info.file_offset + info.nbytes >= file_size:",
    ),
    _experts(
        "reader_reads_not_counted",
        EXPERT_READER_PY,
        "            self.reads += 1\n",
        "",
    ),
    _experts(
        "reader_f16_experts_as_raw_bytes",
        EXPERT_READER_PY,
        "_DENSE_DTYPES = {T.F32: np.float32, T.F16: np.float16}",
        "_DENSE_DTYPES = {T.F32: np.float32}",
    ),
    _experts(
        "streamed_eviction_of_key_zero_not_counted",
        STREAMED_PY,
        "if pool.policy.assign(slot, key) >= 0:",
        "if pool.policy.assign(slot, key) > 0:",
    ),
    _experts(
        "streamed_hotlist_zero_hotness_refused",
        STREAMED_PY,
        "                or hot < 0\n",
        "                or hot <= 0\n",
    ),
    _experts(
        "streamed_hotlist_reads_past_the_capacity",
        STREAMED_PY,
        "for _, layer, expert in mine[: pool.capacity]:",
        "for _, layer, expert in mine:",
    ),
    _experts(
        "streamed_idle_run_overwrites_the_hotlist",
        STREAMED_PY,
        "            and self._stats.routing_steps\n",
        "",
    ),
)

_GGUF = (
    _gguf(
        "validate_big_endian_hint_lost",
        VALIDATE_PY,
        'swapped = struct.unpack("<I", struct.pack(">I", version))[0]',
        'swapped = struct.unpack("<I", struct.pack("<I", version))[0]',
    ),
    _gguf(
        "validate_overlaps_checked_in_file_order",
        VALIDATE_PY,
        "by_start = sorted((t for t in tensors if t.nbytes), key=lambda t: t.file_offset)",
        "by_start = [t for t in tensors if t.nbytes]",
    ),
    _gguf(
        "validate_tensor_shape_in_ggml_order",
        VALIDATE_PY,
        "return tuple(reversed(self.ggml_dims))",
        "return tuple(self.ggml_dims)",
    ),
    _gguf(
        "reader_int8_metadata_read_unsigned",
        GGUF_READER_PY,
        'GGUFValueType.INT8: "<b",',
        'GGUFValueType.INT8: "<B",',
    ),
    _gguf(
        "reader_array_items_read_from_the_count",
        GGUF_READER_PY,
        "item_type, offset = GGUFValueType(item_type), offset + 12",
        "item_type, offset = GGUFValueType(item_type), offset + 8",
    ),
    _gguf(
        "reader_get_ignores_the_default",
        GGUF_READER_PY,
        "        if entry is None:\n            return default\n",
        "        if entry is None:\n            return None\n",
    ),
    _gguf(
        "reader_i32_tensor_as_bytes",
        GGUF_READER_PY,
        "    GGMLQuantizationType.I32: np.int32,\n",
        "",
    ),
    _gguf(
        "reader_require_missing_key_gives_none",
        GGUF_READER_PY,
        "        if key not in self.layout.metadata:\n"
        "            raise GGUFError(f\"{self.path}: missing required metadata key '{key}'\")\n",
        "",
    ),
)

MUTATIONS: tuple[Mutation, ...] = (
    *_AGENT,
    *_SERVER,
    *_ENGINE,
    *_SPECULATION,
    *_EXPERTS,
    *_GGUF,
)
