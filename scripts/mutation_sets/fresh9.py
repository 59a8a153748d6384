"""The ninth fresh run (issue 37's acceptance: "a fresh mutation run next time, with mutations
this issue does not name, catches >= 90 %"). Plausible one-line bugs in guard and logic code
(off-by-ones, flipped comparisons, an element dropped from a set or tuple, a wrong default or
constant, swapped values, a missing early return, a counter not incremented, a wrong key, a
wrong field of a response, an elif branch taken for another), written from the code under
``ds4mlx/`` alone, without opening anything under ``tests/`` or any mutation report, in the
code earlier sets touched least or never: the agent's Textual app and widgets, loop, jobs,
checkpoints, files and model states; the server's metrics, queue, turn blocks, utility routes,
choices, app and request helpers; the engine's chat events and formats' parsers (GLM-5's and
DSML's), chat helpers, detokenizer, generation loop, constraints, tokenizer, snapshot files and
disk cache; the speculation drafter rows, drafter file checks, speculative loop and MTP drafter;
the expert stats, policy, options, reader and streamed store (its counters and hot-list, not
the staging room); the GGUF quants and reader; the command line's perplexity, logprobs,
distributed seed and bench flags. No behaviour issue 37 lists is mutated (clip and
bounded-output splits, undo of two edits, LRU order, fingerprints in file names, the staging
room, fields ending at end of file, the data section's alignment, special tokens kept as text,
permission prefixes, confinement, access keys and body limits).

Checked against every earlier set (core, guards, fresh2 to fresh8, and hardened_agent,
hardened_cli, hardened_engine, hardened_experts, hardened_gguf, hardened_server and
hardened_speculation, in this worktree and on main) by a script that applies each mutation here
and each earlier one to today's code and diffs the results: each mutation here applies exactly
once, no name is reused, none gives the same file as an earlier mutation, none changes a line an
earlier mutation changes, and no two here share a line.

Left out while writing, of the candidates read off the code:
- Exact duplicates: none (the script found none; lines earlier sets change were skipped).
- Near duplicates, 6 (the same bug as another on a neighbouring field, type or format): the
  state codec giving a tuple back as a list (fresh6's ``state_codec_ndarray_comes_back_as_mlx``);
  an expert in slot 0 counted as a miss (beside fresh8's ``policy_slot_of_key_zero_counted_empty``);
  the chat parsers' ``parse`` without ``finish`` (fresh8's ``chat_parser_final_text_held_back``);
  DSML's ``tool_choice`` "none" still parsing calls and its duplicate parameter accepted (the
  mirrors of ``glm_tool_choice_none_still_parses_calls`` and ``glm_duplicate_argument_accepted``,
  kept for GLM only); the deferred-requests gauge (fresh8 left it out too).
- Equivalent or as good as equivalent, 12: the next job number as ``len(jobs) + 1`` (jobs are
  never removed); ``/proc`` entries without the ``isdigit`` test (no other entry's environment
  holds a command's marker) and the marker looked up as a substring (markers are fixed-length
  hex); the MTP catch-up cut ``>`` as ``>=`` (a cut of 0 rows); token types unknown to llama.cpp
  read as NORMAL instead of UNDEFINED (neither is atomic nor special); a job's ready flag cleared
  unconditionally (the reader tests the deque first); the app's ``_start_next`` without ``not
  self.busy`` (``_drive`` sets it before the loop tests again); the permission buttons'
  ``armed`` test (they stay disabled until armed); the DSML invoke's ``skip_to >= 0`` as ``> 0``
  (it is past the tag); the snapshot header's bound without the file size (the short JSON fails
  with the same SnapshotFileError); ``stepped_generate``'s empty-prompt test (the session refuses
  the empty feed with a ValueError too); the streamed store's one-batch test ``<=`` as ``<`` (the
  chunked path gives the same rows).
- Would hang rather than fail, 4: the compaction summary's ``len(text) < 200`` escape (an
  empty transcript never fits: an endless loop); the output pump without its end-of-file
  return; a marker parser not moving past the marker it found; the permission wait without the
  cancel test (it waits until the app ends).
- Too close to what issue 37 names, 6: a checkpoint per tool call instead of per prompt (undo
  of two edits); ``BoundedOutput``'s append and ``text_since`` (bounded output); the expert
  read's offset and end (fresh8 left the end out too); the tokenizer writer's
  ``_looks_special`` (which tokens are special); ``engine/chat/prompt.py``'s segments (special
  tokens kept as text); the Anthropic error type of 401 (access keys).
- Others as weaker or to keep the brief's shares (agent 20 %, server 20 %, engine 25 %,
  speculation 10 %, experts 10 %, GGUF 8 %, CLI 7 %), e.g. the permission dialog's line count
  (a label), the status bar's "think on/off" and YOLO labels, compaction's cancel test in the
  loop, the assistant's whitespace in ``text_characters``, the resident store's stats kind, a
  token id equal to the vocabulary size in ``ds4 logprobs --ids``, ``top_k`` 0 refused by the
  request fields, two-dimensional matrices kept as blocks.

The 86 written: agent 17, server 17, engine 21, speculation 9, experts 9, GGUF 7, CLI 6. Each
applies (``--list``). All 86 were run with and without the change (a copy of the package with
the mutation applied, a few lines each: fakes for the backend, service, model, drafter, ranks
and Textual app where needed, small GGUF files written with ``gguf``); each behaved
differently, e.g.:
- ``app_unanswered_permission_allows_once``: a permission dialog closed without an answer
  gives ALLOW_ONCE, not DENY;
- ``app_deleted_conversation_saved_again``: ``/del`` autosaves, ``/history`` does not;
- ``widgets_prefix_key_without_a_prefix``: "p" in a write call's dialog answers ALLOW_PREFIX
  (nothing, before); ``widgets_escape_quits_with_jobs_running``: Esc quits (True, not False);
- ``loop_call_that_would_fail_still_asked_and_run``: an edit whose old text is missing is
  also asked about and run, two error results instead of one;
- ``loop_held_back_text_lost_at_the_end``: the answer "see <" recorded as "see ";
- ``loop_summary_transcript_keeps_the_oldest``: the summary request starts with the oldest
  text, not the newest;
- ``jobs_cancelled_command_reports_an_exit_code``: -15 for a cancelled command, not None;
- ``checkpoints_file_bash_created_missing_from_diff``: ``/diff`` outside git is empty after
  bash made a file;
- ``files_file_of_exactly_the_limit_refused_after_reading``: a 5-byte file refused at limit 5;
- ``metrics_throughput_inverted``: 0.1 tokens/s for 20 tokens in 2 s, not 10.0;
- ``queue_request_refused_at_start_answered_500``: a ValueError at start answered 500, not
  400; ``queue_batched_steps_not_counted``: 0 batched steps for 3;
- ``app_cors_middleware_without_cors``: ``Access-Control-Allow-Origin: *`` without ``--cors``;
- ``utility_count_tokens_error_in_openai_shape``: an unknown model's 404 in OpenAI's shape on
  an Anthropic route; ``utility_partial_utf8_piece_replaced``: U+FFFD for the bytes [226, 130];
- ``choices_total_takes_the_last_choice``: the request's finish reason and cached tokens are
  the last choice's;
- ``generation_none_effort_rendered_as_an_effort``: "none" passed to the template, not None;
- ``chat_forced_prefix_events_lost``: DeepSeek's named tool choice reports no ToolCallStart;
- ``chat_effort_order_xhigh_below_high``: GLM renders "xhigh" as "low", not "high";
- ``generate_pipelined_run_loses_its_stop_token``: tokens [2, 3, 4] and no stop reason,
  not [2, 3, 4, 5] and "stop";
- ``constraints_allowed_prefix_leaves_the_draft_advanced``: a second ``allowed_prefix`` sees
  the first draft as committed;
- ``constraints_call_may_open_inside_reasoning``: the call marker allowed in the reasoning
  block, where it opens a call;
- ``glm_clear_thinking_keeps_the_older_reasoning``: ``clear_thinking`` keeps the old turn's
  reasoning and drops the last one's;
- ``dsml_cut_block_start_of_the_ascii_spelling_kept_as_text``: a final "<DSML" as text, not
  an unterminated call;
- ``snapshot_checksum_ignores_the_array_bytes``: a flipped byte of an array loads;
- ``kvcache_unreadable_file_stays_indexed``: the disk tier keeps a corrupt file's tokens;
- ``spec_loop_draft_longer_than_the_option_allows``: a draft of 8 asked for with
  ``max_draft=2``; ``spec_loop_verify_passes_not_counted``: 0 verify passes for 3;
- ``mtp_gap_equal_to_the_margin_stops_the_draft``: logits 3, 1 with margin 2 draft nothing;
- ``policy_use_order_not_recorded``: the expert used last is evicted, not the one used before;
- ``streamed_prefetch_use_not_counted``: 0 prefetches used for 2;
- ``streamed_hotlist_written_without_being_asked``: ``--expert-hotlist`` without
  ``--save-expert-hotlist`` rewrites the file;
- ``reader_unsupported_expert_type_accepted``: a Q5_0 expert tensor accepted;
- ``quants_row_code_of_127_refused``: no row codes for a Q8_0 block holding 127;
- ``gguf_reader_int16_metadata_read_unsigned``: an INT16 -3 read as 65533;
- ``perplexity_error_divides_by_the_count``: 3.483234 for 4.266074;
- ``distributed_given_seed_replaced_by_a_drawn_one``: seed 5 replaced by rank 0's draw.
The set itself was not run here.

Test selection as in fresh5 to fresh8 (``base.in_*_folder``): the whole ``tests/`` folder of
the mutated code's package, with ``-x``; the engine's folder holds its chat templates' and KV
cache's tests too.
"""

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
        "return None if float(gap) < margin else int(best)",
        "return None if float(gap) <= margin else int(best)",
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
