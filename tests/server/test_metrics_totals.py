"""The server's totals, field by field: each finished request adds its own counts to the right
total, and a refusal is counted apart from the requests."""

from __future__ import annotations

from ds4mlx.generation import Finished
from ds4mlx.server.metrics import ServerMetrics

import pytest


def test_each_total_adds_its_own_field():
    metrics = ServerMetrics()
    metrics.finished(
        Finished("stop", prompt_tokens=30, completion_tokens=7, cached_tokens=12, seconds=0.5)
    )
    metrics.finished(
        Finished("length", prompt_tokens=10, completion_tokens=4, cached_tokens=0, seconds=0.25)
    )
    metrics.refuse()
    assert (metrics.requests, metrics.refused) == (2, 1)
    assert (metrics.prompt_tokens, metrics.cached_tokens, metrics.predicted_tokens) == (40, 12, 11)
    assert metrics.generation_seconds == pytest.approx(0.75)
