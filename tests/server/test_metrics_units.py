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
