"""The local backend reports the streamed expert cache's hit rate (shown in the status bar)."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.agent.backend import LocalBackend
from ds4mlx.experts.options import ExpertOptions
from ds4mlx.generation import ChatService

import pytest

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
MESSAGES = [{"role": "user", "content": "List the files."}]


@pytest.mark.skipif(not TINY.is_file(), reason="assets/ds4-tiny.gguf is not built")
@pytest.mark.parametrize("stream", [False, True])
def test_local_backend_expert_hit_rate(stream):
    experts = ExpertOptions(stream=True, cache_gib=0.002) if stream else None
    model = ds4mlx.load_model(TINY, experts=experts)
    try:
        backend = LocalBackend(ChatService(model))
        for _ in backend.chat(MESSAGES, [], max_tokens=4, thinking=False):
            pass
        rate = backend.expert_hit_rate()
        if stream:
            stats = model.expert_stats()
            assert stats.hits + stats.misses > 0
            assert rate == stats.hit_rate and 0.0 <= rate < 1.0  # a small cache misses
        else:
            assert rate is None
    finally:
        model.close()
