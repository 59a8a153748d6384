"""The agent modules no earlier hardening went through line by line, hardened against blind
mutations (issue 37, session 19): the tools (walks and searches that stop early, what bash,
status and stop add to an output, writes, previews), the slash commands (/undo and /diff and
their failures), saved conversations (a failed save, temporaries gone mid-cleanup), compaction,
the tool schemas, the prompt's history, mentions, outlines, the markup filter, file reads,
project instructions, kept model states and event notes. Each entry was applied by hand (or by
a screening run) and run against the test files that guard its module: it fails with the
change and passes without. Lines an earlier set already mutates (same file and old text) were
left out, so the entries land where the blind writer lands next.

Left out as equivalent: the missing-file hint without its ``path != path.strip()`` test (the
stripped path of a name without spaces is the name, which does not exist either); ``edit``
replacing every occurrence instead of one (an edit whose old text occurs more than once is
refused before it is made); the markup filter preferring the shorter of two openers found at one
place (no two of its openers can start at the same place) and taking a closing tag found at 0
(the search starts after the opening tag); C's ``field_identifier`` at the end of a declarator
chain (only struct members end there, and they are no definitions).

Test selection as in the fresh sets: the whole ``tests/agent`` folder (``base.in_agent_folder``).

The 2 entries found identical to fresh10's (written the same evening by the blind writer, who
never saw this set) were taken out of this set: fresh10 keeps them.
"""

from __future__ import annotations

from mutation_sets import base
from mutation_sets.base import Mutation
from mutation_sets.base import in_agent_folder as _agent

MUTATIONS: tuple[Mutation, ...] = (
    # tools.py: the tools: walks, searches, reads, writes, commands, jobs.
    _agent(
        "tools_list_at_least_without_stop",
        base.TOOLS_PY,
        'more = "at least " if walk.stopped else ""',
        'more = "at least " if omitted else ""',
    ),
    _agent(
        "tools_list_stop_reason_dropped",
        base.TOOLS_PY,
        "        if walk.stopped:\n            lines.append(walk.stopped)\n",
        "",
    ),
    _agent(
        "tools_read_past_end_count",
        base.TOOLS_PY,
        'raise ToolError(f"{path} has {len(lines)} lines; start {start} is past the end")',
        'raise ToolError(f"{path} has {len(lines) - 1} lines; start {start} is past the end")',
    ),
    _agent(
        "tools_more_end_names_path",
        base.TOOLS_PY,
        'return ToolResult(f"(end of {self.workspace.relative(target)})")',
        'return ToolResult("(end of file)")',
    ),
    _agent(
        "tools_show_lines_end_max",
        base.TOOLS_PY,
        "end = min(end, len(lines))",
        "end = max(end, len(lines))",
    ),
    _agent(
        "tools_show_lines_remaining_off_by_one",
        base.TOOLS_PY,
        "remaining = len(lines) - end",
        "remaining = len(lines) - end - 1",
    ),
    _agent(
        "tools_search_size_limit_message",
        base.TOOLS_PY,
        'f"{path} is larger than {MAX_SEARCH_FILE_BYTES // 2**20} MiB; search a smaller file"',
        'f"{path} is larger than {MAX_SEARCH_FILE_BYTES} MiB; search a smaller file"',
    ),
    _agent(
        "tools_write_no_parent_folders",
        base.TOOLS_PY,
        "target.parent.mkdir(parents=True, exist_ok=True)",
        "target.parent.mkdir(exist_ok=True)",
    ),
    _agent(
        "tools_edit_writes_replacement_bytes",
        base.TOOLS_PY,
        'write_atomically(target, after.encode("utf-8", errors="surrogateescape"))',
        'write_atomically(target, after.encode("utf-8", errors="replace"))',
    ),
    _agent(
        "tools_edit_summary_count",
        base.TOOLS_PY,
        (
            'return ToolResult(f"edited {relative}: 1 replacement\\n" + "\\n".join(changed), '
            "diff=diff)"
        ),
        'return ToolResult(f"edited {relative}: 1 replacement\\n" + "\\n".join(changed))',
    ),
    _agent(
        "tools_symbols_outline_ignores_name",
        base.TOOLS_PY,
        "found = [(target, s) for s in self._outline(target) if name in (None, s.name)]",
        "found = [(target, s) for s in self._outline(target)]",
    ),
    _agent(
        "tools_symbols_size_boundary",
        base.TOOLS_PY,
        "and _size(file) <= MAX_OUTLINE_FILE_BYTES",
        "and _size(file) < MAX_OUTLINE_FILE_BYTES",
    ),
    _agent(
        "tools_symbols_walk_stop_dropped",
        base.TOOLS_PY,
        "            stopped = walk.stopped\n",
        "",
    ),
    _agent(
        "tools_symbols_file_outline_with_name",
        base.TOOLS_PY,
        "if target.is_file() and name is None:",
        "if target.is_file():",
    ),
    _agent(
        "tools_symbols_listing_line_range",
        base.TOOLS_PY,
        'f"{self.workspace.relative(file)}:{s.start_line}-{s.end_line}: {s.kind} {s.name}"',
        'f"{self.workspace.relative(file)}:{s.start_line}: {s.kind} {s.name}"',
    ),
    _agent(
        "tools_write_over_folder",
        base.TOOLS_PY,
        (
            "        if target.is_dir():\n"
            '            raise ToolError(f"{path} is a folder")\n'
            "        for folder"
        ),
        "        for folder",
    ),
    _agent(
        "tools_write_before_of_new_file",
        base.TOOLS_PY,
        'return target, _read_text(target) if target.exists() else ""',
        'return target, ""',
    ),
    _agent(
        "tools_edit_of_folder",
        base.TOOLS_PY,
        (
            "        target = self._existing(path)\n"
            "        if target.is_dir():\n"
            '            raise ToolError(f"{path} is a folder")\n'
        ),
        "        target = self._existing(path)\n",
    ),
    _agent(
        "tools_planned_write_content",
        base.TOOLS_PY,
        'return target, before, arguments["content"]',
        "return target, before, before",
    ),
    _agent(
        "tools_would_fail_errno_text",
        base.TOOLS_PY,
        "return ToolResult(f\"error: {getattr(exc, 'strerror', None) or exc}\", is_error=True)",
        'return ToolResult(f"error: {exc}", is_error=True)',
    ),
    _agent(
        "tools_background_keeps_ampersand_space",
        base.TOOLS_PY,
        "job = self.jobs.start(command[:-1].rstrip())",
        "job = self.jobs.start(command[:-1])",
    ),
    _agent(
        "tools_cancelled_command_unsaid",
        base.TOOLS_PY,
        '            output += "\\n(stopped by the user)"\n',
        "            pass\n",
    ),
    _agent(
        "tools_leftovers_unsaid",
        base.TOOLS_PY,
        "if outcome.stopped_leftovers:",
        "if outcome.stopped_leftovers and outcome.exit_code:",
    ),
    _agent(
        "tools_status_room_for_state",
        base.TOOLS_PY,
        'output = each.new_output(self.max_output_chars - 200).rstrip("\\n")',
        'output = each.new_output(self.max_output_chars).rstrip("\\n")',
    ),
    _agent(
        "tools_stop_output_dropped",
        base.TOOLS_PY,
        'return ToolResult(f"stopped job {job}" + (f"\\n{output}" if output else ""))',
        'return ToolResult(f"stopped job {job}")',
    ),
    _agent(
        "tools_missing_argument_accepted",
        base.TOOLS_PY,
        'missing = [name for name in schema["required"] if name not in call.arguments]',
        'missing = [name for name in schema["required"] if name in call.arguments]',
    ),
    _agent(
        "tools_size_of_vanished_file",
        base.TOOLS_PY,
        "    except OSError:\n        return 0\n",
        "    except FileExistsError:\n        return 0\n",
    ),
    _agent(
        "tools_search_size_boundary",
        base.TOOLS_PY,
        "if is_folder or _size(file) > MAX_SEARCH_FILE_BYTES or not is_regular(file):",
        "if is_folder or _size(file) >= MAX_SEARCH_FILE_BYTES or not is_regular(file):",
    ),
    _agent(
        "tools_search_binary_file_ends_search",
        base.TOOLS_PY,
        (
            "                except (ToolError, OSError):  # binary or unreadable: not for a "
            "text search\n"
            "                    continue"
        ),
        (
            "                except (ToolError, OSError):  # binary or unreadable: not for a "
            "text search\n"
            "                    return"
        ),
    ),
    _agent(
        "tools_search_binary_file_raises",
        base.TOOLS_PY,
        "except (ToolError, OSError):  # binary or unreadable",
        "except OSError:  # binary or unreadable",
    ),
    _agent(
        "tools_search_entry_limit_unsaid",
        base.TOOLS_PY,
        "if walk.stopped and not self._stop.is_set():  # the walk's entry limit",
        "if walk.stopped and self._stop.is_set():  # the walk's entry limit",
    ),
    _agent(
        "tools_search_stop_within_a_file",
        base.TOOLS_PY,
        "            if self._stop.is_set():\n                return False\n            try:",
        "            try:",
    ),
    _agent(
        "tools_search_error_after_stop",
        base.TOOLS_PY,
        "if self.error and not self._stop.is_set():",
        "if self.error:",
    ),
    _agent(
        "tools_search_keeps_one_too_many",
        base.TOOLS_PY,
        "lines = list(self.matches[:MAX_SEARCH_MATCHES])",
        "lines = list(self.matches)",
    ),
    _agent(
        "tools_walk_cancel_unsaid",
        base.TOOLS_PY,
        'self.stopped = "(stopped by the user; the result is incomplete)"',
        'self.stopped = ""',
    ),
    _agent(
        "tools_walk_deadline_boundary",
        base.TOOLS_PY,
        "elif self.remaining() <= 0:",
        "elif self.remaining() < 0:",
    ),
    _agent(
        "tools_walk_deadline_message",
        base.TOOLS_PY,
        'self.stopped = f"(stopped after {self.seconds:g}s; the result is incomplete)"',
        'self.stopped = "(stopped; the result is incomplete)"',
    ),
    _agent(
        "tools_walk_expired_goes_on",
        base.TOOLS_PY,
        "            if self.expired():\n                return\n            yield entry",
        "            if self.expired():\n                continue\n            yield entry",
    ),
    _agent(
        "tools_diff_context_lines",
        base.TOOLS_PY,
        "            n=2,\n",
        "            n=3,\n",
    ),
    _agent(
        "tools_clip_cut_count",
        base.TOOLS_PY,
        "cut = len(text) - head - tail",
        "cut = len(text) - head",
    ),
    _agent(
        "tools_search_cancel_unsaid",
        base.TOOLS_PY,
        'search.stop("(stopped by the user; the result is incomplete)")',
        'search.stop("")',
    ),
    _agent(
        "tools_status_job_zero_lists_all",
        base.TOOLS_PY,
        "jobs = [self._job(job)] if job is not None else list(self.jobs.jobs.values())",
        "jobs = [self._job(job)] if job else list(self.jobs.jobs.values())",
    ),
    _agent(
        "tools_status_reports_run_together",
        base.TOOLS_PY,
        'return ToolResult("\\n\\n".join(reports))',
        'return ToolResult("\\n".join(reports))',
    ),
    _agent(
        "tools_run_drops_the_diff",
        base.TOOLS_PY,
        "self.max_output_chars), result.is_error, result.diff)",
        "self.max_output_chars), result.is_error)",
    ),
    _agent(
        "tools_list_omitted_counts_one",
        base.TOOLS_PY,
        "                omitted += 1\n",
        "                omitted = 1\n",
    ),
    _agent(
        "tools_symbols_walk_opens_a_fifo",
        base.TOOLS_PY,
        "                and is_regular(file)\n",
        "",
    ),
    _agent(
        "tools_missing_hint_dropped",
        base.TOOLS_PY,
        'hint = f" (note the spaces around the name; {path.strip()!r} exists)"',
        'hint = ""',
    ),
    _agent(
        "tools_slow_pattern_line_length",
        base.TOOLS_PY,
        'f"{number} ({len(line)} characters) and the search was stopped; it likely "',
        'f"{number} and the search was stopped; it likely "',
    ),
    _agent(
        "tools_more_matches_message",
        base.TOOLS_PY,
        'f"... more than {MAX_SEARCH_MATCHES} matches; narrow the pattern or the path"',
        '"... more matches; narrow the pattern or the path"',
    ),
    # commands.py: slash commands and their error paths.
    _agent(
        "commands_unknown_names_it",
        base.COMMANDS_PY,
        'return CommandOutcome(f"unknown command {name}; /help lists them")',
        'return CommandOutcome("unknown command; /help lists them")',
    ),
    _agent(
        "commands_empty_conversation_saved",
        base.COMMANDS_PY,
        (
            "        if self.agent.conversation.is_empty:\n"
            '            return ""\n'
            '        return f"saved as'
        ),
        '        return f"saved as',
    ),
    _agent(
        "commands_state_kept_when_nothing_saved",
        base.COMMANDS_PY,
        'kept = states.save(self.agent) if states is not None and note else ""',
        'kept = states.save(self.agent) if states is not None else ""',
    ),
    _agent(
        "commands_no_saved_names_folder",
        base.COMMANDS_PY,
        'return CommandOutcome(f"no saved conversations in {self.store.folder}")',
        'return CommandOutcome("no saved conversations")',
    ),
    _agent(
        "commands_deleted_current_keeps_name",
        base.COMMANDS_PY,
        (
            "            self.agent.conversation.name = None  # it lives on unsaved until "
            "saved again\n"
        ),
        "            pass\n",
    ),
    _agent(
        "commands_undo_oserror_escapes",
        base.COMMANDS_PY,
        (
            "        except (CheckpointError, OSError) as exc:\n"
            '            return CommandOutcome(f"error: undo failed: {exc}")'
        ),
        (
            "        except CheckpointError as exc:\n"
            '            return CommandOutcome(f"error: undo failed: {exc}")'
        ),
    ),
    _agent(
        "commands_undo_error_unsaid",
        base.COMMANDS_PY,
        'return CommandOutcome(f"error: undo failed: {exc}")',
        'return CommandOutcome("error: undo failed")',
    ),
    _agent(
        "commands_diff_oserror_escapes",
        base.COMMANDS_PY,
        (
            "        except (CheckpointError, OSError) as exc:\n"
            '            return CommandOutcome(f"error: {exc}")'
        ),
        (
            "        except CheckpointError as exc:\n"
            '            return CommandOutcome(f"error: {exc}")'
        ),
    ),
    _agent(
        "commands_diff_error_unsaid",
        base.COMMANDS_PY,
        (
            "            diff = self.agent.checkpoints.diff()\n"
            "        except (CheckpointError, OSError) as exc:\n"
            '            return CommandOutcome(f"error: {exc}")'
        ),
        (
            "            diff = self.agent.checkpoints.diff()\n"
            "        except (CheckpointError, OSError):\n"
            '            return CommandOutcome("error: no diff")'
        ),
    ),
    _agent(
        "commands_clear_counts_after",
        base.COMMANDS_PY,
        'return CommandOutcome(f"forgot {forgotten} rule(s); write, edit and bash ask again")',
        (
            'return CommandOutcome(f"forgot {len(permissions.rules)} rule(s); write, edit '
            'and bash ask again")'
        ),
    ),
    _agent(
        "commands_strip_before_counted_after",
        base.COMMANDS_PY,
        (
            "        before = self.agent.context_tokens()\n"
            "        stripped = self.agent.strip_tool_outputs()"
        ),
        (
            "        stripped = self.agent.strip_tool_outputs()\n"
            "        before = self.agent.context_tokens()"
        ),
    ),
    _agent(
        "commands_hints_bad_argument_toggles",
        base.COMMANDS_PY,
        '            return CommandOutcome("usage: /hints on|off")',
        "            value = not self.hints",
    ),
    _agent(
        "commands_quit_does_not_quit",
        base.COMMANDS_PY,
        "return CommandOutcome(self.leave_current(), quit=True)",
        "return CommandOutcome(self.leave_current())",
    ),
    _agent(
        "commands_handle_unstripped_line",
        base.COMMANDS_PY,
        'name, _, argument = line.strip().partition(" ")',
        'name, _, argument = line.partition(" ")',
    ),
    _agent(
        "commands_list_time_without_minutes",
        base.COMMANDS_PY,
        'when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.saved))',
        'when = time.strftime("%Y-%m-%d", time.localtime(entry.saved))',
    ),
    # conversations.py: saving, loading, listing, cleaning up.
    _agent(
        "conversations_workspace_not_saved",
        base.CONVERSATIONS_PY,
        '            "workspace": self.workspace,\n',
        '            "workspace": None,\n',
    ),
    _agent(
        "conversations_nested_folder",
        base.CONVERSATIONS_PY,
        "self.folder.mkdir(parents=True, exist_ok=True)",
        "self.folder.mkdir(exist_ok=True)",
    ),
    _agent(
        "conversations_name_not_kept",
        base.CONVERSATIONS_PY,
        "        conversation.name = name\n        self.remove_stale",
        "        self.remove_stale",
    ),
    _agent(
        "conversations_failed_save_leaves_temporary",
        base.CONVERSATIONS_PY,
        (
            "        except BaseException:\n"
            "            Path(temporary).unlink(missing_ok=True)\n"
            "            raise"
        ),
        (
            "        except OSError:\n"
            "            Path(temporary).unlink(missing_ok=True)\n"
            "            raise"
        ),
    ),
    _agent(
        "conversations_latest_none_message",
        base.CONVERSATIONS_PY,
        'raise ConversationError(f"no saved conversation for {workspace} in {self.folder}")',
        'raise ConversationError("no saved conversation")',
    ),
    _agent(
        "conversations_state_temporaries_kept",
        base.CONVERSATIONS_PY,
        "[p for pattern in patterns for p in self.folder.glob(pattern)]",
        "[p for p in self.folder.glob(patterns[0])]",
    ),
    _agent(
        "conversations_vanished_temporary_raises",
        base.CONVERSATIONS_PY,
        (
            "            except OSError:  # another process removed or renamed it\n"
            "                continue"
        ),
        (
            "            except PermissionError:  # another process removed or renamed it\n"
            "                continue"
        ),
    ),
    _agent(
        "conversations_listed_workspace_lost",
        base.CONVERSATIONS_PY,
        '                        workspace=data.get("workspace"),\n',
        "",
    ),
    _agent(
        "conversations_unreadable_listed_with_messages",
        base.CONVERSATIONS_PY,
        "found.append(SavedConversation(path.stem, 0, path.stat().st_mtime, str(exc)))",
        "found.append(SavedConversation(path.stem, 0, path.stat().st_mtime))",
    ),
    _agent(
        "conversations_non_dict_file_crashes",
        base.CONVERSATIONS_PY,
        'messages = data.get("messages") if isinstance(data, dict) else None',
        'messages = data.get("messages")',
    ),
    _agent(
        "conversations_list_globs_every_file",
        base.CONVERSATIONS_PY,
        'for path in self.folder.glob("*.json") if self.folder.is_dir() else ():',
        'for path in self.folder.glob("*") if self.folder.is_dir() else ():',
    ),
    # compaction.py: budgets, the plan, the transcript, the summary.
    _agent(
        "compaction_tail_budget_share",
        base.COMPACTION_PY,
        "tail=max(context_size // 10, 32)",
        "tail=max(context_size // 8, 32)",
    ),
    _agent(
        "compaction_task_budget_floor",
        base.COMPACTION_PY,
        "task=max(context_size // 20, 32)",
        "task=max(context_size // 20, 16)",
    ),
    _agent(
        "compaction_system_anywhere",
        base.COMPACTION_PY,
        'system = [m for m in messages[:1] if m["role"] == "system"]',
        'system = [m for m in messages if m["role"] == "system"]',
    ),
    _agent(
        "compaction_tail_counts_last_only",
        base.COMPACTION_PY,
        "used += count(_clipped_for_tail(body[index], budgets))",
        "used = count(_clipped_for_tail(body[index], budgets))",
    ),
    _agent(
        "compaction_task_budget_in_chars",
        base.COMPACTION_PY,
        '_clip(task["content"], budgets.task * 4)',
        '_clip(task["content"], budgets.task)',
    ),
    _agent(
        "compaction_transcript_clip",
        base.COMPACTION_PY,
        'content = _clip(message.get("content") or "", _TRANSCRIPT_MESSAGE_CHARS)',
        'content = message.get("content") or ""',
    ),
    _agent(
        "compaction_transcript_argument_clip",
        base.COMPACTION_PY,
        'f"{k}={_clip(str(v), 200)!r}"',
        'f"{k}={str(v)!r}"',
    ),
    _agent(
        "compaction_transcript_role_case",
        base.COMPACTION_PY,
        'lines.append(f"{role.capitalize()}: {content}")',
        'lines.append(f"{role}: {content}")',
    ),
    _agent(
        "compaction_request_clip",
        base.COMPACTION_PY,
        '_clip(m["content"], 300)',
        'm["content"]',
    ),
    _agent(
        "compaction_empty_summary_unsaid",
        base.COMPACTION_PY,
        'summary.strip() or "(the model wrote no summary)"',
        "summary.strip()",
    ),
    _agent(
        "compaction_open_state_dropped",
        base.COMPACTION_PY,
        "    if open_state:\n        parts.append(",
        "    if not open_state:\n        parts.append(",
    ),
    _agent(
        "compaction_assemble_task_after_tail",
        base.COMPACTION_PY,
        "return [*plan.system, summary, *task, *plan.tail]",
        "return [*plan.system, summary, *plan.tail, *task]",
    ),
    _agent(
        "compaction_clip_at_exactly_the_limit",
        base.COMPACTION_PY,
        "    if len(text) <= limit:\n        return text\n    return text[:limit]",
        "    if len(text) < limit:\n        return text\n    return text[:limit]",
    ),
    _agent(
        "compaction_clip_dropped_count",
        base.COMPACTION_PY,
        'f" [... {len(text) - limit} characters dropped at compaction]"',
        'f" [... {len(text)} characters dropped at compaction]"',
    ),
    # tool_schemas.py: what each tool requires and accepts.
    _agent(
        "schemas_read_path_optional",
        base.AGENT_TOOL_SCHEMAS_PY,
        (
            '        {"path": _PATH, "start": {"type": "integer"}, "end": {"type": "integer"}},\n'
            '        ["path"],'
        ),
        (
            '        {"path": _PATH, "start": {"type": "integer"}, "end": {"type": "integer"}},\n'
            "        [],"
        ),
    ),
    _agent(
        "schemas_read_start_string",
        base.AGENT_TOOL_SCHEMAS_PY,
        '{"path": _PATH, "start": {"type": "integer"}, "end": {"type": "integer"}}',
        '{"path": _PATH, "start": {"type": "string"}, "end": {"type": "integer"}}',
    ),
    _agent(
        "schemas_bash_command_optional",
        base.AGENT_TOOL_SCHEMAS_PY,
        '        {"command": {"type": "string"}},\n        ["command"],',
        '        {"command": {"type": "string"}},\n        [],',
    ),
    _agent(
        "schemas_list_path_required",
        base.AGENT_TOOL_SCHEMAS_PY,
        '_tool("list", "List files and folders with their sizes.", {"path": _PATH}, ["path"])',
        '_tool("list", "List files and folders with their sizes.", {"path": _PATH}, [])',
    ),
    # prompt_input.py: the prompt's history and its messages.
    _agent(
        "prompt_history_next_past_draft",
        base.PROMPT_INPUT_PY,
        "if self.position >= len(self.entries):",
        "if self.position > len(self.entries):",
    ),
    _agent(
        "prompt_history_garbage_line_ends_read",
        base.PROMPT_INPUT_PY,
        "            except json.JSONDecodeError:\n                continue",
        "            except json.JSONDecodeError:\n                break",
    ),
    _agent(
        "prompt_history_next_skips_draft",
        base.PROMPT_INPUT_PY,
        "return self.entries[self.position] if self.position < len(self.entries) else self.draft",
        'return self.entries[self.position] if self.position < len(self.entries) else ""',
    ),
    _agent(
        "prompt_submitted_control",
        base.PROMPT_INPUT_PY,
        "            return self.input\n",
        "            return None  # type: ignore[return-value]\n",
    ),
    # mentions.py: attached files and Tab completion.
    _agent(
        "mentions_missing_file_message",
        base.MENTIONS_PY,
        'result.refused.append(f"@{raw}: no such file in the workspace")',
        'result.refused.append(f"@{raw}: {raw}")',
    ),
    _agent(
        "mentions_binary_attached",
        base.MENTIONS_PY,
        '            result.refused.append(f"@{raw}: a binary file")\n            continue',
        '            result.refused.append(f"@{raw}: a binary file")',
    ),
    _agent(
        "mentions_plural_lines",
        base.MENTIONS_PY,
        "note = f\"{relative} ({lines} line{'s' * (lines != 1)}\"",
        'note = f"{relative} ({lines} lines"',
    ),
    _agent(
        "mentions_cut_marker_line",
        base.MENTIONS_PY,
        'f"\\n[... cut: {relative} goes on; read it from line {shown} for the rest ...]"',
        'f"\\n[... cut: {relative} goes on ...]"',
    ),
    _agent(
        "mentions_completion_in_root_only",
        base.MENTIONS_PY,
        'folder = workspace.resolve(folder_part or ".")',
        'folder = workspace.resolve(".")',
    ),
    _agent(
        "mentions_completion_all_names",
        base.MENTIONS_PY,
        "            if entry.name.startswith(name_part)\n",
        "            if name_part in entry.name\n",
    ),
    _agent(
        "mentions_completion_no_shared_prefix",
        base.MENTIONS_PY,
        "shared = os.path.commonprefix(names)",
        "shared = names[0]",
    ),
    # symbols.py: languages, kinds of definitions, nesting.
    _agent(
        "symbols_rust_suffix",
        base.AGENT_SYMBOLS_PY,
        '    ".rs": "rust",\n',
        "",
    ),
    _agent(
        "symbols_mjs_suffix",
        base.AGENT_SYMBOLS_PY,
        '    ".mjs": "javascript",\n',
        "",
    ),
    _agent(
        "symbols_python_class",
        base.AGENT_SYMBOLS_PY,
        '"python": {"function_definition": "function", "class_definition": "class"}',
        '"python": {"function_definition": "function"}',
    ),
    _agent(
        "symbols_c_struct",
        base.AGENT_SYMBOLS_PY,
        '        "struct_specifier": "struct",\n',
        "",
    ),
    _agent(
        "symbols_c_enum",
        base.AGENT_SYMBOLS_PY,
        '        "enum_specifier": "enum",\n        "type_definition"',
        '        "type_definition"',
    ),
    _agent(
        "symbols_js_method",
        base.AGENT_SYMBOLS_PY,
        '        "method_definition": "method",\n',
        "",
    ),
    _agent(
        "symbols_rust_enum",
        base.AGENT_SYMBOLS_PY,
        '        "enum_item": "enum",\n        "trait_item"',
        '        "trait_item"',
    ),
    _agent(
        "symbols_rust_struct",
        base.AGENT_SYMBOLS_PY,
        '        "struct_item": "struct",\n',
        "",
    ),
    _agent(
        "symbols_nested_same_depth",
        base.AGENT_SYMBOLS_PY,
        "yield from _definitions(child, language, depth, cancelled)",
        "yield from _definitions(child, language, depth + 1, cancelled)",
    ),
    _agent(
        "symbols_c_type_identifier",
        base.AGENT_SYMBOLS_PY,
        '        "type_identifier",\n',
        "",
    ),
    # markup.py: tool-call markup in the answer text.
    _agent(
        "markup_cut_off_block_shown",
        base.MARKUP_PY,
        (
            '                    self._block, "cut-off tool call: the answer ended inside '
            'tool-call markup"'
        ),
        '                    self._block, "tool-call markup in the answer text"',
    ),
    _agent(
        "markup_pending_lost_at_finish",
        base.MARKUP_PY,
        "        elif self._pending:\n            out.append(TextDelta(self._pending))",
        "        elif self._pending:\n            pass",
    ),
    _agent(
        "markup_enclosing_latest_close",
        base.MARKUP_PY,
        "end = min(found)[1]",
        "end = max(found)[1]",
    ),
    _agent(
        "markup_rest_lost",
        base.MARKUP_PY,
        "        self._pending = rest\n        return True",
        '        self._pending = ""\n        return True',
    ),
    # files.py: reading regular files, sizes in messages.
    _agent(
        "files_block_device_kind",
        base.FILES_PY,
        '    (stat.S_ISBLK, "a block device"),\n',
        "",
    ),
    _agent(
        "files_default_shown_name",
        base.FILES_PY,
        "shown = shown or path.name",
        "shown = shown or str(path)",
    ),
    _agent(
        "files_human_mib_boundary",
        base.FILES_PY,
        "    if size >= 2**20:\n",
        "    if size > 2**20:\n",
    ),
    _agent(
        "files_human_kib_boundary",
        base.FILES_PY,
        "    if size >= 1024:\n",
        "    if size > 1024:\n",
    ),
    _agent(
        "files_new_file_mode",
        base.FILES_PY,
        "            if mode is not None:\n",
        "            if mode:\n",
    ),
    # instructions.py: AGENTS.md and CLAUDE.md in the system prompt.
    _agent(
        "instructions_line_count",
        base.AGENT_INSTRUCTIONS_PY,
        'lines = self.text.count("\\n") + 1',
        'lines = self.text.count("\\n")',
    ),
    _agent(
        "instructions_section_names_file",
        base.AGENT_INSTRUCTIONS_PY,
        (
            'return f"\\n\\n# Project instructions (from {self.name} in the '
            'workspace)\\n\\n{self.text}"'
        ),
        'return f"\\n\\n# Project instructions\\n\\n{self.text}"',
    ),
    _agent(
        "instructions_missing_first_ends",
        base.AGENT_INSTRUCTIONS_PY,
        "            if not path.exists():\n                continue",
        "            if not path.exists():\n                return None",
    ),
    # kv_state.py: conversations' kept model states.
    _agent(
        "kv_state_save_error_unsaid",
        base.KV_STATE_PY,
        'return f"could not save the model state of {name}: {exc}"',
        'return ""',
    ),
    _agent(
        "kv_state_restore_tokens_unsaid",
        base.KV_STATE_PY,
        'return f"restored the model state ({tokens} tokens need no prefill)"',
        'return "restored the model state"',
    ),
    _agent(
        "kv_state_restore_without_file",
        base.KV_STATE_PY,
        '        if not path.is_file():\n            return ""\n        try:',
        "        try:",
    ),
    # event_notes.py: one-line notes for agent events.
    _agent(
        "event_notes_compaction_reason",
        base.AGENT_EVENT_NOTES_PY,
        'return [(f"compacting the context ({event.reason}; {event.tokens} tokens)", False)]',
        'return [(f"compacting the context ({event.tokens} tokens)", False)]',
    ),
    _agent(
        "event_notes_not_compacted_note",
        base.AGENT_EVENT_NOTES_PY,
        'text = f"context not compacted: {event.note}"',
        'text = "context not compacted"',
    ),
)
