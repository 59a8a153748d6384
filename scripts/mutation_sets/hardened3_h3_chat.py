"""Hardened chat formats, third pass (issue 37, session 19): hand-made one-line mutations of
``ds4mlx/engine/chat/`` (GLM-5's and DeepSeek-V4's templates and parsers, streamed tool-call
events, the shared base, prompt pieces and call grammars) on lines no earlier set mutates. Each
was applied by hand and run against the chat tests; those no test noticed got one in
``tests/engine/test_chat_glm_prompt_rules.py``, ``test_chat_deepseek_rules.py``,
``test_chat_call_streaming_edges.py``, ``test_chat_call_grammar_rules.py`` or
``test_chat_shared_rules.py``. 58 of the 130 survived the chat test files before this session.

Left out as equivalent (no input tells them apart): the text before a call tag cut off at the
end in both parsers (``if text:`` in ``_cut_call_start`` / ``_cut_block_start``: ``feed`` has
already emitted all text that cannot start a marker, so at ``finish`` none is left before the
cut tag); GLM's ``bool(calls)`` (a run of results always has one entry, so an empty ``calls``
fails the subset test) and its ``first_marker`` check in ``_cut_call_start`` (``feed`` consumes
every complete marker); ``not isinstance(value, str)`` in ``_is_tool_reference`` (a string's
first item is never a mapping); DeepSeek's ``skip_to >= 0`` (an invoke's end is searched after
its tag, never at 0); ``_segments``' ``any(plain)`` (an empty run encodes to no ids);
``encode_prompt`` without ``add_special=False`` (it is the default); ``json_lexeme`` escaping
non-ASCII (the same JSON to llguidance). Left out as hangs, not catches: GLM's tool run read to
``len(messages) - 1`` and DeepSeek's parameter end searched from the start of the text (both
loop forever).

Test selection as in the fresh sets: the whole test folder of the mutated package, with ``-x``.

The 3 entries found identical to fresh10's (written the same evening by the blind writer, who
never saw this set) were taken out of this set: fresh10 keeps them.
"""

from __future__ import annotations

from mutation_sets.base import (
    CALL_GRAMMAR_PY,
    CHAT_BASE_PY,
    CHAT_EVENTS_PY,
    DEEPSEEK4_CHAT_PY,
    GLM5_CHAT_PY,
    PROMPT_PY,
)
from mutation_sets.base import in_engine_folder as _engine

MUTATIONS = (
    # GLM-5: the template
    _engine(
        "glm_input_audio_part_without_placeholder",
        GLM5_CHAT_PY,
        '    "input_audio": "<|begin_of_audio|><|end_of_audio|>",\n',
        "",
    ),
    _engine(
        "glm_video_url_part_without_placeholder",
        GLM5_CHAT_PY,
        '    "video_url": "<|begin_of_video|><|video|><|end_of_video|>",\n',
        "",
    ),
    _engine(
        "glm_image_url_part_without_placeholder",
        GLM5_CHAT_PY,
        '    "image_url": "<|begin_of_image|><|image|><|end_of_image|>",\n',
        "",
    ),
    _engine(
        "glm_tool_schema_line_escapes_non_ascii",
        GLM5_CHAT_PY,
        (
            "        {k: v for k, v in _function(tool).items() if k not in "
            '("defer_loading", "strict")},\n        ensure_ascii=False,'
        ),
        (
            "        {k: v for k, v in _function(tool).items() if k not in "
            '("defer_loading", "strict")},\n        ensure_ascii=True,'
        ),
    ),
    _engine(
        "glm_assistant_media_part_read_as_text",
        GLM5_CHAT_PY,
        'elif isinstance(item, Mapping) and item.get("type") == "text":',
        'elif isinstance(item, Mapping) and item.get("type") != "image":',
    ),
    _engine(
        "glm_media_result_read_as_tool_references",
        GLM5_CHAT_PY,
        'and value[0].get("type") == "tool_reference"',
        'and value[0].get("type") != "text"',
    ),
    _engine(
        "glm_tool_reference_expands_the_other_tools",
        GLM5_CHAT_PY,
        '            if _function(tool).get("name") == name',
        '            if _function(tool).get("name") != name',
    ),
    _engine(
        "glm_tool_reference_schemas_without_newlines",
        GLM5_CHAT_PY,
        '            _tool_json(tool) + "\\n"\n            for name in names',
        "            _tool_json(tool)\n            for name in names",
    ),
    _engine(
        "glm_tool_reference_tools_tag_without_newline",
        GLM5_CHAT_PY,
        'out.template("<tool_response><tools>\\n")',
        'out.template("<tool_response><tools>")',
    ),
    _engine(
        "glm_tool_reference_tools_tag_left_open",
        GLM5_CHAT_PY,
        'out.template("</tools></tool_response>")',
        'out.template("</tool_response>")',
    ),
    _engine(
        "glm_media_placeholders_written_as_caller_text",
        GLM5_CHAT_PY,
        'if isinstance(item, Mapping) and item.get("type") in _MEDIA:',
        'if isinstance(item, Mapping) and item.get("type") == "image":',
    ),
    _engine(
        "glm_output_entries_read_from_content",
        GLM5_CHAT_PY,
        'return [(_result_id(entry), entry.get("output")) for entry in content]',
        'return [(_result_id(entry), entry.get("content")) for entry in content]',
    ),
    _engine(
        "glm_text_parts_mentioning_output_read_as_entries",
        GLM5_CHAT_PY,
        '        and isinstance(content[0], Mapping)\n        and "output" in content[0]',
        '        and "output" in content[0]',
    ),
    _engine(
        "glm_results_sorted_though_a_call_has_no_id",
        GLM5_CHAT_PY,
        "        and all(call_ids)\n",
        "\n",
    ),
    _engine(
        "glm_results_sorted_expect_every_call_answered",
        GLM5_CHAT_PY,
        "for call_id in call_ids if call_id in by_id]",
        "for call_id in call_ids]",
    ),
    _engine(
        "glm_empty_reasoning_content_falls_back_to_inline",
        GLM5_CHAT_PY,
        "    if isinstance(reasoning, str):\n        return reasoning, content",
        "    if reasoning:\n        return reasoning, content",
    ),
    _engine(
        "glm_inline_answer_split_at_the_first_think_close",
        GLM5_CHAT_PY,
        "before, _, after = content.rpartition(THINK_END)",
        "before, _, after = content.partition(THINK_END)",
    ),
    _engine(
        "glm_effort_stated_lowercase",
        GLM5_CHAT_PY,
        'f"{SYSTEM}Reasoning Effort: {effort.capitalize()}"',
        'f"{SYSTEM}Reasoning Effort: {effort}"',
    ),
    _engine(
        "glm_unknown_effort_rendered",
        GLM5_CHAT_PY,
        "        if effort not in REASONING_EFFORTS:\n            raise",
        "        if effort in ():\n            raise",
    ),
    _engine(
        "glm_forced_call_opened_inside_reasoning",
        GLM5_CHAT_PY,
        (
            "        forced = self.forced_call_prefix(tool_choice)\n        "
            "thinking = thinking and not forced\n        tools = []"
        ),
        "        forced = self.forced_call_prefix(tool_choice)\n        tools = []",
    ),
    _engine(
        "glm_developer_role_refused",
        GLM5_CHAT_PY,
        'if role in ("user", "system", "developer"):',
        'if role in ("user", "system"):',
    ),
    _engine(
        "glm_cleared_reasoning_written",
        GLM5_CHAT_PY,
        'out.caller(reasoning if keep and reasoning else "")',
        'out.caller(reasoning if reasoning else "")',
    ),
    _engine(
        "glm_opening_results_sorted_by_the_last_message",
        GLM5_CHAT_PY,
        "previous = messages[index - 1] if index else {}",
        "previous = messages[index - 1]",
    ),
    _engine(
        "glm_results_sorted_by_a_user_messages_calls",
        GLM5_CHAT_PY,
        (
            '                    (previous.get("tool_calls") or ())\n               '
            '     if previous.get("role") == "assistant"\n                    else '
            "()"
        ),
        '                    (previous.get("tool_calls") or ())',
    ),
    _engine(
        "glm_unknown_role_skipped",
        GLM5_CHAT_PY,
        (
            '            else:\n                raise ValueError(f"unsupported '
            'message role {role!r}")'
        ),
        "            else:\n                pass",
    ),
    _engine(
        "glm_generation_prompt_always_written",
        GLM5_CHAT_PY,
        "        if add_generation_prompt:\n            out.template(ASSISTANT + THINK_START",
        "        if True:\n            out.template(ASSISTANT + THINK_START",
    ),
    _engine(
        "glm_thinking_generation_prompt_closed",
        GLM5_CHAT_PY,
        'out.template(ASSISTANT + THINK_START + ("" if thinking else THINK_END))',
        "out.template(ASSISTANT + THINK_START + THINK_END)",
    ),
    _engine(
        "glm_forced_prefix_written_when_unforced",
        GLM5_CHAT_PY,
        "            if forced:\n                write_forced_prefix(out, forced, tool_choice)",
        (
            "            if not forced:\n                write_forced_prefix(out, "
            "forced, tool_choice)"
        ),
    ),
    _engine(
        "glm_named_choice_prefix_without_the_name",
        GLM5_CHAT_PY,
        "return CALL_START + tool_choice.name",
        "return CALL_START",
    ),
    _engine(
        "glm_non_text_items_of_a_list_raise",
        GLM5_CHAT_PY,
        (
            "            elif isinstance(item, Mapping):\n                "
            'out.append(_MEDIA.get(item.get("type"), ""))'
        ),
        '            else:\n                out.append(_MEDIA.get(item.get("type"), ""))',
    ),
    # GLM-5: the parser, streamed calls and the call grammar
    _engine(
        "glm_forced_parser_starts_in_reasoning",
        GLM5_CHAT_PY,
        "            thinking and not forced,\n            tools or (),",
        "            thinking,\n            tools or (),",
    ),
    _engine(
        "glm_stream_arguments_ignored",
        GLM5_CHAT_PY,
        (
            "            stream_arguments=stream_arguments,\n        )\n        "
            "enter_forced_call(parser, forced)\n        return parser\n\n    def "
            "parse("
        ),
        (
            "            stream_arguments=False,\n        )\n        "
            "enter_forced_call(parser, forced)\n        return parser\n\n    def "
            "parse("
        ),
    ),
    _engine(
        "glm_parse_ignores_the_string_schemas",
        GLM5_CHAT_PY,
        "parser = self.stream_parser(thinking=thinking, tools=tools)",
        "parser = self.stream_parser(thinking=thinking)",
    ),
    _engine(
        "glm_mixed_enum_written_as_literals",
        GLM5_CHAT_PY,
        "if isinstance(choices, list) and all(isinstance(choice, str) for choice in choices):",
        "if isinstance(choices, list):",
    ),
    _engine(
        "glm_json_value_held_to_its_schema_when_auto",
        GLM5_CHAT_PY,
        (
            'return f"{json_lexeme(parameter.schema if schema_bound else None)} '
            '{literal(VALUE_END)}"'
        ),
        'return f"{json_lexeme(parameter.schema)} {literal(VALUE_END)}"',
    ),
    _engine(
        "glm_grammar_starts_after_the_name_for_required",
        GLM5_CHAT_PY,
        '        if isinstance(tool_choice, NamedTool)\n        else f"call{more_calls}"',
        '        if tool_choice == "required"\n        else f"call{more_calls}"',
    ),
    _engine(
        "glm_string_schemas_keyed_by_the_wrong_field",
        GLM5_CHAT_PY,
        'out[str(function.get("name"))] = {',
        'out[str(function.get("title"))] = {',
    ),
    _engine(
        "glm_think_close_ends_the_turn",
        GLM5_CHAT_PY,
        "self._state = {THINK_END: _CONTENT, CALL_START: _CALL}.get(marker, self.DONE)",
        "self._state = {CALL_START: _CALL}.get(marker, self.DONE)",
    ),
    _engine(
        "glm_call_tag_start_cut_before_the_end",
        GLM5_CHAT_PY,
        "            if final:\n                self._cut_call_start(events)",
        "            if True:\n                self._cut_call_start(events)",
    ),
    _engine(
        "glm_cut_call_tag_not_marked_unterminated",
        GLM5_CHAT_PY,
        'events.append(ToolCallError(tail, "unterminated tool_call", unterminated=True))',
        'events.append(ToolCallError(tail, "unterminated tool_call"))',
    ),
    _engine(
        "glm_unterminated_call_raw_without_its_tag",
        GLM5_CHAT_PY,
        (
            '                    CALL_START + self._pending[:cut], "unterminated '
            'tool_call", unterminated=True'
        ),
        '                    self._pending[:cut], "unterminated tool_call", unterminated=True',
    ),
    _engine(
        "glm_unterminated_call_raw_past_the_role_token",
        GLM5_CHAT_PY,
        "cut = len(self._pending) if hit is None else hit[0]",
        "cut = len(self._pending)",
    ),
    _engine(
        "glm_second_streamed_call_not_announced",
        GLM5_CHAT_PY,
        "        events.append(call)\n        self._arguments.reset()",
        "        events.append(call)",
    ),
    _engine(
        "glm_unannounced_call_streams_its_arguments_at_the_end",
        GLM5_CHAT_PY,
        "if not (self._arguments.announced and isinstance(closed, ToolCallComplete)):",
        "if not isinstance(closed, ToolCallComplete):",
    ),
    _engine(
        "glm_broken_announced_call_streams_its_arguments",
        GLM5_CHAT_PY,
        "if not (self._arguments.announced and isinstance(closed, ToolCallComplete)):",
        "if not self._arguments.announced:",
    ),
    _engine(
        "glm_name_with_markup_announced",
        GLM5_CHAT_PY,
        'if not key_start or not name or "<" in name:',
        "if not key_start or not name:",
    ),
    _engine(
        "glm_name_announced_before_its_first_argument",
        GLM5_CHAT_PY,
        'if not key_start or not name or "<" in name:',
        'if not name or "<" in name:',
    ),
    _engine(
        "glm_streamed_arguments_closed_before_the_call",
        GLM5_CHAT_PY,
        "        if closed is not None:\n            self._arguments.close(events)",
        "        self._arguments.close(events)",
    ),
    _engine(
        "glm_duplicate_argument_streamed",
        GLM5_CHAT_PY,
        "if problem or key in dict(arguments):",
        "if problem:",
    ),
    _engine(
        "glm_incomplete_argument_streamed",
        GLM5_CHAT_PY,
        "if problem or key in dict(arguments):",
        "if key in dict(arguments):",
    ),
    _engine(
        "glm_string_schema_values_read_as_json",
        GLM5_CHAT_PY,
        "            arguments[key] = value if key in strings else _json_or_text(value)",
        "            arguments[key] = _json_or_text(value)",
    ),
    _engine(
        "glm_broken_argument_ends_the_call_quietly",
        GLM5_CHAT_PY,
        "            if problem:\n                return ToolCallError(raw, problem)",
        "            if problem:\n                break",
    ),
    _engine(
        "glm_padded_argument_key_kept_padded",
        GLM5_CHAT_PY,
        "key = text[len(KEY_START) : key_end].strip()",
        "key = text[len(KEY_START) : key_end]",
    ),
    _engine(
        "glm_newline_before_arg_value_refused",
        GLM5_CHAT_PY,
        "after = text[key_end + len(KEY_END) :].lstrip()",
        "after = text[key_end + len(KEY_END) :]",
    ),
    _engine(
        "glm_foreign_tag_read_as_an_argument_key",
        GLM5_CHAT_PY,
        (
            '    if not text.startswith(KEY_START):\n        return "", "", "", '
            '"unexpected text in tool_call"'
        ),
        (
            '    if not text.startswith("<"):\n        return "", "", "", '
            '"unexpected text in tool_call"'
        ),
    ),
    _engine(
        "glm_unclosed_arg_key_not_reported",
        GLM5_CHAT_PY,
        '    if key_end < 0:\n        return "", "", "", "arg_key without </arg_key>"',
        '    if key_end < -1:\n        return "", "", "", "arg_key without </arg_key>"',
    ),
    _engine(
        "glm_unclosed_arg_value_not_reported",
        GLM5_CHAT_PY,
        (
            '    if value_end < 0:\n        return "", "", "", f"argument {key!r} '
            'has no </arg_value>"'
        ),
        (
            '    if value_end < -1:\n        return "", "", "", f"argument {key!r} '
            'has no </arg_value>"'
        ),
    ),
    _engine(
        "glm_call_marker_without_its_closing_bracket",
        GLM5_CHAT_PY,
        "    call_marker = CALL_START\n",
        '    call_marker = "<tool_call"\n',
    ),
    # DeepSeek-V4: the template
    _engine(
        "dsml_missing_content_rendered_as_none",
        DEEPSEEK4_CHAT_PY,
        '    if value is None:\n        return ""\n    if not isinstance',
        '    if value is None:\n        value = "None"\n    if not isinstance',
    ),
    _engine(
        "dsml_results_sorted_by_their_own_id_field",
        DEEPSEEK4_CHAT_PY,
        'else ("tool_result", content, _text(message, "tool_call_id"))',
        'else ("tool_result", content, _text(message, "id"))',
    ),
    _engine(
        "dsml_developer_message_rendered_as_system_text",
        DEEPSEEK4_CHAT_PY,
        (
            '        elif role in ("system", "developer"):\n            '
            "turns.append(_Turn(role, content))"
        ),
        (
            '        elif role in ("system", "developer"):\n            '
            'turns.append(_Turn("system", content))'
        ),
    ),
    _engine(
        "dsml_unknown_role_skipped",
        DEEPSEEK4_CHAT_PY,
        (
            '        else:\n            raise ValueError(f"unsupported message role '
            '{role!r}")\n    if tools:'
        ),
        "        else:\n            continue\n    if tools:",
    ),
    _engine(
        "dsml_calls_without_id_join_the_call_order",
        DEEPSEEK4_CHAT_PY,
        "call_order = {call_id: i for i, call_id in enumerate(turn.call_ids) if call_id}",
        "call_order = {call_id: i for i, call_id in enumerate(turn.call_ids)}",
    ),
    _engine(
        "dsml_an_assistant_turn_without_calls_resets_the_order",
        DEEPSEEK4_CHAT_PY,
        'if turn.role == "assistant" and turn.tool_calls:',
        'if turn.role == "assistant":',
    ),
    _engine(
        "dsml_tool_schemas_run_together",
        DEEPSEEK4_CHAT_PY,
        '    schemas = "\\n".join(\n',
        '    schemas = "".join(\n',
    ),
    _engine(
        "dsml_tool_schemas_escape_non_ascii",
        DEEPSEEK4_CHAT_PY,
        'json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools',
        'json.dumps(tool.get("function", tool)) for tool in tools',
    ),
    _engine(
        "dsml_call_block_after_one_newline",
        DEEPSEEK4_CHAT_PY,
        'out.template(f"\\n\\n<{DSML}tool_calls>\\n")',
        'out.template(f"\\n<{DSML}tool_calls>\\n")',
    ),
    _engine(
        "dsml_every_parameter_marked_string",
        DEEPSEEK4_CHAT_PY,
        'out.template(f\'" string="{"true" if is_string else "false"}">\')',
        'out.template(\'" string="true">\')',
    ),
    _engine(
        "dsml_json_parameter_escapes_non_ascii",
        DEEPSEEK4_CHAT_PY,
        "out.caller(value if is_string else json.dumps(value, ensure_ascii=False))",
        "out.caller(value if is_string else json.dumps(value))",
    ),
    _engine(
        "dsml_block_close_without_newline",
        DEEPSEEK4_CHAT_PY,
        '    out.template(f"\\n</{DSML}tool_calls>")',
        '    out.template(f"</{DSML}tool_calls>")',
    ),
    _engine(
        "dsml_required_choice_renders_no_tools",
        DEEPSEEK4_CHAT_PY,
        '        if tool_choice == "none":\n            tools = None',
        '        if tool_choice == "required":\n            tools = None',
    ),
    _engine(
        "dsml_developer_messages_dropped_without_thinking",
        DEEPSEEK4_CHAT_PY,
        "        if thinking and not keep_all_reasoning:\n",
        "        if not keep_all_reasoning:\n",
    ),
    _engine(
        "dsml_tools_section_after_one_newline",
        DEEPSEEK4_CHAT_PY,
        '                    out.template("\\n\\n")\n                    _render_tools_section',
        '                    out.template("\\n")\n                    _render_tools_section',
    ),
    _engine(
        "dsml_reasoning_kept_one_turn_early",
        DEEPSEEK4_CHAT_PY,
        "if thinking and (keep_all_reasoning or index > last_user):",
        "if thinking and (keep_all_reasoning or index >= last_user - 1):",
    ),
    _engine(
        "dsml_reasoning_written_without_thinking",
        DEEPSEEK4_CHAT_PY,
        "if thinking and (keep_all_reasoning or index > last_user):",
        "if keep_all_reasoning or index > last_user:",
    ),
    _engine(
        "dsml_developer_turn_at_the_end_gets_no_assistant_prefix",
        DEEPSEEK4_CHAT_PY,
        'if turn.role in ("user", "developer") and (',
        'if turn.role == "user" and (',
    ),
    _engine(
        "dsml_generation_prompt_never_written",
        DEEPSEEK4_CHAT_PY,
        "is_last = index + 1 == len(turns)",
        "is_last = index == len(turns)",
    ),
    _engine(
        "dsml_forced_prefix_without_generation_prompt",
        DEEPSEEK4_CHAT_PY,
        "if forced and add_generation_prompt:",
        "if forced:",
    ),
    _engine(
        "dsml_named_prefix_without_its_newline",
        DEEPSEEK4_CHAT_PY,
        "return f'{_FORCED_BLOCK}{tool_choice.name}\">\\n'",
        "return f'{_FORCED_BLOCK}{tool_choice.name}\">'",
    ),
    _engine(
        "dsml_developer_turn_not_the_last_user_turn",
        DEEPSEEK4_CHAT_PY,
        '(i for i, turn in enumerate(turns) if turn.role in ("user", "developer")), default=-1',
        '(i for i, turn in enumerate(turns) if turn.role == "user"), default=-1',
    ),
    _engine(
        "dsml_render_chat_always_adds_the_generation_prompt",
        DEEPSEEK4_CHAT_PY,
        (
            "        messages, tools, add_generation_prompt=add_generation_prompt, "
            "thinking=thinking, **options"
        ),
        "        messages, tools, add_generation_prompt=True, thinking=thinking, **options",
    ),
    # DeepSeek-V4: the DSML parser, streamed calls and the call grammar
    _engine(
        "dsml_invoke_close_without_newline",
        DEEPSEEK4_CHAT_PY,
        '        out.template(f"\\n</{DSML}invoke>")',
        '        out.template(f"</{DSML}invoke>")',
    ),
    _engine(
        "dsml_user_text_blocks_dropped",
        DEEPSEEK4_CHAT_PY,
        '        if kind == "text":\n            out.caller(text)',
        '        if kind != "tool_result" and False:\n            out.caller(text)',
    ),
    _engine(
        "dsml_forced_parser_starts_in_reasoning",
        DEEPSEEK4_CHAT_PY,
        "            thinking and not forced,\n            parse_tools",
        "            thinking,\n            parse_tools",
    ),
    _engine(
        "dsml_narrowed_string_written_as_json_when_auto",
        DEEPSEEK4_CHAT_PY,
        "if parameter.plain_string or (parameter.is_string and not schema_bound):",
        "if parameter.plain_string:",
    ),
    _engine(
        "dsml_grammar_starts_after_the_name_for_required",
        DEEPSEEK4_CHAT_PY,
        '    if isinstance(tool_choice, NamedTool):\n        start = f"t0_arguments',
        '    if tool_choice == "required":\n        start = f"t0_arguments',
    ),
    _engine(
        "dsml_parse_assistant_ignores_thinking",
        DEEPSEEK4_CHAT_PY,
        "return DEEPSEEK_V4.parse(text, thinking=thinking)",
        "return DEEPSEEK_V4.parse(text)",
    ),
    _engine(
        "dsml_attributes_without_whitespace_accepted",
        DEEPSEEK4_CHAT_PY,
        '_ATTRIBUTES = re.compile(r\'(?:\\s+[\\w-]+="[^"]*")*\\s*\')',
        '_ATTRIBUTES = re.compile(r\'(?:\\s*[\\w-]+="[^"]*")*\\s*\')',
    ),
    _engine(
        "dsml_junk_in_a_parameter_tag_accepted",
        DEEPSEEK4_CHAT_PY,
        "    if not _ATTRIBUTES.fullmatch(tag_body):\n        return None",
        "    if not _ATTRIBUTES.match(tag_body):\n        return None",
    ),
    _engine(
        "dsml_tool_choice_none_parses_calls",
        DEEPSEEK4_CHAT_PY,
        "self._content_markers = (*_TOOL_BLOCK_STARTS, EOS) if parse_tools else (EOS,)",
        "self._content_markers = (*_TOOL_BLOCK_STARTS, EOS)",
    ),
    _engine(
        "dsml_eos_inside_reasoning_is_reasoning",
        DEEPSEEK4_CHAT_PY,
        "marker = self._text_until(events, (THINK_END, EOS), ReasoningDelta, final)",
        "marker = self._text_until(events, (THINK_END,), ReasoningDelta, final)",
    ),
    _engine(
        "dsml_tool_choice_none_cut_tag_is_an_error",
        DEEPSEEK4_CHAT_PY,
        (
            "if self._content_markers == (EOS,) or first_marker(self._pending, "
            "self._content_markers):"
        ),
        "if first_marker(self._pending, self._content_markers):",
    ),
    _engine(
        "dsml_cut_invoke_streams_a_closing_brace",
        DEEPSEEK4_CHAT_PY,
        "        if invoke.length is not None:\n            self._arguments.close(events)",
        "        self._arguments.close(events)",
    ),
    _engine(
        "dsml_eos_after_a_block_forgotten",
        DEEPSEEK4_CHAT_PY,
        "self._pending = rest[len(block_end) :] + after_block",
        "self._pending = rest[len(block_end) :]",
    ),
    _engine(
        "dsml_stray_block_text_error_runs_to_the_end",
        DEEPSEEK4_CHAT_PY,
        'ToolCallError(rest[:garbage_end], "unexpected text in tool_calls block")',
        'ToolCallError(rest, "unexpected text in tool_calls block")',
    ),
    _engine(
        "dsml_cut_block_not_marked_unterminated",
        DEEPSEEK4_CHAT_PY,
        (
            '                    ToolCallError(rest, "unterminated tool_calls '
            'block", unterminated=True)'
        ),
        '                    ToolCallError(rest, "unterminated tool_calls block")',
    ),
    _engine(
        "dsml_unclosed_complete_block_reports_an_empty_error",
        DEEPSEEK4_CHAT_PY,
        "        if ended:\n            if rest:\n",
        "        if ended:\n            if True:\n",
    ),
    _engine(
        "dsml_only_the_first_invoke_problem_reported",
        DEEPSEEK4_CHAT_PY,
        'return ToolCallError(text[: self.length], "; ".join(self.problems))',
        "return ToolCallError(text[: self.length], self.problems[0])",
    ),
    _engine(
        "dsml_invoke_error_raw_runs_past_the_invoke",
        DEEPSEEK4_CHAT_PY,
        'return ToolCallError(text[: self.length], "; ".join(self.problems))',
        'return ToolCallError(text, "; ".join(self.problems))',
    ),
    _engine(
        "dsml_nameless_invoke_error_without_reason",
        DEEPSEEK4_CHAT_PY,
        (
            '    if invoke.name is None:\n        invoke.problems.append("invoke '
            'tag without a name")'
        ),
        "    if invoke.name is None:\n        pass",
    ),
    _engine(
        "dsml_partial_invoke_close_is_unexpected_text",
        DEEPSEEK4_CHAT_PY,
        "        elif invoke_end.startswith(rest) or parameter_start.startswith(rest):",
        "        elif parameter_start.startswith(rest):",
    ),
    _engine(
        "dsml_nameless_parameter_raises",
        DEEPSEEK4_CHAT_PY,
        'if attributes is None or "name" not in attributes:',
        "if attributes is None:",
    ),
    _engine(
        "dsml_unknown_string_flag_read_as_json",
        DEEPSEEK4_CHAT_PY,
        '    elif is_string == "false":\n',
        '    elif is_string != "true":\n',
    ),
    _engine(
        "dsml_call_marker_without_its_first_bar",
        DEEPSEEK4_CHAT_PY,
        "    call_marker = DSML\n",
        "    call_marker = DSML[1:]\n",
    ),
    # What every format shares: base, events, prompt pieces, call grammars
    _engine(
        "chat_render_always_adds_the_generation_prompt",
        CHAT_BASE_PY,
        (
            "                add_generation_prompt=add_generation_prompt,\n         "
            "       thinking=thinking,\n                **options,"
        ),
        (
            "                add_generation_prompt=True,\n                "
            "thinking=thinking,\n                **options,"
        ),
    ),
    _engine(
        "chat_tokenize_ignores_thinking",
        CHAT_BASE_PY,
        (
            "return encode_prompt(tokenizer, self.prompt(messages, tools, "
            "thinking=thinking, **options))"
        ),
        "return encode_prompt(tokenizer, self.prompt(messages, tools, **options))",
    ),
    _engine(
        "chat_message_call_id_dropped",
        CHAT_BASE_PY,
        'return ToolCall(function["name"], arguments), entry.get("id")',
        'return ToolCall(function["name"], arguments), None',
    ),
    _engine(
        "chat_null_arguments_kept_as_an_argument",
        CHAT_BASE_PY,
        'arguments = function.get("arguments") or {}',
        'arguments = function.get("arguments", {})',
    ),
    _engine(
        "chat_streamed_argument_keys_escape_non_ascii",
        CHAT_BASE_PY,
        'f"{separator}{json.dumps(key, ensure_ascii=False)}: "',
        'f"{separator}{json.dumps(key)}: "',
    ),
    _engine(
        "chat_streamed_argument_values_escape_non_ascii",
        CHAT_BASE_PY,
        'f"{json.dumps(value, ensure_ascii=False)}"',
        'f"{json.dumps(value)}"',
    ),
    _engine(
        "chat_forced_prefix_events_lost_at_finish",
        CHAT_BASE_PY,
        (
            "    def finish(self) -> list[ChatEvent]:\n        events, "
            "self._carried = self._carried, []"
        ),
        "    def finish(self) -> list[ChatEvent]:\n        events = []",
    ),
    _engine(
        "chat_empty_text_deltas_emitted",
        CHAT_BASE_PY,
        "            if ready:\n                events.append(delta(ready))",
        "            events.append(delta(ready))",
    ),
    _engine(
        "chat_parse_ignores_thinking",
        CHAT_BASE_PY,
        "        parser = self.stream_parser(thinking=thinking)\n        return AssistantTurn",
        "        parser = self.stream_parser()\n        return AssistantTurn",
    ),
    _engine(
        "chat_max_effort_falls_back_to_the_strongest",
        CHAT_BASE_PY,
        "raise ValueError(f\"the {self.name} chat template has no 'max' reasoning effort\")",
        "return self.reasoning_efforts[-1]",
    ),
    _engine(
        "chat_turn_drops_tool_call_errors",
        CHAT_EVENTS_PY,
        (
            "            elif isinstance(event, ToolCallError):\n                "
            "turn.errors.append(event)"
        ),
        "            elif isinstance(event, ToolCallError):\n                pass",
    ),
    _engine(
        "chat_turn_drops_tool_calls",
        CHAT_EVENTS_PY,
        (
            "            elif isinstance(event, ToolCallComplete):\n                "
            "turn.tool_calls.append(event.call)"
        ),
        "            elif isinstance(event, ToolCallComplete):\n                pass",
    ),
    _engine(
        "prompt_special_pattern_asked_of_any_tokenizer",
        PROMPT_PY,
        "    if not isinstance(tokenizer, Tokenizer):\n        return None\n    spellings",
        "    if isinstance(tokenizer, NumericTokenizer):\n        return None\n    spellings",
    ),
    _engine(
        "prompt_longest_token_asked_of_any_tokenizer",
        PROMPT_PY,
        "    if not isinstance(tokenizer, Tokenizer):\n        return None\n    return max",
        "    if tokenizer is None:\n        return None\n    return max",
    ),
    _engine(
        "grammar_json_key_separator_without_space",
        CALL_GRAMMAR_PY,
        '"key_separator": ": "',
        '"key_separator": ":"',
    ),
    _engine(
        "grammar_json_whitespace_flexible",
        CALL_GRAMMAR_PY,
        '"whitespace_flexible": False',
        '"whitespace_flexible": True',
    ),
    _engine(
        "grammar_literals_escape_non_ascii",
        CALL_GRAMMAR_PY,
        "    return json.dumps(text, ensure_ascii=False)",
        "    return json.dumps(text)",
    ),
    _engine(
        "grammar_nameless_tool_named_none",
        CALL_GRAMMAR_PY,
        'return str(function_of(tool).get("name", ""))',
        'return str(function_of(tool).get("name"))',
    ),
    _engine(
        "grammar_nullable_string_is_a_string",
        CALL_GRAMMAR_PY,
        '        return self.schema.get("type") == "string"\n',
        '        return "string" in str(self.schema.get("type"))\n',
    ),
    _engine(
        "grammar_named_choice_keeps_every_tool",
        CALL_GRAMMAR_PY,
        "    return chosen, True",
        "    return tools, True",
    ),
    _engine(
        "chat_turn_counts_streamed_pieces_as_errors",
        CHAT_EVENTS_PY,
        (
            "            elif isinstance(event, ToolCallError):\n                "
            "turn.errors.append(event)"
        ),
        "            else:\n                turn.errors.append(event)",
    ),
    _engine(
        "chat_parser_reasoning_after_the_think_close",
        CHAT_BASE_PY,
        "        return self._state == _REASONING",
        "        return self._state != _DONE",
    ),
    _engine(
        "chat_reasoning_end_is_the_think_open",
        CHAT_BASE_PY,
        '    reasoning_end: str = "</think>"',
        '    reasoning_end: str = "<think>"',
    ),
)
