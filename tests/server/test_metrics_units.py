"""The metrics page's numbers from known inputs: the time-to-first-token quantiles of unsorted
samples, and which queue count each gauge shows (fresh6's first-pass survivors
``metrics_ttft_quantile_of_unsorted_times`` and ``metrics_processing_gauge_shows_the_queue``);
the throughput's units and the cancelled total (fresh9's).
"""

from __future__ import annotations

from ds4mlx.generation import Finished
from ds4mlx.server.metrics import ServerMetrics
from ds4mlx.server.queue import QueueStats


def gauges(page: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line and not line.startswith("#")
    }


def test_ttft_quantiles_are_of_the_sorted_samples():
    metrics = ServerMetrics()
    assert metrics.ttft_quantile(0.5) is None
    for seconds in (0.5, 0.1, 0.9, 0.3):
        metrics.first_token(seconds)
    assert [metrics.ttft_quantile(q) for q in (0.0, 0.25, 0.5, 0.9, 1.0)] == [
        0.1,
        0.3,
        0.5,
        0.9,
        0.9,
    ]


def test_the_gauges_show_running_and_waiting_requests_apart():
    page = ServerMetrics().prometheus(QueueStats(queued=5, running=2), slots=4)
    values = gauges(page)
    assert values["llamacpp:requests_processing"] == 2
    assert values["llamacpp:requests_deferred"] == 5


def test_the_throughput_is_tokens_per_second():
    """(fresh9 ``metrics_throughput_inverted``) 20 tokens in 2 s are 10 tokens/s."""
    metrics = ServerMetrics()
    metrics.finished(
        Finished("stop", prompt_tokens=5, completion_tokens=20, cached_tokens=0, seconds=2.0)
    )
    values = gauges(metrics.prometheus(QueueStats(), slots=1))
    assert values["llamacpp:predicted_tokens_seconds"] == 10.0


def test_cancelled_and_failed_generations_are_counted_apart():
    """(fresh9 ``metrics_cancelled_total_shows_the_failures``) Each total shows its own count."""
    values = gauges(ServerMetrics().prometheus(QueueStats(cancelled=3, failed=1), slots=1))
    assert values["ds4mlx:requests_cancelled_total"] == 3
    assert values["ds4mlx:requests_failed_total"] == 1


def test_the_whole_page_from_known_totals():
    """Every row's name, type, help and value, the summary's quantiles, sum and count, and the
    final newline Prometheus wants, for totals that are all different from one another."""
    metrics = ServerMetrics()
    metrics.finished(
        Finished("stop", prompt_tokens=30, completion_tokens=8, cached_tokens=12, seconds=2.0)
    )
    metrics.refuse()
    metrics.refuse()
    for seconds in (0.25, 0.75):
        metrics.first_token(seconds)
    page = metrics.prometheus(QueueStats(queued=5, running=2, cancelled=3, failed=4), slots=6)
    assert page == "\n".join(
        [
            "# HELP llamacpp:prompt_tokens_total Prompt tokens processed.",
            "# TYPE llamacpp:prompt_tokens_total counter",
            "llamacpp:prompt_tokens_total 30",
            "# HELP llamacpp:tokens_predicted_total Generated tokens.",
            "# TYPE llamacpp:tokens_predicted_total counter",
            "llamacpp:tokens_predicted_total 8",
            "# HELP llamacpp:tokens_predicted_seconds_total"
            " Seconds spent serving requests (prefill and decode).",
            "# TYPE llamacpp:tokens_predicted_seconds_total counter",
            "llamacpp:tokens_predicted_seconds_total 2.0",
            "# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.",
            "# TYPE llamacpp:predicted_tokens_seconds gauge",
            "llamacpp:predicted_tokens_seconds 4.0",
            "# HELP llamacpp:requests_processing Requests generating now.",
            "# TYPE llamacpp:requests_processing gauge",
            "llamacpp:requests_processing 2",
            "# HELP llamacpp:requests_deferred Requests waiting in the queue.",
            "# TYPE llamacpp:requests_deferred gauge",
            "llamacpp:requests_deferred 5",
            "# HELP ds4mlx:prompt_tokens_cached_total"
            " Prompt tokens reused from a session instead of prefilled.",
            "# TYPE ds4mlx:prompt_tokens_cached_total counter",
            "ds4mlx:prompt_tokens_cached_total 12",
            "# HELP ds4mlx:requests_total Requests that finished.",
            "# TYPE ds4mlx:requests_total counter",
            "ds4mlx:requests_total 1",
            "# HELP ds4mlx:requests_refused_total"
            " Generation requests refused with a client error before generating.",
            "# TYPE ds4mlx:requests_refused_total counter",
            "ds4mlx:requests_refused_total 2",
            "# HELP ds4mlx:requests_cancelled_total"
            " Generations stopped because the client went away.",
            "# TYPE ds4mlx:requests_cancelled_total counter",
            "ds4mlx:requests_cancelled_total 3",
            "# HELP ds4mlx:requests_failed_total Generations that failed.",
            "# TYPE ds4mlx:requests_failed_total counter",
            "ds4mlx:requests_failed_total 4",
            "# HELP ds4mlx:slots Requests the server generates at once.",
            "# TYPE ds4mlx:slots gauge",
            "ds4mlx:slots 6",
            "# HELP ds4mlx:time_to_first_token_seconds Seconds from a request's arrival to its"
            " first output (queue wait and prefill).",
            "# TYPE ds4mlx:time_to_first_token_seconds summary",
            'ds4mlx:time_to_first_token_seconds{quantile="0.5"} 0.75',
            'ds4mlx:time_to_first_token_seconds{quantile="0.99"} 0.75',
            "ds4mlx:time_to_first_token_seconds_sum 1.0",
            "ds4mlx:time_to_first_token_seconds_count 2",
            "",
        ]
    )


def test_an_idle_server_reports_no_throughput_and_no_quantiles():
    values = gauges(ServerMetrics().prometheus(QueueStats(), slots=1))
    assert values["llamacpp:predicted_tokens_seconds"] == 0.0
    assert str(values['ds4mlx:time_to_first_token_seconds{quantile="0.5"}']) == "nan"
    assert values["ds4mlx:time_to_first_token_seconds_count"] == 0


def test_the_quantiles_are_over_the_latest_window_only():
    """The oldest time leaves once 1000 newer ones came; the sum and count keep all."""
    metrics = ServerMetrics()
    metrics.first_token(100.0)
    for _ in range(999):
        metrics.first_token(1.0)
    assert metrics.ttft_quantile(1.0) == 100.0
    metrics.first_token(1.0)
    assert metrics.ttft_quantile(1.0) == 1.0
    assert (metrics.ttft_count, metrics.ttft_sum) == (1001, 1100.0)
