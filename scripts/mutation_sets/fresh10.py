"""The tenth fresh run (issue 37's acceptance: "a fresh mutation run next time, with mutations
this issue does not name, catches >= 90 %"). Plausible one-line bugs in guard and logic code
(off-by-ones, flipped comparisons, an element dropped from a set or tuple, a wrong default or
constant, swapped values, a missing early return, a counter or flag not updated, a wrong key, a
wrong field of a response, an elif branch taken for another), written from the code under
``ds4mlx/`` alone, without opening anything under ``tests/`` or any mutation report, in the
code earlier sets touched least (a listing of each file with the lines earlier mutations change
marked): the agent's files, compaction, model states, tool schemas, mentions, prompt history,
conversations, symbols, slash commands, OpenAI backend, tools and git checkpoints; the server's
errors, metrics, request fields and parsing, tool choice, utility routes, app, chat chunks,
Anthropic history, Responses input and status, and queue admission; the engine's chat events,
tokenizer (byte map, metadata, id lists, numeric tokenizer), state codec, argument stream,
stream parser, tool-call ids, call constraint, JSON constraint, DeepSeek and GLM templates and
grammars, the disk tier's warnings and the stepped generation; the speculative loop, drafting
scheduler, MTP drafter and drafter files; the expert stats, resident store, slot policy and
streamed store (budget, hits, hot-list, prefetch flag; not the staging room); the GGUF
quantizer, writer and reader; the command line's perplexity, logprobs, plan and agent flags. No
behaviour issue 37 lists is mutated (clip and bounded-output splits, undo of two edits, LRU
order, fingerprints in file names, the staging room, fields ending at end of file, the data
section's alignment, special tokens kept as text, permission prefixes, confinement, access keys
and body limits).

Checked against every earlier set (core, guards, fresh2 to fresh9, hardened_agent, hardened_cli,
hardened_engine, hardened_experts, hardened_gguf, hardened_server, hardened_speculation and
hardened2_ag_loop, hardened2_ag_ui, hardened2_eng, hardened2_gguf_spec, hardened2_sv_api,
hardened2_sv_turn: 3,502 mutations, in this worktree and on main's ``scripts/mutation_sets/``)
by a script that applies each mutation here and each earlier one to today's code and diffs the
results line by line: each mutation here applies exactly once, no name is reused, none gives the
same file as an earlier mutation, none changes (or deletes) a line an earlier mutation changes,
and no two here share a line. The first draft had two that the script caught and that were
replaced: the completions ``suffix`` refusal dropped (its ``if`` line is hardened_server's
``completion_empty_suffix_refused``) and the REPL's ``/clear`` losing the system prompt (the
same mutation, same name, as hardened_cli's).

Left out while writing, of the candidates read off the code:
- Exact duplicates: the two above (replaced).
- Near duplicates, 12 (the same bug as another, here or earlier, on a neighbouring field, role,
  command or line): ``/hints`` toggling nothing (beside ``/think``); the ``read`` tool's path
  not required (beside ``list``'s); DeepSeek's developer role dropped (beside the tool role);
  ``dequantize`` not reporting the tensor loaded (beside ``load_weight``); the hot-list warm
  start's ``read += 1`` (beside the ``warm_loaded`` line earlier sets change); the policy's age
  sign (beside its ``hotness`` line); the streamed store's ``lookup >= 0`` as ``> 0`` (fresh8's
  slot-0 bug); GLM's last user found with ``min`` (beside fresh9's clear-thinking mutation);
  compaction's task budget capped (fresh8's summary budget); the call constraint's allowed and
  open masks swapped (beside fresh9's call opening inside reasoning); a stream parser's feed
  keeping the forced prefix's events (beside fresh9's ``chat_forced_prefix_events_lost``); the
  snapshot checksum without dtypes and shapes (beside fresh9's array bytes).
- Equivalent or as good as equivalent, 15: a plain ``list`` dropped from the request errors'
  union tags (written first, then run: pydantic tags these models' members ``list[str]``, never
  ``list``, and no body tried changed: message content, ``stop``, tool parameters); the
  speculative loop's ``temperature == 0`` as ``<= 0`` (negative temperatures are refused) and
  its confidence cut without ``not threshold`` (no confidence is below 0); ``with_choices``
  without its ``n == 1`` shortcut (one choice answers the same); the project instructions
  without the ``exists`` test (``read_regular``'s FileNotFoundError is caught alike); mention
  completion without ``if not names`` (the common prefix of nothing is "", then None);
  ``quantize`` without its NaN test (NaN still ends in the overflow ValueError); ``_show_lines``'
  ``min(end, len(lines))`` (slicing clamps); the edit's replace count (a repeated ``old`` is
  refused before); ``top_p`` applied at 1.0 and the penalties applied at their neutral values
  (the row is unchanged); ``common_prefix``'s early return for 0; the markup filter's tie on
  opener length (no two openers match at one position); DeepSeek's ``index > last_user`` as
  ``>=`` (an assistant turn is never the last user turn); the snapshot header's ``< 8`` as
  ``<= 8`` (an 8-byte file fails the length test next).
- Would hang rather than fail: none written (the parsers' and filters' loop conditions were
  passed over for that reason).
- Too close to what issue 37 names, 7: ``BoundedOutput``'s head and tail (bounded output);
  DeepSeek's parameter values written as caller text or template and the tokenizer's
  ``special=`` and ``encode_special_tokens`` (special tokens kept as text); the prompt cache's
  ``move_to_end`` and ``path_for`` (LRU order, fingerprints in file names); the expert read's
  offset (fresh8 and fresh9 left it out too).
- Others as weaker or to keep the brief's shares (agent 20 %, server 20 %, engine 25 %,
  speculation 10 %, experts 10 %, GGUF 8 %, CLI 7 %), e.g. the speculative stats' acceptance
  rate inverted, a new request capping a cannot-pay pause, the streamed store's minimum from
  the fewest experts used, the pipelined decoder's room one token past the budget, the event
  notes' warning flags, the perplexity error's ``count < 2``.

The 86 written: agent 17, server 17, engine 21, speculation 9, experts 9, GGUF 7, CLI 6. Each
applies (``--list``). 78 were run with and without the change (a copy of the package with the
mutation applied, a few lines each: fakes for a tokenizer, an agent, an OpenAI client, a
service and a model session, a Textual pilot, Starlette's TestClient, small GGUF files
written with ``write_gguf``); each behaved differently, e.g.:
- ``files_socket_open_error_escapes_as_os_error``: OSError (ENXIO) for a Unix socket, not a
  ToolError;
- ``mentions_refused_mention_changes_the_prompt``: "look @missing.txt" becomes
  "look @missing.txt\\n\\n";
- ``prompt_history_down_walks_past_the_draft``: Down at the draft, then Up: IndexError;
- ``symbols_depth_grows_through_plain_nodes``: a function under ``if True:`` at depth 2, not 0;
  ``symbols_c_typedef_names_lost``: ``typedef int myint;`` not listed;
- ``compaction_task_is_the_first_request``: the kept task is "user0", not "user5";
- ``kv_state_restored_through_a_backend_without_states``: AttributeError instead of "";
- ``prompt_input_ctrl_j_sends_the_prompt``: Ctrl+J in "ab" leaves "ab", not "ab\\n";
- ``tools_outline_of_a_file_needs_a_name``: "no definitions" for a file defining ``f``;
- ``checkpoints_ignored_files_snapshotted``: a git-ignored file bash wrote makes the snapshot
  fail (CheckpointError) instead of being left out;
- ``commands_think_without_argument_keeps_the_setting``: "/think" says "thinking off";
- ``backend_empty_tool_list_sent``: ``tools=[]`` sent to the server for no tools;
  ``backend_first_token_time_overwritten``: a prefill of 0.6 s for chunks 0.2 s apart, not 0.2;
- ``tool_choice_unoffered_named_function_accepted``: NamedTool("x") with only "a" offered;
- ``request_non_object_body_blamed_on_no_field``: "invalid '': ..." for a JSON array body;
- ``request_top_k_ignored``: ``top_k`` 3 sampled with 0;
- ``utility_tokenize_piece_id_under_the_wrong_key``: ``{"token": 322, ...}`` pieces, not
  ``{"id": 322, ...}``; ``utility_props_min_p_shows_top_p``: ``min_p`` 0.9 for 0.05;
- ``chat_stream_text_and_reasoning_keys_swapped``: a text chunk's delta under
  ``reasoning_content``; ``responses_incomplete_reason_misnamed``: "max_tokens";
- ``responses_each_assistant_item_starts_a_message``: reasoning and its function call become
  two assistant messages;
- ``metrics_ttft_sum_keeps_the_last``: a TTFT sum of 2.0 for 1.0 and 2.0;
- ``anthropic_thinking_history_refused``: a ``thinking`` block in history answered 400;
- ``tokenizer_byte_map_shifted_by_the_byte``: byte 0x82 spelled 'Ƃ', not 'Ĥ';
- ``token_ids_text_between_ids_skipped``: "1 x 2" read as [1, 2];
- ``numeric_tokenizer_chunks_of_four_bytes``: [781, 353, 2] for "hello world", not
  [322, 114, 100];
- ``state_codec_float_field_cannot_be_saved``: StateFormatError for ``{"a": 1.5}``;
- ``chat_parser_keeps_parsing_after_finish``: text after ``finish`` still reported;
- ``deepseek_forced_prefix_without_a_generation_prompt``: the forced DSML opening ends a
  prompt rendered without a generation prompt;
- ``dsml_block_without_a_blank_line_not_parsed``: "ok<｜DSML｜tool_calls>..." gives text, no
  call; ``glm_developer_message_rendered_as_user``: ``<|user|>D`` for a developer "D";
- ``constraints_last_token_outside_a_call_not_recorded``: the marker token stays banned
  after the newline that may open a call;
- ``kvcache_first_failing_write_not_warned``: 0 warnings after one failing write, not 1;
- ``scheduler_cost_pause_applies_to_sampled_requests``: a PLAIN cycle, not DRAFT, for a
  sampled request on a paused meter; ``scheduler_cannot_pay_bound_without_the_target_token``:
  5.5 plain tokens' time a cycle with 4 drafted judged unable to pay;
- ``speculation_lookup_replaces_the_learned_drafter``: a LookupDrafter, not a LookupExtension,
  for ``--lookup`` with a learned drafter; ``tokenizer_add_eos_read_from_add_bos``: a file
  with only ``add_bos_token`` appends EOS;
- ``check_drafter_nextn_model_asked_for_a_support_file``: a GLM file with its nextn block
  refused for ``--mtp`` ("needs its drafter file");
- ``streamed_hits_count_every_expert``: 10 hits for 7; ``streamed_hotlist_saved_coldest_first``:
  experts [0, 2, 1] for [1, 2, 0]; ``streamed_layer_without_staging_claims_prefetch``: True
  with no staging;
- ``quantize_k_quant_scale_overflow_unreported``: values near 1e9 quantized to Q4_K instead of
  a ValueError; ``quantize_iq2_xxs_sign_parity_inverted``: mean error 0.446, not 0.253;
- ``writer_q4_k_file_type_small``: ``general.file_type`` 14 for 15;
- ``perplexity_chunks_beyond_the_text``: 20 chunks of 10 in 100 tokens;
  ``logprobs_top_lists_the_least_likely``: the top token 0 (logit 0), not 1 (logit 3).
The other 8 were reasoned out on the code: ``app_unknown_model_generates`` (a request naming
another model generates instead of a 404), ``queue_admits_past_the_session_count`` (the room
ignores the jobs running), ``generate_batched_step_leaves_the_drafter_attached`` (a
speculative decoder keeps drafting after a batched step its drafter never saw),
``spec_loop_drafter_told_one_row_short`` (the drafter gets one row fewer than tokens: MTP's
``observe`` raises), ``spec_loop_parity_bound_one_row_long`` (a draft one row past the model's
bit-exact verify rows), ``mtp_rowless_observe_one_position_short`` (the next ``observe`` fails
its position check), ``mtp_draft_positions_one_early`` (draft tokens at the committed token's
position) and ``plan_wired_limit_hint_only_past_all_memory`` (a resident verdict needs at most
85 % of the memory, so the hint, shown above 75 %, never is).
The set itself was not run here.

Test selection as in fresh5 to fresh9, mechanical: ``base.in_*_folder``, each mutated package's
whole ``tests/`` folder with ``-x`` (the engine's holds its templates' and KV cache's tests).
"""

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
        "self.products = 0.0\n        self.samples = 0",
        "self.products = 0.0",
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
