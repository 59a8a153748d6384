"""Mutations checked by hand while hardening tests/server line by line a third time (issue 37,
session 19), on lines no earlier set changes.

Each was applied alone and fails a test of tests/server.
"""

from __future__ import annotations

from mutation_sets.base import (
    METRICS_PY,
    Mutation,
    in_server_folder,
)

MUTATIONS: tuple[Mutation, ...] = (
    in_server_folder(
        "metrics_ttft_window_shorter",
        METRICS_PY,
        "TTFT_WINDOW = 1000",
        "TTFT_WINDOW = 100",
    ),
    in_server_folder(
        "metrics_ttft_sum_replaced",
        METRICS_PY,
        "self.ttft_sum += seconds",
        "self.ttft_sum = seconds",
    ),
    in_server_folder(
        "metrics_ttft_not_in_window",
        METRICS_PY,
        "            self.recent_ttft.append(seconds)\n",
        "",
    ),
    in_server_folder(
        "metrics_predicted_total_replaced",
        METRICS_PY,
        "self.predicted_tokens += finished.completion_tokens",
        "self.predicted_tokens = finished.completion_tokens",
    ),
    in_server_folder(
        "metrics_seconds_total_replaced",
        METRICS_PY,
        "self.generation_seconds += finished.seconds",
        "self.generation_seconds = finished.seconds",
    ),
    in_server_folder(
        "metrics_refusals_not_counted",
        METRICS_PY,
        "self.refused += 1",
        "self.refused += 0",
    ),
    in_server_folder(
        "metrics_idle_throughput_one",
        METRICS_PY,
        "                    else 0.0,\n",
        "                    else 1.0,\n",
    ),
    in_server_folder(
        "metrics_seconds_total_shows_the_tokens",
        METRICS_PY,
        '                    "Seconds spent serving requests (prefill and decode).",\n'
        "                    self.generation_seconds,\n",
        '                    "Seconds spent serving requests (prefill and decode).",\n'
        "                    self.predicted_tokens,\n",
    ),
    in_server_folder(
        "metrics_predicted_total_shows_the_prompt",
        METRICS_PY,
        '                    "Generated tokens.",\n                    self.predicted_tokens,\n',
        '                    "Generated tokens.",\n                    self.prompt_tokens,\n',
    ),
    in_server_folder(
        "metrics_deferred_gauge_shows_the_running",
        METRICS_PY,
        "                    queue.queued,\n",
        "                    queue.running,\n",
    ),
    in_server_folder(
        "metrics_cached_total_shows_the_prompt",
        METRICS_PY,
        '                    "Prompt tokens reused from a session instead of prefilled.",\n'
        "                    self.cached_tokens,\n",
        '                    "Prompt tokens reused from a session instead of prefilled.",\n'
        "                    self.prompt_tokens,\n",
    ),
    in_server_folder(
        "metrics_requests_total_shows_the_refused",
        METRICS_PY,
        '"Requests that finished.", self.requests)',
        '"Requests that finished.", self.refused)',
    ),
    in_server_folder(
        "metrics_refused_total_shows_the_requests",
        METRICS_PY,
        "                    self.refused,\n",
        "                    self.requests,\n",
    ),
    in_server_folder(
        "metrics_failed_total_shows_the_cancelled",
        METRICS_PY,
        "                    queue.failed,\n",
        "                    queue.cancelled,\n",
    ),
    in_server_folder(
        "metrics_slots_gauge_a_counter",
        METRICS_PY,
        '("ds4mlx:slots", "gauge",',
        '("ds4mlx:slots", "counter",',
    ),
    in_server_folder(
        "metrics_processing_a_counter",
        METRICS_PY,
        '                    "llamacpp:requests_processing",\n                    "gauge",\n',
        '                    "llamacpp:requests_processing",\n                    "counter",\n',
    ),
    in_server_folder(
        "metrics_prompt_total_misnamed",
        METRICS_PY,
        '"llamacpp:prompt_tokens_total",',
        '"llamacpp:prompt_tokens",',
    ),
    in_server_folder(
        "metrics_upper_quantile_090",
        METRICS_PY,
        "for q in (0.5, 0.99):",
        "for q in (0.5, 0.9):",
    ),
    in_server_folder(
        "metrics_no_quantile_is_zero",
        METRICS_PY,
        '{"NaN" if value is None else value}',
        "{0 if value is None else value}",
    ),
    in_server_folder(
        "metrics_page_without_final_newline",
        METRICS_PY,
        'return "\\n".join(lines) + "\\n"',
        'return "\\n".join(lines)',
    ),
    in_server_folder(
        "metrics_type_line_missing",
        METRICS_PY,
        'f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"',
        'f"# HELP {name} {help_text}", f"{name} {value}"',
    ),
)
