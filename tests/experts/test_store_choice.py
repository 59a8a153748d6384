"""Which expert store a model gets from its options: resident unless streaming is asked."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.experts import ExpertOptions, ResidentStore, open_expert_store
from ds4mlx.gguf import open_gguf

import pytest

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"


@pytest.mark.parametrize("options", [None, ExpertOptions()])
def test_options_that_do_not_stream_keep_the_experts_resident(options):
    assert isinstance(open_expert_store(open_gguf(TINY), None, options), ResidentStore)


def test_streaming_options_stream():
    store = open_expert_store(open_gguf(TINY), None, ExpertOptions(stream=True, cache_gib=0.01))
    try:
        assert not isinstance(store, ResidentStore)
    finally:
        store.close()
