"""Request counters for ``/metrics`` (Prometheus text format) and the time to first token.

The names are llama-server's (``llamacpp:*``), so dashboards and scripts written for it read
this server too; what llama-server does not have is under ``ds4mlx:*``.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from ds4mlx.generation import Finished
from ds4mlx.server.queue import QueueStats

# The recent times to first token the quantiles are taken over.
TTFT_WINDOW = 1000


@dataclass
class ServerMetrics:
    """Totals over the server's life; safe to update from the event loop's callbacks."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    predicted_tokens: int = 0
    generation_seconds: float = 0.0
    requests: int = 0
    refused: int = 0  # answered with a 4xx before generating
    ttft_sum: float = 0.0
    ttft_count: int = 0
    recent_ttft: deque[float] = field(default_factory=lambda: deque(maxlen=TTFT_WINDOW))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def first_token(self, seconds: float) -> None:
        """A request's first event came ``seconds`` after its body was read (queue wait and
        prefill included)."""
        with self._lock:
            self.ttft_sum += seconds
            self.ttft_count += 1
            self.recent_ttft.append(seconds)

    def finished(self, finished: Finished) -> None:
        with self._lock:
            self.requests += 1
            self.prompt_tokens += finished.prompt_tokens
            self.cached_tokens += finished.cached_tokens
            self.predicted_tokens += finished.completion_tokens
            self.generation_seconds += finished.seconds

    def refuse(self) -> None:
        with self._lock:
            self.refused += 1

    def ttft_quantile(self, q: float) -> float | None:
        with self._lock:
            recent = sorted(self.recent_ttft)
        if not recent:
            return None
        return recent[min(len(recent) - 1, int(q * len(recent)))]

    def prometheus(self, queue: QueueStats, slots: int) -> str:
        """The metrics page."""
        with self._lock:
            rows = [
                (
                    "llamacpp:prompt_tokens_total",
                    "counter",
                    "Prompt tokens processed.",
                    self.prompt_tokens,
                ),
                (
                    "llamacpp:tokens_predicted_total",
                    "counter",
                    "Generated tokens.",
                    self.predicted_tokens,
                ),
                (
                    "llamacpp:tokens_predicted_seconds_total",
                    "counter",
                    "Seconds spent serving requests (prefill and decode).",
                    self.generation_seconds,
                ),
                (
                    "llamacpp:predicted_tokens_seconds",
                    "gauge",
                    "Average generation throughput in tokens/s.",
                    self.predicted_tokens / self.generation_seconds
                    if self.generation_seconds
                    else 0.0,
                ),
                (
                    "llamacpp:requests_processing",
                    "gauge",
                    "Requests generating now.",
                    queue.running,
                ),
                (
                    "llamacpp:requests_deferred",
                    "gauge",
                    "Requests waiting in the queue.",
                    queue.queued,
                ),
                (
                    "ds4mlx:prompt_tokens_cached_total",
                    "counter",
                    "Prompt tokens reused from a session instead of prefilled.",
                    self.cached_tokens,
                ),
                ("ds4mlx:requests_total", "counter", "Requests that finished.", self.requests),
                (
                    "ds4mlx:requests_refused_total",
                    "counter",
                    "Generation requests refused with a client error before generating.",
                    self.refused,
                ),
                (
                    "ds4mlx:requests_cancelled_total",
                    "counter",
                    "Generations stopped because the client went away.",
                    queue.cancelled,
                ),
                (
                    "ds4mlx:requests_failed_total",
                    "counter",
                    "Generations that failed.",
                    queue.failed,
                ),
                ("ds4mlx:slots", "gauge", "Requests the server generates at once.", slots),
            ]
            ttft = (self.ttft_sum, self.ttft_count)
        lines = []
        for name, kind, help_text, value in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        name = "ds4mlx:time_to_first_token_seconds"
        lines += [
            f"# HELP {name} Seconds from a request's arrival to its first output "
            "(queue wait and prefill).",
            f"# TYPE {name} summary",
        ]
        for q in (0.5, 0.99):
            value = self.ttft_quantile(q)
            lines.append(f'{name}{{quantile="{q}"}} {"NaN" if value is None else value}')
        lines += [f"{name}_sum {ttft[0]}", f"{name}_count {ttft[1]}"]
        return "\n".join(lines) + "\n"
