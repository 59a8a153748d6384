"""Mutations checked by hand while hardening tests/server (issue 37, session 17): one-line bugs
in the code the blind sets reach least, the Anthropic messages, completions and responses
adapters field by field (content blocks, joined thinking and text, tool_use without input,
empty system prompts and instructions, named tool choices, the stream frames and their fields,
logprobs and offsets, every field of the response objects, the response store's answers) and
a response_format of type text and a sampling refusal's message, and
the app's routes (paths with and without /v1, aliases, the model list, /v1/health, deleting a
stored response). None changes a line an earlier set changes.

Each was applied alone and fails a test of tests/server now (checked with the new test files
only). Before these tests: all 30 messages and 18 completions/chunk mutations tried survived
the direct-call test files (test_request_mapping, test_response_edges, test_bad_requests); the
responses and app ones were not measured before. Two candidates on lines fresh6 already changes
were dropped (chunk logprobs not cleared, a streamed response not stored).
Left out as equivalent: a named tool choice's empty name refused as missing (refused either
way, as not offered), a tool_use block of an unfinished call shown with input None (the stream
replaces it with {} and a response has only complete calls), a Responses stream's created
event listing blocks (none exist yet when it is sent).
"""

from __future__ import annotations

from mutation_sets.base import (
    ANTHROPIC_PY,
    APP_PY,
    COMPLETIONS_PY,
    GENERATION_PY,
    OPENAI_CHAT_PY,
    RESPONSES_PY,
    Mutation,
    in_server_folder,
)

MUTATIONS: tuple[Mutation, ...] = (
    in_server_folder(
        "messages_tool_result_id_none",
        ANTHROPIC_PY,
        '"tool_call_id": block.tool_use_id or "",',
        '"tool_call_id": block.tool_use_id,',
    ),
    in_server_folder(
        "messages_tool_result_param",
        ANTHROPIC_PY,
        'joined_text(block.content, f"{param}[{index}].content")',
        'joined_text(block.content, f"{param}[{index}]")',
    ),
    in_server_folder(
        "messages_user_text_none_kept",
        ANTHROPIC_PY,
        (
            '        elif block.type == "text" and block.text is not None:\n'
            "            messages.append"
        ),
        ('        elif block.type == "text":\n            messages.append'),
    ),
    in_server_folder(
        "messages_thinking_not_joined",
        ANTHROPIC_PY,
        'message["reasoning_content"] += block.thinking or ""',
        'message["reasoning_content"] = block.thinking or ""',
    ),
    in_server_folder(
        "messages_tool_use_name_check",
        ANTHROPIC_PY,
        "            if block.name is None:\n",
        "            if block.name is None and block.id is None:\n",
    ),
    in_server_folder(
        "messages_tool_use_name_param",
        ANTHROPIC_PY,
        'param=f"{param}[{index}].name",',
        'param=f"{param}[{index}]",',
    ),
    in_server_folder(
        "messages_tool_use_input_none",
        ANTHROPIC_PY,
        '"arguments": block.input or {}}}',
        '"arguments": block.input}}',
    ),
    in_server_folder(
        "messages_assistant_text_none",
        ANTHROPIC_PY,
        (
            '        elif block.type == "text" and block.text is not None:\n'
            '            message["content"]'
        ),
        ('        elif block.type == "text":\n            message["content"]'),
    ),
    in_server_folder(
        "messages_system_empty",
        ANTHROPIC_PY,
        "    if request.system:\n",
        "    if request.system is not None:\n",
    ),
    in_server_folder(
        "messages_tool_choice_name_any_type",
        ANTHROPIC_PY,
        'choice.name if choice is not None and choice.type == "tool" else None,',
        "choice.name if choice is not None else None,",
    ),
    in_server_folder(
        "messages_tools_kept_for_none",
        ANTHROPIC_PY,
        '    if tool_choice == "none" or not request.tools:\n',
        "    if not request.tools:\n",
    ),
    in_server_folder(
        "messages_tool_description_none_kept",
        ANTHROPIC_PY,
        "{k: v for k, v in function.items() if v is not None}",
        "{k: v for k, v in function.items()}",
    ),
    in_server_folder(
        "messages_usage_output",
        ANTHROPIC_PY,
        '"output_tokens": finished.completion_tokens,',
        '"output_tokens": finished.completion_tokens - finished.reasoning_tokens,',
    ),
    in_server_folder(
        "messages_usage_cache_read",
        ANTHROPIC_PY,
        '"cache_read_input_tokens": finished.cached_tokens,',
        '"cache_read_input_tokens": 0,',
    ),
    in_server_folder(
        "messages_thinking_signature",
        ANTHROPIC_PY,
        '{"type": "thinking", "thinking": block.text, "signature": ""}',
        '{"type": "thinking", "thinking": block.text}',
    ),
    in_server_folder(
        "messages_stop_sequences_default",
        ANTHROPIC_PY,
        "stop=tuple(request.stop_sequences or ()),",
        'stop=tuple(request.stop_sequences or ("\\n\\nHuman:",)),',
    ),
    in_server_folder(
        "messages_thinking_default",
        ANTHROPIC_PY,
        "thinking=resolve_thinking(request.thinking, None, defaults.thinking),",
        "thinking=resolve_thinking(request.thinking, None, False),",
    ),
    in_server_folder(
        "messages_response_stop_sequence",
        ANTHROPIC_PY,
        (
            '            "stop_sequence": finished.stop_sequence,\n'
            '            "usage": _usage(finished),'
        ),
        ('            "stop_sequence": None,\n            "usage": _usage(finished),'),
    ),
    in_server_folder(
        "messages_stream_start_input_tokens",
        ANTHROPIC_PY,
        '"usage": {"input_tokens": self.meta.prompt_tokens, "output_tokens": 0},',
        '"usage": {"input_tokens": 0, "output_tokens": 0},',
    ),
    in_server_folder(
        "messages_stream_open_thinking_empty",
        ANTHROPIC_PY,
        ('| {"reasoning": {"thinking": ""}, "text": {"text": ""}, "tool_call": {"input": {}}}['),
        '| {"reasoning": {}, "text": {"text": ""}, "tool_call": {"input": {}}}[',
    ),
    in_server_folder(
        "messages_stream_delta_thinking_type",
        ANTHROPIC_PY,
        '"reasoning": {"type": "thinking_delta", "thinking": text},',
        '"reasoning": {"type": "text_delta", "thinking": text},',
    ),
    in_server_folder(
        "messages_stream_delta_json",
        ANTHROPIC_PY,
        '"tool_call": {"type": "input_json_delta", "partial_json": text},',
        '"tool_call": {"type": "input_json_delta", "partial_json": block.text},',
    ),
    in_server_folder(
        "messages_stream_finish_stop_sequence",
        ANTHROPIC_PY,
        ('                    "stop_sequence": finished.stop_sequence,\n                },'),
        ('                    "stop_sequence": None,\n                },'),
    ),
    in_server_folder(
        "messages_stream_finish_close",
        ANTHROPIC_PY,
        (
            "            *self.close_open_block(),\n"
            "            self._frame(\n"
            '                "message_delta",'
        ),
        ('            self._frame(\n                "message_delta",'),
    ),
    in_server_folder(
        "messages_stream_error_shape",
        ANTHROPIC_PY,
        'return [event_frame("error", anthropic_error_body(error))]',
        'return [event_frame("error", {"error": error.message})]',
    ),
    in_server_folder(
        "messages_response_type",
        ANTHROPIC_PY,
        (
            '            "type": "message",\n'
            '            "role": "assistant",\n'
            '            "model": meta.model,'
        ),
        (
            '            "type": "message",\n'
            '            "role": "assistant",\n'
            '            "model": request.model,'
        ),
    ),
    in_server_folder(
        "messages_stream_model",
        ANTHROPIC_PY,
        '            "model": self.meta.model,',
        '            "model": "",',
    ),
    in_server_folder(
        "messages_string_content",
        ANTHROPIC_PY,
        '[ContentBlock(type="text", text=message.content)]',
        '[ContentBlock(type="text", text=message.content.strip())]',
    ),
    in_server_folder(
        "completion_best_of_one_refused",
        COMPLETIONS_PY,
        "if (request.best_of or 1) != 1:",
        "if request.best_of is not None:",
    ),
    in_server_folder(
        "completion_empty_suffix_refused",
        COMPLETIONS_PY,
        "        if request.suffix:\n",
        "        if request.suffix is not None:\n",
    ),
    in_server_folder(
        "completion_response_format_param",
        COMPLETIONS_PY,
        (
            "                response_format.type, response_format.json_schema,"
            ' "response_format"\n'
            "            )\n"
            "            if response_format is not None\n"
            "            else None,\n"
            "        )\n"
            "        return with_choices(call, request.n)"
        ),
        (
            '                response_format.type, response_format.json_schema, "format"\n'
            "            )\n"
            "            if response_format is not None\n"
            "            else None,\n"
            "        )\n"
            "        return with_choices(call, request.n)"
        ),
    ),
    in_server_folder(
        "completion_top_logprobs_swapped",
        COMPLETIONS_PY,
        "{text: value for text, _, value in entry.top}",
        "{text: entry.logprob for text, _, value in entry.top}",
    ),
    in_server_folder(
        "completion_token_logprobs",
        COMPLETIONS_PY,
        '"token_logprobs": [entry.logprob for entry in entries],',
        '"token_logprobs": [entry.logprob for entry in entries[:1]],',
    ),
    in_server_folder(
        "completion_response_model",
        COMPLETIONS_PY,
        (
            '            "model": meta.model,\n'
            '            "choices": [\n'
            "                {\n"
            '                    "index": index,'
        ),
        (
            '            "model": request.model,\n'
            '            "choices": [\n'
            "                {\n"
            '                    "index": index,'
        ),
    ),
    in_server_folder(
        "completion_finish_reason_request",
        COMPLETIONS_PY,
        '"finish_reason": FINISH_REASONS[own_finished.finish_reason],',
        '"finish_reason": FINISH_REASONS[finished.finish_reason],',
    ),
    in_server_folder(
        "completion_stream_usage_default",
        COMPLETIONS_PY,
        (
            "        include_usage = bool(request.stream_options and"
            " request.stream_options.include_usage)\n"
            "        return chunk_stream(CompletionStream"
        ),
        (
            "        include_usage = request.stream_options is not None\n"
            "        return chunk_stream(CompletionStream"
        ),
    ),
    in_server_folder(
        "completion_stream_offset_start",
        COMPLETIONS_PY,
        "self.sent_characters = 0  # of the text",
        "self.sent_characters = 1  # of the text",
    ),
    in_server_folder(
        "completion_stream_text_none",
        COMPLETIONS_PY,
        '"text": content or "",',
        '"text": content,',
    ),
    in_server_folder(
        "completion_stream_start_chunk",
        COMPLETIONS_PY,
        ("    def start(self) -> list[bytes]:\n        return []\n"),
        ('    def start(self) -> list[bytes]:\n        return [self._frame([self._choice("")])]\n'),
    ),
    in_server_folder(
        "completion_stream_logprobs_dropped",
        COMPLETIONS_PY,
        (
            "            self.pending_logprobs.append(event)\n"
            "            return []\n"
            "        return"
            " [self._frame([self._with_logprobs(self._choice(_text([event])))])]"
        ),
        (
            "            return []\n"
            "        return"
            " [self._frame([self._with_logprobs(self._choice(_text([event])))])]"
        ),
    ),
    in_server_folder(
        "completion_stream_no_logprobs_attached",
        COMPLETIONS_PY,
        "return [self._frame([self._with_logprobs(self._choice(_text([event])))])]",
        "return [self._frame([self._choice(_text([event]))])]",
    ),
    in_server_folder(
        "chunk_finish_reason_chunk",
        OPENAI_CHAT_PY,
        (
            "frames.append(self._frame([self._choice(None,"
            " FINISH_REASONS[finished.finish_reason])]))"
        ),
        "frames.append(self._frame([self._choice(None, finished.finish_reason)]))",
    ),
    in_server_folder(
        "chunk_usage_chunk_choices",
        OPENAI_CHAT_PY,
        ("usage = [self._frame([], usage=chat_usage(finished))] if self.include_usage else []"),
        (
            "usage = [self._frame([self._choice(None)],"
            " usage=chat_usage(finished))] if self.include_usage else []"
        ),
    ),
    in_server_folder(
        "chunk_chunk_model",
        OPENAI_CHAT_PY,
        ('                "model": self.meta.model,\n                "choices": choices,'),
        ('                "model": "",\n                "choices": choices,'),
    ),
    in_server_folder(
        "chunk_chunk_created",
        OPENAI_CHAT_PY,
        (
            '                "created": self.meta.created,\n'
            '                "model": self.meta.model,\n'
            '                "choices": choices,'
        ),
        (
            '                "created": 0,\n'
            '                "model": self.meta.model,\n'
            '                "choices": choices,'
        ),
    ),
    in_server_folder(
        "responses_store_delete_true",
        RESPONSES_PY,
        "return self._items.pop(response_id, None) is not None",
        ("self._items.pop(response_id, None)\n            return True"),
    ),
    in_server_folder(
        "responses_store_conversation_response",
        RESPONSES_PY,
        "        return None if item is None else item[1]\n",
        "        return None if item is None else item[0]\n",
    ),
    in_server_folder(
        "responses_string_input_role",
        RESPONSES_PY,
        'return [{"role": "user", "content": request.input}]',
        'return [{"role": "system", "content": request.input}]',
    ),
    in_server_folder(
        "responses_message_role_required",
        RESPONSES_PY,
        "            if item.role is None:\n",
        "            if item.role is None and item.content is None:\n",
    ),
    in_server_folder(
        "responses_reasoning_summary_ignored",
        RESPONSES_PY,
        '                item.content or item.summary, f"{param}.content"',
        '                item.content, f"{param}.content"',
    ),
    in_server_folder(
        "responses_function_call_name_required",
        RESPONSES_PY,
        (
            "            if item.name is None:\n"
            "                raise APIError(\n"
            "                    400, f\"'{param}.name' is required for a function_call\""
        ),
        (
            "            if not item.name and item.arguments:\n"
            "                raise APIError(\n"
            "                    400, f\"'{param}.name' is required for a function_call\""
        ),
    ),
    in_server_folder(
        "responses_arguments_default",
        RESPONSES_PY,
        '"arguments": item.arguments or "{}"',
        '"arguments": item.arguments or ""',
    ),
    in_server_folder(
        "responses_output_call_id",
        RESPONSES_PY,
        '"tool_call_id": item.call_id or "",',
        '"tool_call_id": item.call_id,',
    ),
    in_server_folder(
        "responses_output_param",
        RESPONSES_PY,
        '"content": _text(item.output, f"{param}.output"),',
        '"content": _text(item.output, f"{param}.content"),',
    ),
    in_server_folder(
        "responses_tool_choice_type_check",
        RESPONSES_PY,
        ('if choice.get("type") != "function" or not isinstance(choice.get("name"), str):'),
        'if not isinstance(choice.get("name"), str):',
    ),
    in_server_folder(
        "responses_tools_kept_for_none",
        RESPONSES_PY,
        (
            '    if tool_choice == "none" or not request.tools:\n'
            "        return None, tool_choice\n"
            "    tools = []\n"
            "    for index, tool in enumerate(request.tools):\n"
            '        if tool.type != "function"'
        ),
        (
            "    if not request.tools:\n"
            "        return None, tool_choice\n"
            "    tools = []\n"
            "    for index, tool in enumerate(request.tools):\n"
            '        if tool.type != "function"'
        ),
    ),
    in_server_folder(
        "responses_tool_without_name",
        RESPONSES_PY,
        'if tool.type != "function" or tool.name is None:',
        'if tool.type != "function":',
    ),
    in_server_folder(
        "responses_tool_strict_dropped",
        RESPONSES_PY,
        'include={"name", "description", "parameters", "strict"}',
        'include={"name", "description", "parameters"}',
    ),
    in_server_folder(
        "responses_assistant_tool_calls_arguments",
        RESPONSES_PY,
        ('{"id": b.call_id, "function": {"name": b.call.name, "arguments": b.call.arguments}}'),
        '{"id": b.call_id, "function": {"name": b.call.name, "arguments": b.arguments}}',
    ),
    in_server_folder(
        "responses_assistant_content_all_blocks",
        RESPONSES_PY,
        '"content": "".join(b.text for b in blocks if b.kind == "text"),',
        '"content": "".join(b.text for b in blocks if b.kind != "reasoning"),',
    ),
    in_server_folder(
        "responses_output_text_logprobs",
        RESPONSES_PY,
        ('return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}'),
        'return {"type": "output_text", "text": text, "annotations": []}',
    ),
    in_server_folder(
        "responses_item_id_prefix",
        RESPONSES_PY,
        '{"tool_call": "fc_", "reasoning": "rs_", "text": "msg_"}',
        '{"tool_call": "call_", "reasoning": "rs_", "text": "msg_"}',
    ),
    in_server_folder(
        "responses_usage_total",
        RESPONSES_PY,
        '"total_tokens": finished.prompt_tokens + finished.completion_tokens,',
        '"total_tokens": finished.completion_tokens,',
    ),
    in_server_folder(
        "responses_usage_cached",
        RESPONSES_PY,
        '"input_tokens_details": {"cached_tokens": finished.cached_tokens},',
        '"input_tokens_details": {"cached_tokens": 0},',
    ),
    in_server_folder(
        "responses_usage_reasoning",
        RESPONSES_PY,
        '"output_tokens_details": {"reasoning_tokens": finished.reasoning_tokens},',
        '"output_tokens_details": {"reasoning_tokens": 0},',
    ),
    in_server_folder(
        "responses_object_instructions",
        RESPONSES_PY,
        '"instructions": request.instructions,',
        '"instructions": None,',
    ),
    in_server_folder(
        "responses_object_max_output",
        RESPONSES_PY,
        '"max_output_tokens": request.max_output_tokens,',
        '"max_output_tokens": None,',
    ),
    in_server_folder(
        "responses_object_model",
        RESPONSES_PY,
        ('        "model": meta.model,\n        "output": output,'),
        ('        "model": request.model,\n        "output": output,'),
    ),
    in_server_folder(
        "responses_object_parallel",
        RESPONSES_PY,
        ('"parallel_tool_calls": request.parallel_tool_calls,\n        "temperature"'),
        ('"parallel_tool_calls": True,\n        "temperature"'),
    ),
    in_server_folder(
        "responses_object_top_p",
        RESPONSES_PY,
        '"top_p": request.top_p,',
        '"top_p": request.temperature,',
    ),
    in_server_folder(
        "responses_object_tool_choice_default",
        RESPONSES_PY,
        '"tool_choice": request.tool_choice or "auto",',
        '"tool_choice": request.tool_choice,',
    ),
    in_server_folder(
        "responses_object_text_default",
        RESPONSES_PY,
        '            else {"type": "text"}\n',
        "            else None\n",
    ),
    in_server_folder(
        "responses_object_created",
        RESPONSES_PY,
        '"created_at": meta.created,',
        '"created_at": 0,',
    ),
    in_server_folder(
        "responses_empty_instructions_system",
        RESPONSES_PY,
        ('[{"role": "system", "content": request.instructions}] if request.instructions else []'),
        (
            '[{"role": "system", "content": request.instructions}] if'
            " request.instructions is not None else []"
        ),
    ),
    in_server_folder(
        "responses_text_format_param",
        RESPONSES_PY,
        'output_format(text_format.type, text_format, "text.format")',
        'output_format(text_format.type, text_format, "text")',
    ),
    in_server_folder(
        "responses_stream_first_sequence",
        RESPONSES_PY,
        "        self.sequence = 0\n",
        "        self.sequence = 1\n",
    ),
    in_server_folder(
        "responses_stream_added_content_kept",
        RESPONSES_PY,
        'empty = {"arguments": ""} if block.kind == "tool_call" else {"content": []}',
        'empty = {"arguments": ""} if block.kind == "tool_call" else {}',
    ),
    in_server_folder(
        "responses_stream_added_status",
        RESPONSES_PY,
        'item = _output_item(block, item_id, status="in_progress")',
        "item = _output_item(block, item_id)",
    ),
    in_server_folder(
        "responses_stream_part_text_not_emptied",
        RESPONSES_PY,
        'empty_part = item["content"][0] | {"text": ""}',
        'empty_part = item["content"][0]',
    ),
    in_server_folder(
        "responses_stream_text_delta_logprobs",
        RESPONSES_PY,
        ("                delta=text,\n                logprobs=[],\n            )\n        ]"),
        ("                delta=text,\n            )\n        ]"),
    ),
    in_server_folder(
        "responses_stream_reasoning_as_text_delta",
        RESPONSES_PY,
        '"response.reasoning_text.delta",',
        '"response.output_text.delta",',
    ),
    in_server_folder(
        "responses_stream_call_done_arguments",
        RESPONSES_PY,
        ("                    name=block.name,\n                    arguments=block.arguments,"),
        ("                    name=block.name,\n                    arguments=block.text,"),
    ),
    in_server_folder(
        "responses_stream_error_param",
        RESPONSES_PY,
        (
            'return [self._frame("error", code=error.code, message=error.message,'
            " param=error.param)]"
        ),
        'return [self._frame("error", code=error.code, message=error.message)]',
    ),
    in_server_folder(
        "app_list_models_no_aliases",
        APP_PY,
        "return (self.model_id, *self.aliases)",
        "return (self.model_id,)",
    ),
    in_server_folder(
        "app_model_context_length",
        APP_PY,
        '"context_length": self.service.max_context,',
        '"context_length": self.config.defaults.max_tokens,',
    ),
    in_server_folder(
        "app_get_model_served_name",
        APP_PY,
        "        return JSONResponse(self._model_json(name))\n",
        "        return JSONResponse(self._model_json(self.config.model_id))\n",
    ),
    in_server_folder(
        "app_unknown_model_names_aliases",
        APP_PY,
        'served = ", ".join(f"\'{n}\'" for n in self.config.model_names)',
        "served = f\"'{self.config.model_id}'\"",
    ),
    in_server_folder(
        "app_v1_health_missing",
        APP_PY,
        '        Route("/v1/health", server.health, methods=["GET"]),\n',
        "",
    ),
    in_server_folder(
        "app_delete_unknown_ok",
        APP_PY,
        (
            "        if stored is None:\n"
            "            return self._no_stored_response(response_id)\n"
            "        if request.method"
        ),
        (
            '        if stored is None and request.method == "GET":\n'
            "            return self._no_stored_response(response_id)\n"
            "        if request.method"
        ),
    ),
    in_server_folder(
        "app_deleted_body",
        APP_PY,
        ('return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})'),
        ('return JSONResponse({"id": response_id, "object": "response", "deleted": True})'),
    ),
    in_server_folder(
        "app_messages_without_v1",
        APP_PY,
        '            paths.append(endpoint.path.removeprefix("/v1"))\n',
        (
            '            paths.append(endpoint.path.removeprefix("/v1"))\n'
            '        elif endpoint.path == "/v1/messages":\n'
            '            paths.append("/messages")\n'
        ),
    ),
    in_server_folder(
        "generation_text_format_constrained",
        GENERATION_PY,
        '    if kind == "text":\n        return None\n',
        '    if kind == "text":\n        return JsonFormat()\n',
    ),
    in_server_folder(
        "generation_sampler_refusal_unnamed",
        GENERATION_PY,
        "except ValueError as exc:  # a combination the sampler refuses",
        "except TypeError as exc:  # a combination the sampler refuses",
    ),
)
