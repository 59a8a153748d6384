"""The agent's tests hardened against blind mutations (issue 37, session 17): plausible
one-line bugs in ``ds4mlx/agent``, each checked by hand to survive the agent's tests before the
test that now catches it was written (boundaries, members of literal sets, defaults, one field
of a message, one branch of an ``elif``), in the files earlier sets touched least. None changes
a line an earlier set's mutation changes with the same old text. Test selection: the whole
``tests/agent`` folder (``base.in_agent_folder``).
"""

from __future__ import annotations

from mutation_sets.base import (
    AGENT_DISPLAY_PY,
    AGENT_EVENT_NOTES_PY,
    AGENT_INSTRUCTIONS_PY,
    AGENT_SYMBOLS_PY,
    MENTIONS_PY,
    TOOLS_PY,
    Mutation,
)
from mutation_sets.base import in_agent_folder as _agent

MUTATIONS: tuple[Mutation, ...] = (
    # display: the edges of each unsafe range, and the escape's width.
    _agent("display_c0_range_starts_at_one", AGENT_DISPLAY_PY, "[\\x00-\\x08", "[\\x01-\\x08"),
    _agent("display_vertical_tab_passes", AGENT_DISPLAY_PY, "\\x0b-\\x1f", "\\x0c-\\x1f"),
    _agent("display_unit_separator_passes", AGENT_DISPLAY_PY, "\\x0b-\\x1f", "\\x0b-\\x1e"),
    _agent("display_last_c1_control_passes", AGENT_DISPLAY_PY, "-\\x9f\\u202a", "-\\x9e\\u202a"),
    _agent("display_bidi_override_passes", AGENT_DISPLAY_PY, "\\u202a-\\u202e", "\\u202a-\\u202d"),
    _agent("display_first_isolate_passes", AGENT_DISPLAY_PY, "\\u2066-\\u2069", "\\u2067-\\u2069"),
    _agent("display_byte_escapes_only_below_0x80", AGENT_DISPLAY_PY, "code < 0x100", "code < 0x80"),
    _agent("display_escape_without_padding", AGENT_DISPLAY_PY, "{code:02x}", "{code:x}"),
    _agent("display_crlf_kept", AGENT_DISPLAY_PY, 'text.replace("\\r\\n", "\\n")', "text"),
    # event notes: which are errors, and what each says.
    _agent(
        "event_notes_malformed_call_not_an_error",
        AGENT_EVENT_NOTES_PY,
        'reported to the model", True)',
        'reported to the model", False)',
    ),
    _agent(
        "event_notes_compaction_counts_swapped",
        AGENT_EVENT_NOTES_PY,
        "{event.tokens_before} -> {event.tokens_after}",
        "{event.tokens_after} -> {event.tokens_before}",
    ),
    _agent(
        "event_notes_refusals_not_errors",
        AGENT_EVENT_NOTES_PY,
        'not attached: {refused}", True)',
        'not attached: {refused}", False)',
    ),
    _agent(
        "event_notes_attached_line_even_when_none",
        AGENT_EVENT_NOTES_PY,
        "if event.attached else []",
        "if event.refused else []",
    ),
    # project instructions: which file, how much of it.
    _agent(
        "instructions_unusable_file_ends_the_search",
        AGENT_INSTRUCTIONS_PY,
        "except (ToolError, OSError):\n            continue",
        "except (ToolError, OSError):\n            return None",
    ),
    _agent(
        "instructions_empty_file_used",
        AGENT_INSTRUCTIONS_PY,
        'if not text or "\\x00" in text:',
        'if "\\x00" in text:',
    ),
    _agent(
        "instructions_binary_file_ends_the_search",
        AGENT_INSTRUCTIONS_PY,
        "in text:\n            continue",
        "in text:\n            return None",
    ),
    _agent(
        "instructions_text_not_stripped",
        AGENT_INSTRUCTIONS_PY,
        '.decode("utf-8", errors="replace").strip()',
        '.decode("utf-8", errors="replace")',
    ),
    _agent(
        "instructions_cut_one_short",
        AGENT_INSTRUCTIONS_PY,
        "text[:MAX_INSTRUCTION_CHARS] +",
        "text[: MAX_INSTRUCTION_CHARS - 1] +",
    ),
    _agent("instructions_cut_not_flagged", AGENT_INSTRUCTIONS_PY, "cut=True", "cut=False"),
    _agent(
        "instructions_file_limit_a_kib",
        AGENT_INSTRUCTIONS_PY,
        "MAX_INSTRUCTION_FILE_BYTES = 2**20",
        "MAX_INSTRUCTION_FILE_BYTES = 2**10",
    ),
    _agent(
        "instructions_one_line_plural",
        AGENT_INSTRUCTIONS_PY,
        "'s' * (lines != 1)",
        "'s' * (lines > 0)",
    ),
    _agent(
        "instructions_invalid_utf8_raises",
        AGENT_INSTRUCTIONS_PY,
        'errors="replace"',
        'errors="strict"',
    ),
    # symbols: the suffixes, the kinds of definition, lines and names.
    _agent("symbols_pyi_not_python", AGENT_SYMBOLS_PY, '    ".pyi": "python",\n', ""),
    _agent("symbols_header_not_c", AGENT_SYMBOLS_PY, '    ".h": "c",\n', ""),
    _agent("symbols_jsx_not_javascript", AGENT_SYMBOLS_PY, '    ".jsx": "javascript",\n', ""),
    _agent("symbols_suffix_case_sensitive", AGENT_SYMBOLS_PY, "path.suffix.lower()", "path.suffix"),
    _agent("symbols_c_union_not_listed", AGENT_SYMBOLS_PY, '"union_specifier": "union",', ""),
    _agent("symbols_c_typedef_not_listed", AGENT_SYMBOLS_PY, '"type_definition": "typedef",', ""),
    _agent(
        "symbols_js_generator_not_listed",
        AGENT_SYMBOLS_PY,
        '"generator_function_declaration": "function",',
        "",
    ),
    _agent(
        "symbols_go_types_not_listed",
        AGENT_SYMBOLS_PY,
        '"method_declaration": "method", "type_spec": "type"}',
        '"method_declaration": "method"}',
    ),
    _agent("symbols_rust_trait_not_listed", AGENT_SYMBOLS_PY, '"trait_item": "trait",', ""),
    _agent("symbols_rust_module_not_listed", AGENT_SYMBOLS_PY, '"mod_item": "module",', ""),
    _agent(
        "symbols_js_function_expression_not_a_function",
        AGENT_SYMBOLS_PY,
        '{"arrow_function", "function_expression",',
        '{"arrow_function",',
    ),
    _agent(
        "symbols_start_line_zero_based",
        AGENT_SYMBOLS_PY,
        "child.start_point[0] + 1,",
        "child.start_point[0],",
    ),
    _agent(
        "symbols_end_line_zero_based",
        AGENT_SYMBOLS_PY,
        "child.end_point[0] + 1",
        "child.end_point[0]",
    ),
    _agent(
        "symbols_impl_named_without_impl",
        AGENT_SYMBOLS_PY,
        'f"impl {_text(implemented)}"',
        "_text(implemented)",
    ),
    _agent(
        "symbols_any_js_variable_a_function",
        AGENT_SYMBOLS_PY,
        "if value is None or value.type not in _JS_FUNCTION_VALUES:",
        "if value is None:",
    ),
    _agent(
        "symbols_c_union_named_by_declarator",
        AGENT_SYMBOLS_PY,
        '("struct_specifier", "union_specifier", "enum_specifier")',
        '("struct_specifier", "enum_specifier")',
    ),
    _agent(
        "symbols_c_parenthesised_declarator_not_entered",
        AGENT_SYMBOLS_PY,
        'if declarator.type == "parenthesized_declarator":',
        'if declarator.type == "parenthesised_declarator":',
    ),
    _agent("symbols_cancel_ignored", AGENT_SYMBOLS_PY, "    if cancelled():\n", "    if False:\n"),
    # mentions: what is refused, counted, cut and completed.
    _agent(
        "mentions_folder_check_on_links",
        MENTIONS_PY,
        "if path.is_dir():",
        "if path.is_symlink():",
    ),
    _agent(
        "mentions_os_error_shown_raw",
        MENTIONS_PY,
        "{getattr(exc, 'strerror', None) or exc}",
        "{exc}",
    ),
    _agent("mentions_binary_sniff_one_short", MENTIONS_PY, "data[:8192]", "data[:8191]"),
    _agent(
        "mentions_empty_file_one_line",
        MENTIONS_PY,
        "(1 if text and not text.endswith",
        "(1 if not text.endswith",
    ),
    _agent(
        "mentions_file_of_exactly_the_limit_cut",
        MENTIONS_PY,
        "if len(text) > MAX_ATTACHED_CHARS:",
        "if len(text) >= MAX_ATTACHED_CHARS:",
    ),
    _agent(
        "mentions_cut_not_said_in_the_note",
        MENTIONS_PY,
        'note += f", cut to {MAX_ATTACHED_CHARS} characters"',
        'note += ""',
    ),
    _agent("mentions_block_keeps_trailing_newlines", MENTIONS_PY, "text.rstrip(chr(10))", "text"),
    _agent(
        "mentions_blocks_joined_by_one_newline",
        MENTIONS_PY,
        '"\\n\\n".join(blocks)',
        '"\\n".join(blocks)',
    ),
    _agent(
        "mentions_completion_inside_a_word",
        MENTIONS_PY,
        'r"(?:(?<=\\s)|^)@(\\S*)$"',
        'r"@(\\S*)$"',
    ),
    _agent(
        "mentions_completion_of_nothing_is_empty",
        MENTIONS_PY,
        "return shared[len(name_part) :] or None",
        "return shared[len(name_part) :]",
    ),
    # tools: the exact text of results and errors.
    _agent(
        "tools_os_error_shown_raw",
        TOOLS_PY,
        'return ToolResult(f"error: {exc.strerror or exc}", is_error=True)',
        'return ToolResult(f"error: {exc}", is_error=True)',
    ),
    _agent(
        "tools_changed_files_unsorted",
        TOOLS_PY,
        '", ".join(sorted(self.changed_files))',
        '", ".join(reversed(sorted(self.changed_files)))',
    ),
    _agent(
        "tools_listed_file_without_its_size",
        TOOLS_PY,
        'ToolResult(f"{target.stat().st_size:8d}  {self.workspace.relative(target)}")',
        'ToolResult(f"{self.workspace.relative(target)}")',
    ),
    _agent(
        "tools_fifo_listed_as_empty",
        TOOLS_PY,
        'if not target.is_dir():\n            raise ToolError(f"{path} is not a file or folder")',
        'if False:\n            raise ToolError(f"{path} is not a file or folder")',
    ),
    _agent(
        "tools_folder_listed_without_slash",
        TOOLS_PY,
        '{relative.as_posix()}/")',
        '{relative.as_posix()}")',
    ),
    _agent(
        "tools_empty_folder_says_nothing",
        TOOLS_PY,
        '"\\n".join(lines) if lines else "(empty folder)"',
        '"\\n".join(lines)',
    ),
    _agent(
        "tools_empty_file_says_nothing",
        TOOLS_PY,
        'ToolResult(shown or "(empty file)")',
        "ToolResult(shown)",
    ),
    _agent(
        "tools_line_numbers_unpadded",
        TOOLS_PY,
        'f"{n:5d}  {line}"',
        'f"{n}  {line}"',
    ),
    _agent(
        "tools_search_file_of_exactly_the_limit_refused",
        TOOLS_PY,
        "target.stat().st_size > MAX_SEARCH_FILE_BYTES:",
        "target.stat().st_size >= MAX_SEARCH_FILE_BYTES:",
    ),
    _agent(
        "tools_fifo_searched",
        TOOLS_PY,
        "if not target.is_dir() and not is_regular(target):",
        "if not target.is_dir() and not target.exists():",
    ),
    _agent(
        "tools_write_counts_characters_as_bytes",
        TOOLS_PY,
        "{lines} lines, {len(data)} bytes",
        "{lines} lines, {len(content)} bytes",
    ),
    _agent(
        "tools_write_of_nothing_one_line",
        TOOLS_PY,
        'lines = content.count("\\n") + (1 if content and not',
        'lines = content.count("\\n") + (1 if not',
    ),
    _agent(
        "tools_edit_reports_context_lines",
        TOOLS_PY,
        'if line[:1] in "+-"]',
        'if line[:1] in "+- "]',
    ),
    _agent(
        "tools_outline_of_a_folder_without_a_name",
        TOOLS_PY,
        "elif name is None:",
        "elif name == '':",
    ),
    _agent(
        "tools_outline_without_depth_indent",
        TOOLS_PY,
        "{'  ' * s.depth}{s.kind}",
        "{s.kind}",
    ),
    _agent(
        "tools_outline_end_line_right_aligned",
        TOOLS_PY,
        "{s.end_line:<5d}",
        "{s.end_line:5d}",
    ),
    _agent(
        "tools_no_definitions_for_an_empty_outline",
        TOOLS_PY,
        'if name else "no definitions"',
        'if name else "no definition of None"',
    ),
    _agent(
        "tools_supported_suffixes_unsorted",
        TOOLS_PY,
        "', '.join(sorted(symbols.LANGUAGE_BY_SUFFIX))",
        "', '.join(symbols.LANGUAGE_BY_SUFFIX)",
    ),
    _agent(
        "tools_edit_of_a_blank_path",
        TOOLS_PY,
        'if not path.strip():\n            raise ToolError("the path is empty; give the file to e',
        'if not path:\n            raise ToolError("the path is empty; give the file to e',
    ),
    _agent(
        "tools_edit_of_empty_old_allowed",
        TOOLS_PY,
        "if not old:",
        "if old is None:",
    ),
    _agent(
        "tools_write_over_a_fifo",
        TOOLS_PY,
        "if target.exists() and not is_regular(target):",
        "if not target.exists() and not is_regular(target):",
    ),
    _agent(
        "tools_preview_of_no_change_is_empty",
        TOOLS_PY,
        'return diff or f"(no change to {relative})"',
        "return diff",
    ),
    _agent(
        "tools_empty_command_runs",
        TOOLS_PY,
        'if not command:\n            raise ToolError("the command is empty")',
        'if command is None:\n            raise ToolError("the command is empty")',
    ),
    _agent(
        "tools_no_jobs_gives_empty_status",
        TOOLS_PY,
        'return ToolResult("no background jobs")',
        'return ToolResult("")',
    ),
    _agent(
        "tools_stopping_a_finished_job_stops_it_again",
        TOOLS_PY,
        "if not found.running:\n            return ToolResult(found.state())",
        "if found is None:\n            return ToolResult(found.state())",
    ),
    _agent(
        "tools_exit_code_not_shown",
        TOOLS_PY,
        'output += f"\\n(exit code {outcome.exit_code})"',
        "output += ''",
    ),
    _agent(
        "tools_unknown_parameter_not_named",
        TOOLS_PY,
        'its "\n            f"parameters are {\', \'.join(properties)}"',
        'its "\n            f"parameters are {\', \'.join(sorted(properties))}"',
    ),
    _agent(
        "tools_binary_sniff_one_short",
        TOOLS_PY,
        'if b"\\x00" in data[:8192]:\n        raise ToolError(f"{path.name} is a binary file")',
        'if b"\\x00" in data[:8191]:\n        raise ToolError(f"{path.name} is a binary file")',
    ),
    _agent(
        "tools_no_match_without_the_pattern",
        TOOLS_PY,
        'else f"no match for {pattern!r}"',
        'else "no match"',
    ),
)
