"""The agent UI's tests hardened against blind mutations (issue 37, session 18): plausible
one-line bugs in the agent files earlier sets reached least (the Textual app, its widgets,
checkpoints, and the permission and workspace edges left), written while reading each function
and asking which one-character change no test would notice: the status bar's every part and
format, how a run's end is said, the thinking panel, live output's byte and line bounds, the
permission prompt's keys, buttons, size line and preview room, the quit question, undo's
messages and bounds. Each was applied by hand and run against the test file that now guards it
(``tests/agent/test_agent_widgets.py``, ``test_agent_app_views.py``,
``test_agent_undo_edges.py``, ``test_agent_permission_rules.py``,
``test_agent_workspace_paths.py``; for the app, also ``test_agent_app.py``,
``test_agent_app_safety.py`` and ``test_agent_sessions.py``, which already caught 13 of the app's
mutations): it fails with the change and passes without. None repeats an earlier set's mutation
(same file and old line).

Left out as equivalent: the quit button compared as ``!= "stay"`` (the dialog has two buttons);
SIGTERM without ``agent.stop()`` (``on_unmount`` stops it as the app exits); git's return code
tested as ``> 1`` (every git failure the checkpoints can meet exits 128); the answer ended at
``MalformedToolCall`` or at ``TurnFinished`` left out one at a time (each covers the other).

Test selection as in the fresh sets: the whole ``tests/agent`` folder (``base.in_agent_folder``).

The entry found identical to one of fresh9's (written the same afternoon by the
blind writer, who never saw this set) was taken out of it: fresh9 keeps it.
"""

from __future__ import annotations

from mutation_sets.base import (
    AGENT_APP_PY,
    AGENT_WIDGETS_PY,
    CHECKPOINTS_PY,
    PERMISSIONS_PY,
    WORKSPACE_PY,
    Mutation,
)
from mutation_sets.base import in_agent_folder as _agent

MUTATIONS: tuple[Mutation, ...] = (
    _agent(
        "widgets_write_panel_stays_closed",
        AGENT_WIDGETS_PY,
        '_EXPANDED_TOOLS = {"edit", "write"}',
        '_EXPANDED_TOOLS = {"edit"}',
    ),
    _agent(
        "widgets_failure_marked_as_success",
        AGENT_WIDGETS_PY,
        '"✗" if result.is_error else "✓"',
        '"✓" if result.is_error else "✗"',
    ),
    _agent(
        "widgets_success_marked_failed",
        AGENT_WIDGETS_PY,
        "        if result.is_error:\n            self.add_class",
        "        if not result.is_error:\n            self.add_class",
    ),
    _agent(
        "widgets_diff_opens_only_file_tools",
        AGENT_WIDGETS_PY,
        "if result.diff or self.call.name in _EXPANDED_TOOLS",
        "if result.diff and self.call.name in _EXPANDED_TOOLS",
    ),
    _agent(
        "widgets_live_output_stays_folded",
        AGENT_WIDGETS_PY,
        "        self.collapsed = False\n\n    def finish",
        "        self.collapsed = True\n\n    def finish",
    ),
    _agent(
        "widgets_live_output_not_dimmed",
        AGENT_WIDGETS_PY,
        'Text(sanitize(output), style="dim")',
        "Text(sanitize(output))",
    ),
    _agent(
        "widgets_prefix_for_every_tool_but_edit",
        AGENT_WIDGETS_PY,
        'if call.name == "bash" else None',
        'if call.name != "edit" else None',
    ),
    _agent(
        "widgets_command_lines_one_short",
        AGENT_WIDGETS_PY,
        'lines = command.count("\\n") + 1',
        'lines = command.count("\\n")',
    ),
    _agent(
        "widgets_line_numbers_from_three_lines",
        AGENT_WIDGETS_PY,
        "line_numbers=lines > 1",
        "line_numbers=lines > 2",
    ),
    _agent(
        "widgets_two_lines_called_line",
        AGENT_WIDGETS_PY,
        "f\"the complete command: {lines} line{'s' * (lines != 1)}, \"",
        "f\"the complete command: {lines} line{'s' * (lines > 2)}, \"",
    ),
    _agent(
        "widgets_characters_counted_stripped",
        AGENT_WIDGETS_PY,
        'f"{len(command)} characters"',
        'f"{len(command.strip())} characters"',
    ),
    _agent(
        "widgets_write_diff_not_previewed",
        AGENT_WIDGETS_PY,
        '("write", "edit") and self.diff',
        '("edit",) and self.diff',
    ),
    _agent(
        "widgets_diff_lines_one_short",
        AGENT_WIDGETS_PY,
        'lines = diff.count("\\n") + 1',
        'lines = diff.count("\\n")',
    ),
    _agent(
        "widgets_one_diff_line_called_lines",
        AGENT_WIDGETS_PY,
        "a diff of {lines} line{'s' * (lines != 1)}",
        "a diff of {lines} lines",
    ),
    _agent(
        "widgets_dialog_width_without_border",
        AGENT_WIDGETS_PY,
        "max(20, int(self.app.size.width * 0.9) - 6)",
        "max(20, int(self.app.size.width * 0.9))",
    ),
    _agent(
        "widgets_long_title_takes_no_line",
        AGENT_WIDGETS_PY,
        "_DIALOG_CHROME_LINES + len(title) // width",
        "_DIALOG_CHROME_LINES",
    ),
    _agent(
        "widgets_preview_shrinks_to_one_line",
        AGENT_WIDGETS_PY,
        "max(3, int(self.app.size.height * 0.9) - chrome)",
        "max(1, int(self.app.size.height * 0.9) - chrome)",
    ),
    _agent(
        "widgets_dialog_chrome_one_line_short",
        AGENT_WIDGETS_PY,
        "_DIALOG_CHROME_LINES = 15",
        "_DIALOG_CHROME_LINES = 14",
    ),
    _agent(
        "widgets_arming_leaves_buttons_disabled",
        AGENT_WIDGETS_PY,
        "            button.disabled = False",
        "            button.disabled = True",
    ),
    _agent(
        "widgets_prefix_key_hinted_without_prefix",
        AGENT_WIDGETS_PY,
        '(" · p prefix" if self.prefix else "")',
        '" · p prefix"',
    ),
    _agent(
        "widgets_escape_in_reason_ignored",
        AGENT_WIDGETS_PY,
        '            if event.key == "escape":\n                event.stop()',
        '            if event.key == "enter":\n                event.stop()',
    ),
    _agent(
        "widgets_a_key_not_always",
        AGENT_WIDGETS_PY,
        '"a": "always", "n"',
        '"A": "always", "n"',
    ),
    _agent(
        "widgets_n_denies_without_reason_line",
        AGENT_WIDGETS_PY,
        '        if event.key == "n":\n',
        '        if event.key == "N":\n',
    ),
    _agent(
        "widgets_reason_keeps_spaces",
        AGENT_WIDGETS_PY,
        "self.reason = event.value.strip()",
        "self.reason = event.value",
    ),
    _agent(
        "widgets_button_answers_unarmed",
        AGENT_WIDGETS_PY,
        "        if self.armed:\n            self.dismiss(Decision(event.button.id",
        "        if True:\n            self.dismiss(Decision(event.button.id",
    ),
    _agent(
        "widgets_one_job_called_jobs",
        AGENT_WIDGETS_PY,
        "background job{'s' * (count != 1)}",
        "background jobs",
    ),
    _agent(
        "widgets_escape_does_not_stay",
        AGENT_WIDGETS_PY,
        '"n": False, "escape": False}',
        '"n": False}',
    ),
    _agent(
        "widgets_stay_button_quits",
        AGENT_WIDGETS_PY,
        'self.dismiss(event.button.id == "quit")',
        "self.dismiss(True)",
    ),
    _agent(
        "widgets_arguments_on_one_line",
        AGENT_WIDGETS_PY,
        'text.append(f"{sanitize(str(value))}\\n")',
        'text.append(f"{sanitize(str(value))} ")',
    ),
    _agent(
        "widgets_title_markup_obeyed",
        AGENT_WIDGETS_PY,
        'return f"{mark} {escape(sanitize(describe_call(call)))}"',
        'return f"{mark} {sanitize(describe_call(call))}"',
    ),
    _agent(
        "app_live_bytes_one_short",
        AGENT_APP_PY,
        "_LIVE_BYTES = 2048",
        "_LIVE_BYTES = 2047",
    ),
    _agent(
        "app_live_lines_one_short",
        AGENT_APP_PY,
        "_LIVE_LINES = 12",
        "_LIVE_LINES = 11",
    ),
    _agent(
        "app_mention_completed_without_agent",
        AGENT_APP_PY,
        "if self.agent is None:\n            return None\n        return complete",
        "if self.agent is not None:\n            return None\n        return complete",
    ),
    _agent(
        "app_sigterm_exit_code_is_the_signal",
        AGENT_APP_PY,
        "self.exit(return_code=128 + sig)",
        "self.exit(return_code=sig)",
    ),
    _agent(
        "app_sigterm_does_not_save",
        AGENT_APP_PY,
        "not None:\n            self.commands.autosave()\n        # Leaving can hang",
        "None:\n            self.commands.autosave()\n        # Leaving can hang",
    ),
    _agent(
        "app_blank_prompt_queued",
        AGENT_APP_PY,
        "        if not text:\n            return\n",
        "",
    ),
    _agent(
        "app_quit_with_words_skips_the_job_question",
        AGENT_APP_PY,
        'if text.split()[0] == "/quit":',
        'if text == "/quit":',
    ),
    _agent(
        "app_idle_ctrl_c_keeps_the_prompt",
        AGENT_APP_PY,
        'self.query_one("#prompt", PromptInput).value = ""',
        "pass",
    ),
    _agent(
        "app_prefill_rate_rounded",
        AGENT_APP_PY,
        "{event.tokens_per_second:.1f} t/s",
        "{event.tokens_per_second:.0f} t/s",
    ),
    _agent(
        "app_prefill_shows_total_as_done",
        AGENT_APP_PY,
        'f"prefill {event.done}/{event.total} tokens',
        'f"prefill {event.total}/{event.total} tokens',
    ),
    _agent(
        "app_thinking_keeps_the_last_piece",
        AGENT_APP_PY,
        "self._reasoning_text += text",
        "self._reasoning_text = text",
    ),
    _agent(
        "app_thinking_panel_per_piece",
        AGENT_APP_PY,
        "        if self._reasoning is None:\n            self._reasoning = Static",
        "        if True:\n            self._reasoning = Static",
    ),
    _agent(
        "app_thinking_shown_open",
        AGENT_APP_PY,
        'title="thinking", collapsed=True',
        'title="thinking", collapsed=False',
    ),
    _agent(
        "app_thinking_panel_shared_by_turns",
        AGENT_APP_PY,
        '        self._reasoning = None\n        self._reasoning_text = ""\n',
        '        self._reasoning_text = ""\n',
    ),
    _agent(
        "app_thinking_not_sanitized",
        AGENT_APP_PY,
        "self._reasoning.update(Text(sanitize(self._reasoning_text)))",
        "self._reasoning.update(Text(self._reasoning_text))",
    ),
    _agent(
        "app_compaction_phase_not_shown",
        AGENT_APP_PY,
        'self._set_phase("compacting…")',
        "pass",
    ),
    _agent(
        "app_compaction_keeps_the_size_before",
        AGENT_APP_PY,
        "self.stats.context_tokens = event.tokens_after",
        "self.stats.context_tokens = event.tokens_before",
    ),
    _agent(
        "app_stop_shown_as_error",
        AGENT_APP_PY,
        '        if event.reason == "cancelled":\n            self._note("stopped")',
        '        if event.reason == "cancelled":\n            self._note("stopped", "error")',
    ),
    _agent(
        "app_full_context_shown_as_note",
        AGENT_APP_PY,
        '            self._note(f"{event.error}: /compact or /new frees room", "error")',
        '            self._note(f"{event.error}: /compact or /new frees room")',
    ),
    _agent(
        "app_step_limit_not_said",
        AGENT_APP_PY,
        'elif event.reason != "answer":',
        'elif event.reason not in ("answer", "step_limit"):',
    ),
    _agent(
        "app_run_end_reason_with_underscore",
        AGENT_APP_PY,
        "{event.reason.replace('_', ' ')}",
        "{event.reason}",
    ),
    _agent(
        "app_live_output_of_nothing_shown",
        AGENT_APP_PY,
        "if output is not None and output.total:",
        "if output is not None:",
    ),
    _agent(
        "app_live_output_read_from_the_start",
        AGENT_APP_PY,
        "output.text_since(max(0, output.total - _LIVE_BYTES))",
        "output.text_since(0)",
    ),
    _agent(
        "app_live_output_first_lines",
        AGENT_APP_PY,
        "text.splitlines()[-_LIVE_LINES:]",
        "text.splitlines()[:_LIVE_LINES]",
    ),
    _agent(
        "app_turn_context_not_recorded",
        AGENT_APP_PY,
        "self.stats.context_tokens = event.context_tokens",
        "pass",
    ),
    _agent(
        "app_generated_not_recorded",
        AGENT_APP_PY,
        "self.stats.generated = event.finished.completion_tokens",
        "pass",
    ),
    _agent(
        "app_tau_never_recorded",
        AGENT_APP_PY,
        "self.stats.tau = None if acceptance is None else acceptance.tau",
        "self.stats.tau = None",
    ),
    _agent(
        "app_context_share_with_decimals",
        AGENT_APP_PY,
        "({used / size:.0%})",
        "({used / size:.1%})",
    ),
    _agent(
        "app_unmeasured_rate_shown",
        AGENT_APP_PY,
        '(f" {rate:.1f} t/s" if rate else "")',
        'f" {rate:.1f} t/s"',
    ),
    _agent(
        "app_tau_one_decimal",
        AGENT_APP_PY,
        "τ {self.stats.tau:.2f}",
        "τ {self.stats.tau:.1f}",
    ),
    _agent(
        "app_tau_of_zero_hidden",
        AGENT_APP_PY,
        "if self.stats.tau is not None:",
        "if self.stats.tau:",
    ),
    _agent(
        "app_thinking_on_shown_off",
        AGENT_APP_PY,
        "'on' if self.agent.settings.thinking else 'off'",
        "'off' if self.agent.settings.thinking else 'on'",
    ),
    _agent(
        "app_one_queued_not_shown",
        AGENT_APP_PY,
        "        if self.pending:\n            parts.append",
        "        if len(self.pending) > 1:\n            parts.append",
    ),
    _agent(
        "app_status_separator",
        AGENT_APP_PY,
        'Text(" │ ".join(parts))',
        'Text(" | ".join(parts))',
    ),
    _agent(
        "app_worker_failure_shown_as_note",
        AGENT_APP_PY,
        'self._from_worker(self._note, f"error: {exc}", "error")',
        'self._from_worker(self._note, f"error: {exc}")',
    ),
    _agent(
        "app_resumed_note_without_state_parenthesised",
        AGENT_APP_PY,
        '(f" ({restored})" if restored else "")',
        '(f" ({restored})")',
    ),
    _agent(
        "app_new_conversation_redrawn_not_resumed",
        AGENT_APP_PY,
        "        if not agent.conversation.is_empty:\n            self._redraw_conversation()",
        "        if agent.conversation.is_empty:\n            self._redraw_conversation()",
    ),
    _agent(
        "app_instructions_note_inverted",
        AGENT_APP_PY,
        "        if agent.instructions is not None:\n            self._note(",
        "        if agent.instructions is None:\n            self._note(",
    ),
    _agent(
        "app_queued_input_not_said",
        AGENT_APP_PY,
        'self._note(f"queued: {text}")',
        "pass",
    ),
    _agent(
        "checkpoints_whole_repository_prefix_empty",
        CHECKPOINTS_PY,
        'self.prefix = prefix or "."',
        "self.prefix = prefix",
    ),
    _agent(
        "checkpoints_git_error_unnamed",
        CHECKPOINTS_PY,
        'raise CheckpointError(f"git {arguments[0]}: {done.stderr.strip()}")',
        'raise CheckpointError(f"git: {done.stderr.strip()}")',
    ),
    _agent(
        "checkpoints_unreadable_file_small",
        CHECKPOINTS_PY,
        "    except OSError:\n        return False",
        "    except OSError:\n        return True",
    ),
    _agent(
        "checkpoints_subfolder_workspace_snapshots_the_repository",
        CHECKPOINTS_PY,
        'root.relative_to(top).as_posix() if root != top else ""',
        '""',
    ),
    _agent(
        "checkpoints_diff_before_any_change_snapshots",
        CHECKPOINTS_PY,
        '            if not self._session_start:\n                return ""',
        "            if not self._session_start:\n                pass",
    ),
    _agent(
        "checkpoints_failed_snapshot_unexplained",
        CHECKPOINTS_PY,
        'f" (a snapshot failed: {self.problem})" if self.problem else ""',
        'f" ({self.problem})" if self.problem else ""',
    ),
    _agent(
        "checkpoints_manifest_one_over_its_bound",
        CHECKPOINTS_PY,
        "if count >= MAX_MANIFEST_ENTRIES:",
        "if count > MAX_MANIFEST_ENTRIES:",
    ),
    _agent(
        "checkpoints_manifest_ignores_size",
        CHECKPOINTS_PY,
        "manifest[path] = (info.st_size, info.st_mtime_ns)",
        "manifest[path] = (0, info.st_mtime_ns)",
    ),
    _agent(
        "checkpoints_kept_folder_named_removed",
        CHECKPOINTS_PY,
        "            except OSError:\n                continue\n            removed.append",
        "            except OSError:\n                pass\n            removed.append",
    ),
    _agent(
        "checkpoints_empty_undo_says_nothing",
        CHECKPOINTS_PY,
        '"; ".join(parts) or "the last change left no file to put back"',
        '"; ".join(parts)',
    ),
    _agent(
        "checkpoints_undo_parts_joined_by_commas",
        CHECKPOINTS_PY,
        'done = "; ".join(parts)',
        'done = ", ".join(parts)',
    ),
    _agent(
        "app_prompt_not_kept_in_history",
        AGENT_APP_PY,
        "event.input.prompts.add(text)",
        "pass",
    ),
    _agent(
        "app_ctrl_q_does_not_save",
        AGENT_APP_PY,
        '            self.commands.handle("/quit")',
        "            pass",
    ),
    _agent(
        "app_redraw_shows_empty_answers",
        AGENT_APP_PY,
        "                if content:\n                    self._mount(Markdown",
        "                if True:\n                    self._mount(Markdown",
    ),
    _agent(
        "app_context_unknown_until_a_turn",
        AGENT_APP_PY,
        "self.stats.context_tokens = agent.context_tokens()",
        "pass",
    ),
    _agent(
        "app_turn_not_saved",
        AGENT_APP_PY,
        "(TurnFinished, RunFinished, CompactionFinished)",
        "(RunFinished, CompactionFinished)",
    ),
    _agent(
        "app_busy_and_loading_both_needed_to_queue",
        AGENT_APP_PY,
        "if self.busy or self.agent is None:",
        "if self.busy and self.agent is None:",
    ),
    _agent(
        "app_idle_ctrl_c_stops_the_agent",
        AGENT_APP_PY,
        "if self.busy and self.agent is not None:",
        "if self.agent is not None:",
    ),
    _agent(
        "app_load_failure_phase_not_shown",
        AGENT_APP_PY,
        'self.call_from_thread(self._set_phase, "no model")',
        "pass",
    ),
    _agent(
        "permissions_unsplittable_command_raises",
        PERMISSIONS_PY,
        "    except ValueError:\n        return None\n    return words or None",
        "    except IndexError:\n        return None\n    return words or None",
    ),
    _agent(
        "permissions_prefix_keeps_three_plain_words",
        PERMISSIONS_PY,
        "        if plain == _PREFIX_WORDS:\n            break",
        "        if plain == _PREFIX_WORDS + 1:\n            break",
    ),
    _agent(
        "workspace_gitignore_above_the_root_applies",
        WORKSPACE_PY,
        "if folder.is_relative_to(self.root):\n                rules +=",
        "if True:\n                rules +=",
    ),
    _agent(
        "workspace_walk_of_a_missing_folder_raises",
        WORKSPACE_PY,
        "        except OSError:\n            return\n        for entry",
        "        except FileNotFoundError:\n            raise\n        for entry",
    ),
    _agent(
        "workspace_walk_unsorted",
        WORKSPACE_PY,
        "sorted(os.scandir(folder), key=lambda entry: entry.name)",
        "list(os.scandir(folder))",
    ),
    _agent(
        "app_switched_conversation_not_redrawn",
        AGENT_APP_PY,
        "        if outcome.conversation_changed:\n            self._redraw_conversation()",
        "        if False:\n            self._redraw_conversation()",
    ),
    _agent(
        "app_footer_ignores_hints",
        AGENT_APP_PY,
        "self.query_one(Footer).display = self.commands.hints",
        "pass",
    ),
    _agent(
        "app_answer_not_sanitized",
        AGENT_APP_PY,
        "await self._answer_stream.write(sanitize(event.text))",
        "await self._answer_stream.write(event.text)",
    ),
    _agent(
        "app_run_done_phase_not_ready",
        AGENT_APP_PY,
        '        self._refresh_context()\n        self._set_phase("ready")',
        '        self._refresh_context()\n        self._set_phase("done")',
    ),
    _agent(
        "app_redraw_keeps_the_old_log",
        AGENT_APP_PY,
        "log.remove_children()",
        "pass",
    ),
    _agent(
        "app_redrawn_failure_shown_as_success",
        AGENT_APP_PY,
        'ToolResult(content, is_error=bool(message.get("is_error")))',
        "ToolResult(content)",
    ),
    _agent(
        "app_context_not_refreshed_after_a_command",
        AGENT_APP_PY,
        "self.stats.context_tokens = self.agent.context_tokens()",
        "pass",
    ),
    _agent(
        "app_model_name_not_taken_from_the_backend",
        AGENT_APP_PY,
        "self.model_name = agent.backend.name",
        "pass",
    ),
    _agent(
        "workspace_walk_calls_every_entry_a_file",
        WORKSPACE_PY,
        "            yield path, is_folder\n",
        "            yield path, False\n",
    ),
)
