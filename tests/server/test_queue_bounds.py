"""The generation queue's session bound: at least one session, and exactly as many as asked."""

from __future__ import annotations

from ds4mlx.server.queue import GenerationQueue

import pytest


@pytest.mark.parametrize("sessions", [0, -1])
def test_a_queue_without_a_session_is_refused(sessions):
    with pytest.raises(ValueError, match=f"max_sessions must be at least 1, got {sessions}"):
        GenerationQueue(max_sessions=sessions)


def test_one_session_is_enough():
    queue = GenerationQueue(max_sessions=1)
    try:
        assert queue.max_sessions == 1 and queue.run(lambda: 41 + 1) == 42
    finally:
        queue.close()
