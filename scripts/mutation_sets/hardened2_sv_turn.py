"""Mutations checked by hand while hardening tests/server's engine queue, turn blocks, app and
request helpers (issue 37, session 18): one-line bugs in ``server/queue.py`` (arrival order,
admission, batched rows and counters, cancellation of queued, running and parked jobs, failures
before and after output, closing, keep-alives, the counters), ``server/turn.py`` (the block each
event goes to, its text and change, ids, arguments, usage, the block stream's frames),
``server/app.py`` (503 for a generation that ends without finishing, a streamed refusal's 4xx,
errors in the stream, the engine's refusals, keep-alives and the time to first output, the
detail line) and ``server/generation.py`` (tool choice, thinking and effort, the token limit,
content, output formats, sampling overrides, the ChatService call, the prompt's text). None
changes a line an earlier set changes.

Each was applied alone and fails a test of test_engine_queue, test_assistant_turn_blocks,
test_app_outcomes or test_generation_options. Left out: mutations that hang rather than fail
(a call or job accepted after close, the closing turn not ending its running jobs, a failed
batch pass not returning, ``_END`` not delivered), and equivalent ones (the lone-job test on
``waiting``, a failed pass's jobs marked as not started for a RuntimeError).

The 2 entries found identical to fresh9's (written the same afternoon by the
blind writer, who never saw these) were taken out of this set: fresh9 keeps them.
"""

from __future__ import annotations

from mutation_sets.base import (
    APP_PY,
    GENERATION_PY,
    QUEUE_PY,
    TURN_PY,
    Mutation,
    in_server_folder,
)

_QUEUE = (
    in_server_folder(
        "queue_keepalive_falls_through_to_an_empty_queue",
        QUEUE_PY,
        "                    yield KEEP_ALIVE\n                    continue\n",
        "                    yield KEEP_ALIVE\n",
    ),
    in_server_folder(
        "queue_ready_cleared_while_items_remain",
        QUEUE_PY,
        "            if not self._items:\n                self._ready.clear()",
        "            if self._items:\n                self._ready.clear()",
    ),
    in_server_folder(
        "queue_failure_ends_the_events_quietly",
        QUEUE_PY,
        "            if isinstance(item, APIError):\n                raise item",
        "            if isinstance(item, APIError):\n                return",
    ),
    in_server_folder(
        "queue_job_of_a_gone_loop_not_cancelled",
        QUEUE_PY,
        "        except RuntimeError:  # the event loop is gone: nobody will read this job\n"
        "            self.cancel()",
        "        except RuntimeError:  # the event loop is gone: nobody will read this job\n"
        "            pass",
    ),
    in_server_folder(
        "queue_submit_after_close_accepted",
        QUEUE_PY,
        "            if self._closing:\n"
        '                raise APIError(503, "the server is shutting down")\n',
        "",
    ),
    in_server_folder(
        "queue_refused_jobs_not_told",
        QUEUE_PY,
        '                job.deliver(APIError(503, "the server is shutting down"))\n',
        "",
    ),
    in_server_folder(
        "queue_refused_jobs_counted_as_failed",
        QUEUE_PY,
        '                job.deliver(APIError(503, "the server is shutting down"))\n'
        '                self._end(job, "cancelled")',
        '                job.deliver(APIError(503, "the server is shutting down"))\n'
        '                self._end(job, "failed")',
    ),
    in_server_folder(
        "queue_start_failure_counted_as_completed",
        QUEUE_PY,
        '            self._fail(job, exc, started=False)\n            self._end(job, "failed")',
        '            self._fail(job, exc, started=False)\n            self._end(job, "completed")',
    ),
    in_server_folder(
        "queue_running_gauge_not_raised_at_start",
        QUEUE_PY,
        "            self._running.append(run)\n"
        "            self._stats.running = len(self._running)\n",
        "            self._running.append(run)\n",
    ),
    in_server_folder(
        "queue_running_gauge_not_lowered_at_the_end",
        QUEUE_PY,
        "            self._running.remove(run)\n"
        "            self._stats.running = len(self._running)\n",
        "            self._running.remove(run)\n",
    ),
    in_server_folder(
        "queue_queued_not_counted_at_submit",
        QUEUE_PY,
        "            self._stats.queued += 1\n",
        "",
    ),
    in_server_folder(
        "queue_lone_job_decoded_as_a_batch",
        QUEUE_PY,
        "        if len(self._running) == 1:",
        "        if len(self._running) == 0:",
    ),
    in_server_folder(
        "queue_every_job_given_the_first_row",
        QUEUE_PY,
        "            self._resume(run, logits[row])",
        "            self._resume(run, logits[0])",
    ),
    in_server_folder(
        "queue_failed_batch_counted_as_completed",
        QUEUE_PY,
        "                self._fail(run.job, exc, started=True)\n"
        '                self._finish(run, "failed")',
        "                self._fail(run.job, exc, started=True)\n"
        '                self._finish(run, "completed")',
    ),
    in_server_folder(
        "queue_failed_batch_blamed_on_the_requests",
        QUEUE_PY,
        "                self._fail(run.job, exc, started=True)\n",
        "                self._fail(run.job, exc, started=False)\n",
    ),
    in_server_folder(
        "queue_parked_cancelled_job_stays_in_the_batch",
        QUEUE_PY,
        "        for run in [r for r in self._running if r.job.cancelled]:\n"
        '            self._finish(run, "cancelled")\n',
        "",
    ),
    in_server_folder(
        "queue_step_without_waiting_jobs_still_runs",
        QUEUE_PY,
        "        if not waiting:\n            return\n",
        "",
    ),
    in_server_folder(
        "queue_cancelled_between_events_keeps_delivering",
        QUEUE_PY,
        "                if job.cancelled:\n"
        '                    self._finish(run, "cancelled")\n'
        "                    return\n",
        "",
    ),
    in_server_folder(
        "queue_completed_counted_as_cancelled",
        QUEUE_PY,
        '        except StopIteration:\n            self._finish(run, "completed")',
        '        except StopIteration:\n            self._finish(run, "cancelled")',
    ),
    in_server_folder(
        "queue_failure_after_output_counted_as_completed",
        QUEUE_PY,
        '            self._fail(job, exc, run.started)\n            self._finish(run, "failed")',
        '            self._fail(job, exc, run.started)\n            self._finish(run, "completed")',
    ),
    in_server_folder(
        "queue_requests_fault_answered_500",
        QUEUE_PY,
        "            job.deliver(APIError(400, str(exc)))",
        "            job.deliver(APIError(500, str(exc)))",
    ),
    in_server_folder(
        "queue_server_fault_message_without_the_cause",
        QUEUE_PY,
        'job.deliver(APIError(500, f"generation failed: {exc}"))',
        'job.deliver(APIError(500, "generation failed"))',
    ),
    in_server_folder(
        "queue_cancelled_generation_not_asked_what_it_generated",
        QUEUE_PY,
        '            if outcome == "cancelled":\n                self._stop(run)',
        '            if outcome == "failed":\n                self._stop(run)',
    ),
)

_TURN = (
    in_server_folder(
        "turn_streamed_arguments_replaced_not_added",
        TURN_PY,
        "            streamed.text += event.text",
        "            streamed.text = event.text",
    ),
    in_server_folder(
        "turn_completed_call_arguments_as_streamed_text",
        TURN_PY,
        "return self.text if self.call is None else json_arguments(self.call.arguments)",
        "return self.text or json_arguments(self.call.arguments)",
    ),
    in_server_folder(
        "turn_call_start_reported_as_a_whole_call",
        TURN_PY,
        'return self._new_call(event.name), "", "call_opens"',
        'return self._new_call(event.name), "", "call"',
    ),
    in_server_folder(
        "turn_streamed_arguments_add_no_text",
        TURN_PY,
        '            return streamed, event.text, "delta"',
        '            return streamed, "", "delta"',
    ),
    in_server_folder(
        "turn_wrong_markup_shown_as_its_reason",
        TURN_PY,
        'else ("text", event.raw if isinstance(event, ToolCallError) else event.text)',
        'else ("text", event.reason if isinstance(event, ToolCallError) else event.text)',
    ),
    in_server_folder(
        "turn_another_kind_continues_the_block",
        TURN_PY,
        "        opens = not self.blocks or self.blocks[-1].kind != kind",
        "        opens = not self.blocks",
    ),
    in_server_folder(
        "turn_opened_block_reported_as_a_delta",
        TURN_PY,
        '        return block, text, "opens" if opens else "delta"',
        '        return block, text, "delta"',
    ),
    in_server_folder(
        "turn_call_ids_ignore_their_prefix",
        TURN_PY,
        "call_id=new_id(self.call_id_prefix)",
        'call_id=new_id("call_")',
    ),
    in_server_folder(
        "turn_ids_of_16_hex_digits",
        TURN_PY,
        "    return prefix + secrets.token_hex(12)",
        "    return prefix + secrets.token_hex(8)",
    ),
    in_server_folder(
        "turn_joined_text_of_every_block",
        TURN_PY,
        'return "".join(block.text for block in self.blocks if block.kind == kind)',
        'return "".join(block.text for block in self.blocks if block.kind != "tool_call")',
    ),
    in_server_folder(
        "turn_cut_off_call_is_a_complete_block",
        TURN_PY,
        'return [block for block in self.blocks if block.kind != "tool_call" or block.call]',
        "return list(self.blocks)",
    ),
    in_server_folder(
        "turn_usage_reasoning_tokens_are_the_completion",
        TURN_PY,
        '"completion_tokens_details": {"reasoning_tokens": finished.reasoning_tokens},',
        '"completion_tokens_details": {"reasoning_tokens": finished.completion_tokens},',
    ),
    in_server_folder(
        "turn_meta_prompt_defaults_to_one",
        TURN_PY,
        "    prompt_tokens: int = 0",
        "    prompt_tokens: int = 1",
    ),
    in_server_folder(
        "block_stream_completed_call_reopened",
        TURN_PY,
        '        if change == "call_ends":\n            return frames\n',
        "",
    ),
    in_server_folder(
        "block_stream_whole_call_without_its_frames",
        TURN_PY,
        "            return [*frames, *self._tool_call(index, block)]",
        "            return frames",
    ),
    in_server_folder(
        "block_stream_started_call_takes_an_empty_delta",
        TURN_PY,
        '        if change == "call_opens":\n'
        "            return [*frames, *self._open(index, block)]\n",
        "",
    ),
    in_server_folder(
        "block_stream_closes_nothing_twice",
        TURN_PY,
        "        if self.open_index is None:\n            return []\n",
        "",
    ),
)

_APP = (
    in_server_folder(
        "app_engine_refused_options_answered_500",
        APP_PY,
        "                raise APIError(400, str(exc)) from None",
        "                raise APIError(500, str(exc)) from None",
    ),
    in_server_folder(
        "app_streamed_generation_without_events_answered_500",
        APP_PY,
        "        except StopAsyncIteration:\n"
        '            return _error_response(APIError(503, "the generation was cancelled"), '
        "endpoint)",
        "        except StopAsyncIteration:\n"
        '            return _error_response(APIError(500, "the generation was cancelled"), '
        "endpoint)",
    ),
    in_server_folder(
        "app_error_in_the_stream_dropped",
        APP_PY,
        '        yield b"".join(encoder.error(error))',
        "        return",
    ),
    in_server_folder(
        "app_keepalive_counted_as_first_output",
        APP_PY,
        "            if first_output is None and not isinstance(item, KeepAlive):",
        "            if first_output is None:",
    ),
    in_server_folder(
        "app_detail_line_logged_at_debug",
        APP_PY,
        '                    log.info("%s: %s", path, line)',
        '                    log.debug("%s: %s", path, line)',
    ),
    in_server_folder(
        "app_keepalives_collected_into_a_whole_response",
        APP_PY,
        "                if isinstance(item, KeepAlive):\n                    continue\n",
        "",
    ),
    in_server_folder(
        "app_streamed_refusal_answered_in_the_stream",
        APP_PY,
        "            first = await anext(events)\n        except APIError as error:",
        "            first = await anext(events)\n        except LookupError as error:",
    ),
)

_GENERATION = (
    in_server_folder(
        "generation_named_tool_not_offered_lists_nothing",
        GENERATION_PY,
        """offered = ", ".join(f"'{name}'" for name in offered_names) or "none\"""",
        'offered = "none"',
    ),
    in_server_folder(
        "generation_named_tool_as_auto",
        GENERATION_PY,
        "        return NamedTool(named)",
        '        return "auto"',
    ),
    in_server_folder(
        "generation_bool_thinking_switch_ignored",
        GENERATION_PY,
        "    if isinstance(control, bool):\n        return control",
        "    if isinstance(control, bool):\n        return default",
    ),
    in_server_folder(
        "generation_effort_none_rendered",
        GENERATION_PY,
        'return None if effort in (None, "none") else effort',
        "return effort",
    ),
    in_server_folder(
        "generation_zero_token_limit_is_the_default",
        GENERATION_PY,
        "return requested if requested is not None else defaults.max_tokens",
        "return requested or defaults.max_tokens",
    ),
    in_server_folder(
        "generation_text_parts_joined_without_newlines",
        GENERATION_PY,
        '    return "\\n".join(texts)',
        '    return "".join(texts)',
    ),
    in_server_folder(
        "generation_json_object_unconstrained",
        GENERATION_PY,
        '    if kind == "json_object":\n        return JsonFormat()',
        '    if kind == "json_object":\n        return None',
    ),
    in_server_folder(
        "generation_schema_format_without_schema_accepted",
        GENERATION_PY,
        "    if schema_format is None or schema_format.schema_ is None:",
        "    if schema_format is None:",
    ),
    in_server_folder(
        "generation_min_p_not_overridden",
        GENERATION_PY,
        '                "min_p",\n',
        "",
    ),
    in_server_folder(
        "generation_chat_arguments_not_streamed",
        GENERATION_PY,
        "                stream_arguments=True,",
        "                stream_arguments=False,",
    ),
    in_server_folder(
        "generation_parallel_calls_not_passed",
        GENERATION_PY,
        "                parallel_tool_calls=self.parallel_tool_calls,",
        "                parallel_tool_calls=True,",
    ),
    in_server_folder(
        "generation_completion_output_format_dropped",
        GENERATION_PY,
        "            stop=self.stop,\n            output_format=self.output_format,\n        )",
        "            stop=self.stop,\n            output_format=None,\n        )",
    ),
    in_server_folder(
        "generation_default_tool_choice_passed",
        GENERATION_PY,
        '        if self.tool_choice != "auto":',
        "        if self.tool_choice:",
    ),
    in_server_folder(
        "generation_prompt_text_stops_at_a_list_content",
        GENERATION_PY,
        "            if not isinstance(content, str):\n                continue",
        "            if not isinstance(content, str):\n                break",
    ),
    in_server_folder(
        "generation_assistant_text_counted_unstripped",
        GENERATION_PY,
        "                total += len(content.strip())",
        "                total += len(content)",
    ),
)

MUTATIONS: tuple[Mutation, ...] = (*_QUEUE, *_TURN, *_APP, *_GENERATION)
