"""The expert options behind --ssd-stream, --expert-cache and --expert-hotlist: budget
spellings, defaults and the refusals, and the "auto" budget a streamed store derives."""

from __future__ import annotations

import os
from types import SimpleNamespace

from ds4mlx.experts import ExpertOptions, parse_cache_budget
from ds4mlx.experts import streamed as streamed_module
from ds4mlx.experts.options import AUTO_SHARE
from ds4mlx.experts.streamed import StreamedStore

import pytest


@pytest.mark.parametrize(
    ("text", "gib"),
    [
        ("12", 12.0),
        ("12g", 12.0),
        ("12G", 12.0),
        ("12gib", 12.0),
        (" 12GiB ", 12.0),
        ("0.5g", 0.5),
        ("1e-3", 0.001),
    ],
)
def test_a_budget_is_gib_with_or_without_its_unit(text, gib):
    assert parse_cache_budget(text) == gib


@pytest.mark.parametrize("text", ["auto", "AUTO", " Auto "])
def test_auto_is_no_fixed_budget(text):
    assert parse_cache_budget(text) is None


def test_the_defaults_keep_experts_resident_and_prefetch_when_streaming():
    options = ExpertOptions()
    assert (options.stream, options.cache_gib, options.hotlist, options.save_hotlist) == (
        False,
        None,
        None,
        False,
    )
    assert options.prefetch is True
    assert options.read_threads == min(4, os.cpu_count() or 1)


def test_one_read_thread_is_enough_and_none_is_refused():
    assert ExpertOptions(stream=True, read_threads=1).read_threads == 1
    with pytest.raises(ValueError, match="read_threads must be at least 1, got 0"):
        ExpertOptions(stream=True, read_threads=0)


def test_a_cache_size_without_streaming_is_refused():
    with pytest.raises(ValueError, match="--ssd-stream only"):
        ExpertOptions(cache_gib=1.0)
    assert ExpertOptions(stream=True, cache_gib=1.0).cache_gib == 1.0


def auto_budget(monkeypatch, routed: int, available: int | None, cache_gib=None) -> int:
    monkeypatch.setattr(streamed_module, "available_memory_bytes", lambda: available)
    store = SimpleNamespace(options=SimpleNamespace(cache_gib=cache_gib), routed_bytes=routed)
    return StreamedStore._budget_bytes(store)


def test_auto_budget_is_a_share_of_the_routed_experts_capped_by_free_memory(monkeypatch):
    assert AUTO_SHARE == 0.8
    assert auto_budget(monkeypatch, 1000, None) == 800
    assert auto_budget(monkeypatch, 1000, 2000) == 800  # memory to spare: the routed share
    assert auto_budget(monkeypatch, 1000, 500) == 400  # a share of what is free, not all of it


def test_a_fixed_budget_is_gib_whatever_the_memory(monkeypatch):
    assert auto_budget(monkeypatch, 1000, 10, cache_gib=0.5) == 2**29
