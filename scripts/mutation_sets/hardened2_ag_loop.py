"""The agent loop's, backends' and jobs' tests hardened against blind mutations (issue 37,
session 18): plausible one-line bugs in the files of ``ds4mlx/agent`` that fresh8's survivors
showed least tested (the loop, the backends, jobs) and then the rest of that half of the agent
(compaction, conversations, slash commands, tools, model states), found by going through each
function and asking which one-character change no test would notice: a comparison at its
boundary, a member of a literal, a default, one field of a message, an early return, ``+=`` for
``=``. Each was applied by hand and run against the test file that now guards it: it fails with
the change and passes without. None repeats an earlier set's mutation (same file and old text).

Left out: the local backend's ``stream.close()`` in ``chat`` (equivalent: ``yield from``
already closes the service's stream when the turn's iterator is closed, and a stream that
raised is finished); the marker variable's name (equivalent: only its consistency matters);
a foreground command's timeout checked one poll late (only timing tells it); a command given
the agent's stdin instead of /dev/null (untested: the test runner's own stdin is often
/dev/null too).

Test selection as in the fresh sets: the whole ``tests/agent`` folder (``base.in_agent_folder``).

The 4 entries found identical to fresh9's (written the same afternoon by the
blind writer, who never saw these) were taken out of this set: fresh9 keeps them.
"""

from __future__ import annotations

from mutation_sets.base import (
    AGENT_BACKEND_PY,
    AGENT_LOOP_PY,
    JOBS_PY,
    Mutation,
)
from mutation_sets.base import in_agent_folder as _agent

MUTATIONS: tuple[Mutation, ...] = (
    # the loop: turns, tool calls, compaction and summaries.
    _agent(
        "loop_autocompaction_reason_lost",
        AGENT_LOOP_PY,
        'yield from self.compact("the context is 85% full")',
        "yield from self.compact()",
    ),
    _agent(
        "loop_cancelled_autocompaction_goes_on",
        AGENT_LOOP_PY,
        (
            '                    yield RunFinished("cancelled", answer)\n'
            "                    return\n"
            "                tokens = self.context_tokens()"
        ),
        (
            '                    yield RunFinished("cancelled", answer)\n'
            "                tokens = self.context_tokens()"
        ),
    ),
    _agent(
        "loop_context_after_compaction_not_recounted",
        AGENT_LOOP_PY,
        ("                    return\n                tokens = self.context_tokens()\n"),
        "                    return\n",
    ),
    _agent(
        "loop_unfinished_stream_counts_as_finished",
        AGENT_LOOP_PY,
        "if self.cancel.is_set() or turn.finished is None:",
        "if self.cancel.is_set():",
    ),
    _agent(
        "loop_unfinished_stream_reported_cancelled",
        AGENT_LOOP_PY,
        ('else RunFinished("error", answer, "the model\'s stream ended unfinished")'),
        'else RunFinished("cancelled", answer)',
    ),
    _agent(
        "loop_turn_steps_counted_from_zero",
        AGENT_LOOP_PY,
        "yield TurnStarted(step)",
        "yield TurnStarted(step - 1)",
    ),
    _agent(
        "loop_thinking_not_asked_of_the_model",
        AGENT_LOOP_PY,
        (
            "            max_tokens=min(self.settings.max_tokens, room),\n"
            "            thinking=self.settings.thinking,"
        ),
        (
            "            max_tokens=min(self.settings.max_tokens, room),\n"
            "            thinking=False,"
        ),
    ),
    _agent(
        "loop_reasoning_pieces_replace",
        AGENT_LOOP_PY,
        "turn.reasoning += event.text",
        "turn.reasoning = event.text",
    ),
    _agent(
        "loop_reasoning_not_recorded",
        AGENT_LOOP_PY,
        'message["reasoning_content"] = turn.reasoning',
        "pass",
    ),
    _agent(
        "loop_prefill_progress_not_shown",
        AGENT_LOOP_PY,
        (
            "                elif isinstance(event, PrefillProgress):\n"
            "                    yield event"
        ),
        ("                elif isinstance(event, PrefillProgress):\n                    pass"),
    ),
    _agent(
        "loop_held_back_text_dropped_at_the_end",
        AGENT_LOOP_PY,
        "yield from self._answer_text(turn, markup.finish())",
        "markup.finish()",
    ),
    _agent(
        "loop_stop_mid_stream_ignored",
        AGENT_LOOP_PY,
        (
            "                if self.cancel.is_set():\n"
            "                    return\n"
            "                if isinstance(event, TextDelta):"
        ),
        "                if isinstance(event, TextDelta):",
    ),
    _agent(
        "loop_call_ids_repeat_within_a_turn",
        AGENT_LOOP_PY,
        'return f"call_{len(self.messages)}_{next(self._call_ids)}"',
        'return f"call_{len(self.messages)}"',
    ),
    _agent(
        "loop_malformed_call_recorded_as_a_call",
        AGENT_LOOP_PY,
        (
            "            for call_id, action in turn.actions\n"
            "            if isinstance(action, ToolCall)"
        ),
        (
            "            for call_id, action in turn.actions\n"
            "            if not isinstance(action, ToolCallError) or True"
        ),
    ),
    _agent(
        "loop_denial_reason_not_passed",
        AGENT_LOOP_PY,
        ('why = f"; the user\'s reason: {request.reason}" if request.reason else ""'),
        'why = ""',
    ),
    _agent(
        "loop_bash_checkpointed_as_an_edit",
        AGENT_LOOP_PY,
        'bash=call.name == "bash"',
        "bash=False",
    ),
    _agent(
        "loop_tool_errors_not_flagged",
        AGENT_LOOP_PY,
        ("self._add_tool_result(call_id, result.output, result.is_error)"),
        "self._add_tool_result(call_id, result.output, False)",
    ),
    _agent(
        "loop_failed_summary_compacts_anyway",
        AGENT_LOOP_PY,
        (
            '                yield CompactionFinished(before, before, f"t'
            'he summary failed: {exc}")\n'
            "                return"
        ),
        ('                yield CompactionFinished(before, before, f"the summary failed: {exc}")'),
    ),
    _agent(
        "loop_cancelled_compaction_compacts_anyway",
        AGENT_LOOP_PY,
        ('            yield CompactionFinished(before, before, "cancelled")\n            return'),
        ('            yield CompactionFinished(before, before, "cancelled")'),
    ),
    _agent(
        "loop_compaction_keeps_the_old_state",
        AGENT_LOOP_PY,
        "            self.states.invalidate(self)",
        "            pass",
    ),
    _agent(
        "loop_summary_request_fitting_exactly_cut",
        AGENT_LOOP_PY,
        ("if size + max_tokens < self.backend.context_size or len(text) < 200:"),
        ("if size + max_tokens <= self.backend.context_size or len(text) < 200:"),
    ),
    _agent(
        "loop_short_transcript_cut_forever",
        AGENT_LOOP_PY,
        "or len(text) < 200:",
        "or len(text) < 20:",
    ),
    _agent(
        "loop_summary_stop_ignored",
        AGENT_LOOP_PY,
        ("                if self.cancel.is_set():\n                    break"),
        ("                if self.cancel.is_set():\n                    pass"),
    ),
    _agent(
        "loop_summary_pieces_replace",
        AGENT_LOOP_PY,
        "summary += event.text",
        "summary = event.text",
    ),
    _agent(
        "loop_malformed_report_cut_at_399",
        AGENT_LOOP_PY,
        ('raw = error.raw if len(error.raw) <= 400 else error.raw[:400] + "..."'),
        ('raw = error.raw if len(error.raw) < 400 else error.raw[:400] + "..."'),
    ),
    _agent(
        "loop_malformed_report_uncut",
        AGENT_LOOP_PY,
        'else error.raw[:400] + "..."',
        "else error.raw",
    ),
    _agent(
        "loop_compaction_finished_equal_counts_as_compacted",
        AGENT_LOOP_PY,
        "return self.tokens_after < self.tokens_before",
        "return self.tokens_after <= self.tokens_before",
    ),
    _agent(
        "loop_context_counted_without_thinking",
        AGENT_LOOP_PY,
        (
            "            self.messages, self.toolbox.schemas, thinking=se"
            "lf.settings.thinking\n"
            "        )"
        ),
        ("            self.messages, self.toolbox.schemas, thinking=False\n        )"),
    ),
    _agent(
        "loop_instructions_left_out_of_a_new_conversation",
        AGENT_LOOP_PY,
        "system += self.instructions.system_section()",
        "pass",
    ),
    _agent(
        "loop_running_flag_left_set",
        AGENT_LOOP_PY,
        ("            self.running = False\n            self._checkpoint"),
        "            self._checkpoint",
    ),
    _agent(
        "loop_checkpoint_problem_not_kept",
        AGENT_LOOP_PY,
        "self.checkpoints.problem = str(exc)",
        "pass",
    ),
    _agent(
        "loop_cancel_before_run_tool_ignored",
        AGENT_LOOP_PY,
        (
            "                if self.cancel.is_set():\n"
            '                    self._add_tool_result(call_id, "error: n'
            'ot run; the user stopped the agent")\n'
            "                elif"
        ),
        (
            "                if False:\n"
            '                    self._add_tool_result(call_id, "error: n'
            'ot run; the user stopped the agent")\n'
            "                elif"
        ),
    ),
    _agent(
        "loop_model_turn_in_thinking_for_summary",
        AGENT_LOOP_PY,
        ("events = self.backend.chat(request, (), max_tokens=max_tokens, thinking=False)"),
        ("events = self.backend.chat(request, (), max_tokens=max_tokens * 2, thinking=False)"),
    ),
    # the backends: saved states, the local turn and count, OpenAI errors, model cards.
    _agent(
        "backend_state_prompt_without_the_next_user_message",
        AGENT_BACKEND_PY,
        ('[*messages, {"role": "user", "content": ""}], tools, thinking=thinking'),
        "list(messages), tools, thinking=thinking",
    ),
    _agent(
        "backend_state_share_counts_the_next_turns_opener",
        AGENT_BACKEND_PY,
        "self._next_prompt(messages, tools, thinking)[:-1])",
        "self._next_prompt(messages, tools, thinking))",
    ),
    _agent(
        "backend_restored_state_not_adopted",
        AGENT_BACKEND_PY,
        ("        self.service.adopt(snapshot)\n        return share"),
        "        return share",
    ),
    _agent(
        "backend_save_reports_the_written_bytes",
        AGENT_BACKEND_PY,
        (
            "        write_snapshot(path, snapshot, self.fingerprint)\n"
            "        return snapshot.n_tokens"
        ),
        ("        return write_snapshot(path, snapshot, self.fingerprint)"),
    ),
    _agent(
        "backend_states_kept_without_a_prompt_cache",
        AGENT_BACKEND_PY,
        "return self.service.prompt_cache is not None",
        "return True",
    ),
    _agent(
        "backend_local_name_keeps_the_suffix",
        AGENT_BACKEND_PY,
        "self.name = name or service.model.path.stem",
        "self.name = name or service.model.path.name",
    ),
    _agent(
        "backend_prefill_progress_not_asked",
        AGENT_BACKEND_PY,
        "report_prefill=True,",
        "report_prefill=False,",
    ),
    _agent(
        "backend_local_sampling_dropped",
        AGENT_BACKEND_PY,
        ("            max_tokens=max_tokens,\n            sampling=self.sampling,"),
        ("            max_tokens=max_tokens,\n            sampling=None,"),
    ),
    _agent(
        "backend_local_thinking_dropped",
        AGENT_BACKEND_PY,
        ("            thinking=thinking,\n            report_prefill=True,"),
        ("            thinking=False,\n            report_prefill=True,"),
    ),
    _agent(
        "backend_local_count_without_thinking",
        AGENT_BACKEND_PY,
        "render(messages, tools, thinking=thinking)",
        "render(messages, tools, thinking=False)",
    ),
    _agent(
        "backend_resident_hit_rate_shown",
        AGENT_BACKEND_PY,
        'stats.kind == "resident"',
        'stats.kind == "streamed"',
    ),
    _agent(
        "backend_broken_stream_not_a_backend_error",
        AGENT_BACKEND_PY,
        (
            "            yield from self._events(stream, started)\n"
            "        except self._openai.OpenAIError as exc:"
        ),
        ("            yield from self._events(stream, started)\n        except ValueError as exc:"),
    ),
    _agent(
        "backend_unreadable_model_card_raises",
        AGENT_BACKEND_PY,
        ("        except self._openai.OpenAIError:\n            return None"),
        ("        except ValueError:\n            return None"),
    ),
    _agent(
        "backend_model_card_read_with_retries",
        AGENT_BACKEND_PY,
        "with_options(timeout=5.0, max_retries=0)",
        "with_options(timeout=5.0, max_retries=2)",
    ),
    _agent(
        "backend_calibrated_on_a_zero_prompt",
        AGENT_BACKEND_PY,
        "if prompt > 0 and self._request_chars:",
        "if prompt >= 0 and self._request_chars:",
    ),
    _agent(
        "backend_call_ids_kept_open_past_their_turn",
        AGENT_BACKEND_PY,
        'open_call_ids = {call["id"] for call in calls}',
        'open_call_ids |= {call["id"] for call in calls}',
    ),
    _agent(
        "backend_openai_top_p_dropped",
        AGENT_BACKEND_PY,
        '"top_p": self.sampling.top_p,',
        '"top_p": 1.0,',
    ),
    _agent(
        "backend_reasoning_text_as_answer",
        AGENT_BACKEND_PY,
        ("                if reasoning:\n                    yield ReasoningDelta(reasoning)"),
        ("                if reasoning:\n                    yield TextDelta(reasoning)"),
    ),
    _agent(
        "backend_raw_call_without_parentheses",
        AGENT_BACKEND_PY,
        "raw = f\"{call['name']}({call['arguments']})\"",
        "raw = f\"{call['name']} {call['arguments']}\"",
    ),
    # jobs: finding marked processes, signalling, starting and stopping commands.
    _agent(
        "jobs_marker_matched_inside_another_variable",
        JOBS_PY,
        'if needle in environ.read().split(b"\\0"):',
        "if needle in environ.read():",
    ),
    _agent(
        "jobs_proc_entries_not_filtered",
        JOBS_PY,
        (
            "        if not entry.isdigit():\n"
            "            continue\n"
            "        try:\n"
            "            with open("
        ),
        ("        try:\n            with open("),
    ),
    _agent(
        "jobs_unreadable_environment_ends_the_search",
        JOBS_PY,
        ("        except OSError:  # gone, or not ours to read\n            continue"),
        ("        except OSError:  # gone, or not ours to read\n            break"),
    ),
    _agent(
        "jobs_missing_ps_ends_the_search",
        JOBS_PY,
        ("        except (OSError, subprocess.TimeoutExpired):\n            continue"),
        ("        except (OSError, subprocess.TimeoutExpired):\n            return []"),
    ),
    _agent(
        "jobs_failed_ps_listing_read",
        JOBS_PY,
        "if listing.returncode == 0:",
        "if listing.stdout:",
    ),
    _agent(
        "jobs_ps_marker_matched_inside_a_word",
        JOBS_PY,
        "if pid.isdigit() and needle in rest.split():",
        "if pid.isdigit() and needle in rest:",
    ),
    _agent(
        "jobs_ps_procps_spelling_dropped",
        JOBS_PY,
        '    ["ps", "-A", "-ww", "-o", "pid=,command=", "e"],\n',
        "",
    ),
    _agent(
        "jobs_gone_process_group_raises",
        JOBS_PY,
        ("        os.killpg(process.pid, sig)\n    except (ProcessLookupError, PermissionError):"),
        ("        os.killpg(process.pid, sig)\n    except ProcessLookupError:"),
    ),
    _agent(
        "jobs_one_gone_process_spares_the_rest",
        JOBS_PY,
        (
            "            os.kill(pid, sig)\n"
            "        except (ProcessLookupError, PermissionError):\n"
            "            continue"
        ),
        (
            "            os.kill(pid, sig)\n"
            "        except (ProcessLookupError, PermissionError):\n"
            "            return"
        ),
    ),
    _agent(
        "jobs_failed_start_leaks_the_pipe",
        JOBS_PY,
        (
            "        except BaseException:\n"
            "            os.close(read_end)\n"
            "            raise\n"
            "        finally:"
        ),
        ("        except BaseException:\n            raise\n        finally:"),
    ),
    _agent(
        "jobs_unstarted_reader_leaves_the_command_running",
        JOBS_PY,
        ("            os.close(read_end)\n            self.kill()\n            raise"),
        ("            os.close(read_end)\n            raise"),
    ),
    _agent(
        "jobs_interrupted_run_leaves_the_command_running",
        JOBS_PY,
        ("            handle.kill()\n            handle.finish_reading(0)\n            raise"),
        ("            handle.finish_reading(0)\n            raise"),
    ),
    _agent(
        "jobs_interrupted_run_keeps_showing_its_output",
        JOBS_PY,
        ("        finally:\n            self.current = None"),
        ("        finally:\n            pass"),
    ),
    _agent(
        "jobs_stderr_not_captured",
        JOBS_PY,
        "stderr=subprocess.STDOUT,",
        "stderr=subprocess.DEVNULL,",
    ),
    _agent(
        "jobs_job_state_names_no_command",
        JOBS_PY,
        ('return f"job {self.number} running for {elapsed:.0f}s: {self.command}"'),
        'return f"job {self.number} running for {elapsed:.0f}s"',
    ),
    _agent(
        "jobs_timeout_also_reported_cancelled",
        JOBS_PY,
        "cancelled=cancelled and not timed_out,",
        "cancelled=cancelled,",
    ),
    _agent(
        "jobs_finished_job_with_leftovers_not_stopped_at_close",
        JOBS_PY,
        "if job.running or job.handle.reader.is_alive():",
        "if job.running:",
    ),
    _agent(
        "jobs_foreground_head_smaller",
        JOBS_PY,
        "FOREGROUND_HEAD_BYTES = 32 * 1024",
        "FOREGROUND_HEAD_BYTES = 16 * 1024",
    ),
    _agent(
        "jobs_job_tail_smaller",
        JOBS_PY,
        "JOB_TAIL_BYTES = 256 * 1024",
        "JOB_TAIL_BYTES = 64 * 1024",
    ),
)
