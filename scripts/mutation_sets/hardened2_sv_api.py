"""Mutations checked by hand while hardening tests/server's API files a second time (issue 37,
session 18): one-line bugs on lines no earlier set changes, in the chat completions adapter
(history fields, default switches, every field of a response, the stream's chunks of one and of
several choices and its error frame), the utility routes (tokenize defaults, detokenize and
count_tokens refusals, every field of /props, the metrics content type), the two error shapes,
the SSE frames' bytes, request bodies, request limits, the choices' split and merge, and the
responses and messages adapters' remaining fields (assistant items joined, effort, token limit,
stop, store and previous id echoed, a cut call's item, tool descriptions, parallel calls), the
completions adapter's (token limit, stop, logprob tokens, usage of several choices, chunk index)
and two access checks (--cors, x-api-key).

Each was applied alone and fails a test of tests/server (checked with the test files that
guard it: test_chat_adapter_fields, test_utility_route_fields, test_wire_shapes,
test_choices_split, test_responses_adapter, test_messages_adapter, test_completions_adapter,
test_access_rules).

Left out as equivalent: the chat stream's ``arguments = ""`` for a call that opens (its block's
text is still empty, so the piece already says ""); the Messages response's tool_use ``input``
for an unfinished call (a response holds only complete calls, the stream replaces it with {}).
Left out as on a line an earlier set changes (their tests were written anyway): a negative
detokenize id, slots counted from the queue, a non-numeric Content-Length trusted, and five
Responses stream/summary lines.

The 3 entries found identical to fresh9's (written the same afternoon by the
blind writer, who never saw these) were taken out of this set: fresh9 keeps them.
"""

from __future__ import annotations

from mutation_sets.base import (
    ACCESS_PY,
    ANTHROPIC_PY,
    BODY_PY,
    CHOICES_PY,
    COMPLETIONS_PY,
    ERRORS_PY,
    LIMITS_PY,
    OPENAI_CHAT_PY,
    RESPONSES_PY,
    SSE_PY,
    UTILITY_PY,
    Mutation,
    in_server_folder,
)

MUTATIONS: tuple[Mutation, ...] = (
    in_server_folder(
        "chat_function_arguments_default_empty",
        OPENAI_CHAT_PY,
        'arguments: str | dict[str, Any] = "{}"',
        'arguments: str | dict[str, Any] = ""',
    ),
    in_server_folder(
        "chat_stream_usage_by_default",
        OPENAI_CHAT_PY,
        "include_usage: bool = False",
        "include_usage: bool = True",
    ),
    in_server_folder(
        "chat_parallel_calls_off_by_default",
        OPENAI_CHAT_PY,
        "parallel_tool_calls: bool = True",
        "parallel_tool_calls: bool = False",
    ),
    in_server_folder(
        "chat_history_call_id_dropped",
        OPENAI_CHAT_PY,
        '"id": call.id,',
        '"id": None,',
    ),
    in_server_folder(
        "chat_empty_tool_call_id_dropped",
        OPENAI_CHAT_PY,
        "if message.tool_call_id is not None:",
        "if message.tool_call_id:",
    ),
    in_server_folder(
        "chat_history_reasoning_from_content",
        OPENAI_CHAT_PY,
        'converted["reasoning_content"] = message.reasoning_content',
        'converted["reasoning_content"] = message.content',
    ),
    in_server_folder(
        "chat_tool_call_type_tool",
        OPENAI_CHAT_PY,
        '"type": "function",\n        "function": {"name": block.name',
        '"type": "tool",\n        "function": {"name": block.name',
    ),
    in_server_folder(
        "chat_empty_reasoning_field_sent",
        OPENAI_CHAT_PY,
        "if reasoning:\n",
        "if reasoning is not None:\n",
    ),
    in_server_folder(
        "chat_empty_tool_calls_field_sent",
        OPENAI_CHAT_PY,
        "if calls:\n",
        "if calls is not None:\n",
    ),
    in_server_folder(
        "chat_choice_index_zero",
        OPENAI_CHAT_PY,
        '"index": index,\n        "message"',
        '"index": 0,\n        "message"',
    ),
    in_server_folder(
        "chat_tools_kept_with_choice_none",
        OPENAI_CHAT_PY,
        'if tool_choice != "none"',
        "if tool_choice",
    ),
    in_server_folder(
        "chat_template_kwargs_ignored",
        OPENAI_CHAT_PY,
        "request.chat_template_kwargs.enable_thinking if request.chat_template_kwargs else None",
        "None",
    ),
    in_server_folder(
        "chat_response_format_param",
        OPENAI_CHAT_PY,
        'response_format.type, response_format.json_schema, "response_format"',
        'response_format.type, response_format.json_schema, "format"',
    ),
    in_server_folder(
        "chat_object_name_chunk",
        OPENAI_CHAT_PY,
        '"object": "chat.completion",',
        '"object": "chat.completion.chunk",',
    ),
    in_server_folder(
        "chat_id_prefix_without_dash",
        OPENAI_CHAT_PY,
        '"id": new_id("chatcmpl-"),',
        '"id": new_id("chatcmpl"),',
    ),
    in_server_folder(
        "chat_logprobs_false_sends_logprobs",
        OPENAI_CHAT_PY,
        "bool(request.logprobs)",
        "request.logprobs is not None",
    ),
    in_server_folder(
        "chat_stream_one_choice",
        OPENAI_CHAT_PY,
        "return chunk_stream(ChatCompletionStream, meta, include_usage, request.n)",
        "return chunk_stream(ChatCompletionStream, meta, include_usage, 1)",
    ),
    in_server_folder(
        "chat_logprobs_top_zero_none",
        OPENAI_CHAT_PY,
        "return sampling if top is None else",
        "return sampling if not top else",
    ),
    in_server_folder(
        "chat_logprob_bytes_of_text",
        OPENAI_CHAT_PY,
        '"bytes": list(piece)',
        '"bytes": list(text.encode())',
    ),
    in_server_folder(
        "chat_logprobs_refusal_dropped",
        OPENAI_CHAT_PY,
        '        "refusal": None,\n',
        "",
    ),
    in_server_folder(
        "chunk_stream_id_not_shared",
        OPENAI_CHAT_PY,
        "self.id = stream_id or new_id(self.id_prefix)",
        "self.id = new_id(self.id_prefix)",
    ),
    in_server_folder(
        "chunk_choices_index_zero",
        OPENAI_CHAT_PY,
        "stream_class(meta, include_usage, i, shared) for i in range(n)",
        "stream_class(meta, include_usage, 0, shared) for i in range(n)",
    ),
    in_server_folder(
        "chunk_stream_error_message_only",
        OPENAI_CHAT_PY,
        "return [data_frame(openai_error_body(error))]",
        'return [data_frame({"error": error.message})]',
    ),
    in_server_folder(
        "choices_stream_error_dropped",
        OPENAI_CHAT_PY,
        "return self.choices[0].error(error)",
        "return []",
    ),
    in_server_folder(
        "choices_stream_choice_finish_closes",
        OPENAI_CHAT_PY,
        "return choice.finish_choice(event.event)",
        "return choice.finish(event.event)",
    ),
    in_server_folder(
        "chat_finish_delta_none",
        OPENAI_CHAT_PY,
        '"delta": content or {},',
        '"delta": content,',
    ),
    in_server_folder(
        "chat_first_chunk_without_content",
        OPENAI_CHAT_PY,
        '{"role": "assistant", "content": ""}',
        '{"role": "assistant"}',
    ),
    in_server_folder(
        "chat_argument_delta_index_zero",
        OPENAI_CHAT_PY,
        'piece = {"index": index, "function": {"arguments": text}}',
        'piece = {"index": 0, "function": {"arguments": text}}',
    ),
    in_server_folder(
        "chunk_empty_logprobs_sent",
        OPENAI_CHAT_PY,
        "        if self.pending_logprobs:\n            choice[",
        "        if self.pending_logprobs is not None:\n            choice[",
    ),
    in_server_folder(
        "chat_finish_reason_stop_named_end",
        OPENAI_CHAT_PY,
        '"stop": "stop",',
        '"stop": "end_turn",',
    ),
    in_server_folder(
        "util_tokenize_adds_special_by_default",
        UTILITY_PY,
        "add_special: bool = False",
        "add_special: bool = True",
    ),
    in_server_folder(
        "util_tokenize_special_as_text_by_default",
        UTILITY_PY,
        "parse_special: bool = True",
        "parse_special: bool = False",
    ),
    in_server_folder(
        "util_count_tokens_needs_max_tokens",
        UTILITY_PY,
        "max_tokens: int = Field(1, ge=1)",
        "max_tokens: int = Field(ge=1)",
    ),
    in_server_folder(
        "util_detokenize_param_without_index",
        UTILITY_PY,
        'param=f"tokens[{index}]",',
        'param="tokens",',
    ),
    in_server_folder(
        "util_props_model_path_none_as_text",
        UTILITY_PY,
        '"model_path": str(path) if path is not None else None,',
        '"model_path": str(path),',
    ),
    in_server_folder(
        "util_props_alias_path",
        UTILITY_PY,
        '"model_alias": self.model_id,',
        '"model_alias": str(path),',
    ),
    in_server_folder(
        "util_props_vision",
        UTILITY_PY,
        '"modalities": {"vision": False, "audio": False},',
        '"modalities": {"vision": True, "audio": False},',
    ),
    in_server_folder(
        "util_props_build_info",
        UTILITY_PY,
        'f"ds4mlx {ds4mlx.__version__}"',
        'f"ds4mlx"',
    ),
    in_server_folder(
        "util_props_seed_none",
        UTILITY_PY,
        '"seed": -1 if sampling.seed is None else sampling.seed,',
        '"seed": sampling.seed,',
    ),
    in_server_folder(
        "util_props_penalty_window",
        UTILITY_PY,
        '"repeat_last_n": sampling.repeat_last_n,',
        '"repeat_last_n": self.service.max_context,',
    ),
    in_server_folder(
        "util_props_presence_is_frequency",
        UTILITY_PY,
        '"presence_penalty": sampling.presence_penalty,',
        '"presence_penalty": sampling.frequency_penalty,',
    ),
    in_server_folder(
        "util_props_thinking",
        UTILITY_PY,
        '"enable_thinking": self.defaults.thinking,',
        '"enable_thinking": False,',
    ),
    in_server_folder(
        "util_props_chat_template_none",
        UTILITY_PY,
        "chat_format.name if chat_format is not None else None",
        'chat_format.name if chat_format is not None else ""',
    ),
    in_server_folder(
        "util_metrics_plain_text",
        UTILITY_PY,
        'media_type="text/plain; version=0.0.4"',
        'media_type="text/plain"',
    ),
    in_server_folder(
        "errors_403_type",
        ERRORS_PY,
        '403: "permission_error",',
        '403: "forbidden_error",',
    ),
    in_server_folder(
        "errors_400_type",
        ERRORS_PY,
        '400: "invalid_request_error",',
        '400: "bad_request_error",',
    ),
    in_server_folder(
        "errors_openai_code_dropped",
        ERRORS_PY,
        '"code": error.code,',
        '"code": None,',
    ),
    in_server_folder(
        "errors_openai_server_type",
        ERRORS_PY,
        '"server_error" if error.is_server_fault',
        '"api_error" if error.is_server_fault',
    ),
    in_server_folder(
        "errors_anthropic_default_type",
        ERRORS_PY,
        '_ANTHROPIC_TYPES.get(error.status, "invalid_request_error")',
        '_ANTHROPIC_TYPES.get(error.status, "api_error")',
    ),
    in_server_folder(
        "errors_exception_text_empty",
        ERRORS_PY,
        "super().__init__(message)",
        "super().__init__()",
    ),
    in_server_folder(
        "errors_anthropic_message",
        ERRORS_PY,
        '"error": {"type": error_type, "message": error.message}}',
        '"error": {"type": error_type, "message": str(error.status)}}',
    ),
    in_server_folder(
        "sse_done_one_newline",
        SSE_PY,
        'DONE_FRAME = b"data: [DONE]\\n\\n"',
        'DONE_FRAME = b"data: [DONE]\\n"',
    ),
    in_server_folder(
        "sse_ascii_escapes",
        SSE_PY,
        "ensure_ascii=False",
        "ensure_ascii=True",
    ),
    in_server_folder(
        "sse_spaced_separators",
        SSE_PY,
        'separators=(",", ":")',
        'separators=(", ", ": ")',
    ),
    in_server_folder(
        "choices_reasoning_first_only",
        CHOICES_PY,
        "reasoning_tokens=sum(f.reasoning_tokens for f in finished),",
        "reasoning_tokens=first.reasoning_tokens,",
    ),
    in_server_folder(
        "choices_keepalive_tagged",
        CHOICES_PY,
        "                yield item\n                continue\n",
        "                yield item\n",
    ),
    in_server_folder(
        "choices_split_request_finish",
        CHOICES_PY,
        "choices[event.index] = (own, event.event)",
        "choices[event.index] = (own, finished)",
    ),
    in_server_folder(
        "choices_calls_keep_seed",
        CHOICES_PY,
        "call.sampling, seed=choice_seed(call.sampling.seed, index)",
        "call.sampling, seed=call.sampling.seed",
    ),
    in_server_folder(
        "body_chunks_not_accumulated",
        BODY_PY,
        "body += chunk",
        "body = bytearray(chunk)",
    ),
    in_server_folder(
        "body_disconnect_not_caught",
        BODY_PY,
        "except ClientDisconnect:",
        "except ConnectionError:",
    ),
    in_server_folder(
        "limits_no_byte_bound_checked",
        LIMITS_PY,
        "        if self.bytes_per_token is None:\n            return\n",
        "",
    ),
    in_server_folder(
        "limits_render_type_error_escapes",
        LIMITS_PY,
        "except (ValueError, TypeError, TokenizerError) as exc:",
        "except (ValueError, TokenizerError) as exc:",
    ),
    in_server_folder(
        "responses_not_stored_by_default",
        RESPONSES_PY,
        "store: bool = True",
        "store: bool = False",
    ),
    in_server_folder(
        "responses_parallel_off_by_default",
        RESPONSES_PY,
        "parallel_tool_calls: bool = True\n    max_output_tokens",
        "parallel_tool_calls: bool = False\n    max_output_tokens",
    ),
    in_server_folder(
        "responses_store_bound",
        RESPONSES_PY,
        "STORED_RESPONSES = 256",
        "STORED_RESPONSES = 255",
    ),
    in_server_folder(
        "responses_store_answers_conversation",
        RESPONSES_PY,
        "return None if item is None else item[0]",
        "return None if item is None else item[1]",
    ),
    in_server_folder(
        "responses_reasoning_item_not_assistant",
        RESPONSES_PY,
        'item.type in ("reasoning", "function_call")',
        'item.type in ("function_call",)',
    ),
    in_server_folder(
        "responses_assistant_text_replaced",
        RESPONSES_PY,
        'assistant["content"] += text',
        'assistant["content"] = text',
    ),
    in_server_folder(
        "responses_reasoning_replaced",
        RESPONSES_PY,
        'assistant["reasoning_content"] += _text(',
        'assistant["reasoning_content"] = _text(',
    ),
    in_server_folder(
        "responses_function_call_id_dropped",
        RESPONSES_PY,
        '"id": item.call_id,',
        '"id": None,',
    ),
    in_server_folder(
        "responses_unknown_item_param",
        RESPONSES_PY,
        'raise unsupported(f"{param}.type", f"input items',
        'raise unsupported(param, f"input items',
    ),
    in_server_folder(
        "responses_stored_reasoning_is_text",
        RESPONSES_PY,
        '"reasoning_content": "".join(b.text for b in blocks if b.kind == "reasoning"),',
        '"reasoning_content": "".join(b.text for b in blocks if b.kind == "text"),',
    ),
    in_server_folder(
        "responses_cut_call_completed",
        RESPONSES_PY,
        (
            'status = "incomplete" if block.kind == "tool_call" and block.call is None '
            'else "completed"'
        ),
        'status = "completed"',
    ),
    in_server_folder(
        "responses_call_item_type",
        RESPONSES_PY,
        '"type": "function_call",\n            "call_id"',
        '"type": "function",\n            "call_id"',
    ),
    in_server_folder(
        "responses_reasoning_summary_dropped",
        RESPONSES_PY,
        '            "summary": [],\n',
        "",
    ),
    in_server_folder(
        "responses_reasoning_part_type",
        RESPONSES_PY,
        '"content": [{"type": "reasoning_text", "text": block.text}],',
        '"content": [{"type": "text", "text": block.text}],',
    ),
    in_server_folder(
        "responses_message_role_dropped",
        RESPONSES_PY,
        '        "role": "assistant",\n        "status": status,\n',
        '        "status": status,\n',
    ),
    in_server_folder(
        "responses_input_tokens_less_cached",
        RESPONSES_PY,
        '"input_tokens": finished.prompt_tokens,',
        '"input_tokens": finished.prompt_tokens - finished.cached_tokens,',
    ),
    in_server_folder(
        "responses_output_tokens_less_reasoning",
        RESPONSES_PY,
        '"output_tokens": finished.completion_tokens,',
        '"output_tokens": finished.completion_tokens - finished.reasoning_tokens,',
    ),
    in_server_folder(
        "responses_object_name",
        RESPONSES_PY,
        '"object": "response",',
        '"object": "responses",',
    ),
    in_server_folder(
        "responses_error_field_dropped",
        RESPONSES_PY,
        '        "error": None,\n',
        "",
    ),
    in_server_folder(
        "responses_tools_not_echoed",
        RESPONSES_PY,
        '"tools": [tool.model_dump(exclude_none=True) for tool in request.tools or ()],',
        '"tools": [],',
    ),
    in_server_folder(
        "responses_store_echo_true",
        RESPONSES_PY,
        '"store": request.store,',
        '"store": True,',
    ),
    in_server_folder(
        "responses_previous_id_not_echoed",
        RESPONSES_PY,
        '"previous_response_id": request.previous_response_id,',
        '"previous_response_id": None,',
    ),
    in_server_folder(
        "responses_truncation_auto",
        RESPONSES_PY,
        '"truncation": "disabled",',
        '"truncation": "auto",',
    ),
    in_server_folder(
        "responses_metadata_none",
        RESPONSES_PY,
        '"metadata": {},',
        '"metadata": None,',
    ),
    in_server_folder(
        "responses_effort_ignored",
        RESPONSES_PY,
        "effort = request.reasoning.effort if request.reasoning else None",
        "effort = None",
    ),
    in_server_folder(
        "responses_effort_none_rendered",
        RESPONSES_PY,
        "reasoning_effort=template_effort(effort),",
        "reasoning_effort=effort,",
    ),
    in_server_folder(
        "responses_max_output_ignored",
        RESPONSES_PY,
        "max_tokens=token_limit(request.max_output_tokens, defaults),",
        "max_tokens=token_limit(None, defaults),",
    ),
    in_server_folder(
        "responses_stop_ignored",
        RESPONSES_PY,
        (
            "stop=stop_strings(request.stop),\n"
            "            thinking=resolve_thinking(request.thinking, effort"
        ),
        "stop=(),\n            thinking=resolve_thinking(request.thinking, effort",
    ),
    in_server_folder(
        "responses_unstreamed_not_stored",
        RESPONSES_PY,
        "        self._keep(request, response, blocks)\n        return response",
        "        return response",
    ),
    in_server_folder(
        "messages_call_prefix",
        ANTHROPIC_PY,
        'CALL_ID_PREFIX = "toolu_"',
        'CALL_ID_PREFIX = "tool_"',
    ),
    in_server_folder(
        "messages_one_call_by_default",
        ANTHROPIC_PY,
        "disable_parallel_tool_use: bool = False",
        "disable_parallel_tool_use: bool = True",
    ),
    in_server_folder(
        "messages_tool_result_role_user",
        ANTHROPIC_PY,
        '"role": "tool",',
        '"role": "user",',
    ),
    in_server_folder(
        "messages_auto_choice_needs_name",
        ANTHROPIC_PY,
        'if choice is not None and choice.type == "tool" and choice.name is None:',
        "if choice is not None and choice.name is None:",
    ),
    in_server_folder(
        "messages_tool_description_dropped",
        ANTHROPIC_PY,
        '"description": tool.description,',
        '"description": None,',
    ),
    in_server_folder(
        "messages_truncated_is_end_turn",
        ANTHROPIC_PY,
        '    if is_truncated(finished):\n        return "max_tokens"\n',
        "",
    ),
    in_server_folder(
        "messages_cache_creation_dropped",
        ANTHROPIC_PY,
        '        "cache_creation_input_tokens": 0,\n',
        "",
    ),
    in_server_folder(
        "messages_tool_use_type",
        ANTHROPIC_PY,
        '"type": "tool_use",\n            "id": block.call_id',
        '"type": "tool_call",\n            "id": block.call_id',
    ),
    in_server_folder(
        "messages_id_prefix",
        ANTHROPIC_PY,
        '"id": new_id("msg_"),',
        '"id": new_id("msg"),',
    ),
    in_server_folder(
        "messages_start_content_none",
        ANTHROPIC_PY,
        '            "content": [],\n            "stop_reason": None,',
        '            "content": None,\n            "stop_reason": None,',
    ),
    in_server_folder(
        "messages_stop_frame_dropped",
        ANTHROPIC_PY,
        '            self._frame("message_stop"),\n',
        "",
    ),
    in_server_folder(
        "messages_block_stop_index",
        ANTHROPIC_PY,
        'return [self._frame("content_block_stop", index=index)]',
        'return [self._frame("content_block_stop", index=0)]',
    ),
    in_server_folder(
        "completions_echo_default_on",
        COMPLETIONS_PY,
        "echo: bool = False",
        "echo: bool = True",
    ),
    in_server_folder(
        "completions_logprob_tokens_bytes",
        COMPLETIONS_PY,
        '"tokens": [entry.text for entry in entries],',
        '"tokens": [entry.token_bytes.decode(errors="replace") for entry in entries],',
    ),
    in_server_folder(
        "completions_offsets_dropped",
        COMPLETIONS_PY,
        '"text_offset": offsets,',
        '"text_offset": [],',
    ),
    in_server_folder(
        "completions_token_limit_default",
        COMPLETIONS_PY,
        "max_tokens=token_limit(request.max_tokens, defaults),",
        "max_tokens=token_limit(None, defaults),",
    ),
    in_server_folder(
        "completions_stop_ignored",
        COMPLETIONS_PY,
        "stop=stop_strings(request.stop),",
        "stop=(),",
    ),
    in_server_folder(
        "completions_id_prefix",
        COMPLETIONS_PY,
        '"id": new_id("cmpl-"),',
        '"id": new_id("cmpl"),',
    ),
    in_server_folder(
        "completions_object_name",
        COMPLETIONS_PY,
        '"object": "text_completion",\n            "created"',
        '"object": "completion",\n            "created"',
    ),
    in_server_folder(
        "completions_created_now",
        COMPLETIONS_PY,
        '"created": meta.created,',
        '"created": 0,',
    ),
    in_server_folder(
        "completions_text_of_other_choice",
        COMPLETIONS_PY,
        '"text": _text(own),',
        '"text": _text(events),',
    ),
    in_server_folder(
        "completions_usage_of_first",
        COMPLETIONS_PY,
        '"usage": chat_usage(finished),',
        '"usage": chat_usage(split_choices(events, finished)[0][1]),',
    ),
    in_server_folder(
        "completions_chunk_object",
        COMPLETIONS_PY,
        'object_name = "text_completion"',
        'object_name = "text_completion.chunk"',
    ),
    in_server_folder(
        "completions_chunk_prefix",
        COMPLETIONS_PY,
        'id_prefix = "cmpl-"',
        'id_prefix = "cmpl"',
    ),
    in_server_folder(
        "completions_chunk_offset_from_zero",
        COMPLETIONS_PY,
        "found = completion_logprobs(entries, self.sent_characters)",
        "found = completion_logprobs(entries)",
    ),
    in_server_folder(
        "completions_chunk_index_zero",
        COMPLETIONS_PY,
        '"index": self.index,',
        '"index": 0,',
    ),
    in_server_folder(
        "access_cors_ignored",
        ACCESS_PY,
        "if origin is not None and not self.cross_origin and not _same_origin(origin, headers):",
        "if origin is not None and not _same_origin(origin, headers):",
    ),
    in_server_folder(
        "access_x_api_key_ignored",
        ACCESS_PY,
        'return headers.get("x-api-key")',
        "return None",
    ),
)
