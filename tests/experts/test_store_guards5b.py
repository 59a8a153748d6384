"""ExpertStats' derived numbers and summary, from plain counters; a prefetch hint's call."""

from __future__ import annotations

from types import SimpleNamespace

from ds4mlx.experts.store import ExpertStats, PrefetchHint


def test_no_lookups_is_a_full_hit_rate_and_no_reads_no_speed():
    stats = ExpertStats("streamed")
    assert stats.hit_rate == 1.0 and stats.read_gbps == 0.0


def test_hit_rate_and_read_speed_follow_the_counters():
    stats = ExpertStats("streamed", hits=3, misses=1, bytes_read=2_000_000_000, read_seconds=0.5)
    assert stats.hit_rate == 0.75 and stats.read_gbps == 4.0
    assert stats.as_dict()["hit_rate"] == 0.75 and stats.as_dict()["misses"] == 1


def test_the_streamed_summary_names_each_counter_in_its_place():
    stats = ExpertStats(
        "streamed",
        hits=3,
        misses=1,
        evictions=7,
        reads=9,
        prefetched=5,
        prefetch_used=2,
        warm_loaded=4,
    )
    text = stats.summary()
    assert "hits 3, misses 1 (75.0% hit), evictions 7" in text
    assert "in 9 reads" in text and "prefetch 2/5 used" in text and "warm 4" in text


def test_a_resident_summary_says_resident():
    assert ExpertStats("resident", resident_bytes=2**20).summary().startswith("experts: resident")


def test_the_streamed_summary_reads_in_full():
    stats = ExpertStats(
        "streamed",
        hits=1,
        misses=3,
        evictions=2,
        bytes_read=3 * 2**20,
        reads=6,
        read_seconds=0.001,
        resident_bytes=2**20,
        capacity_bytes=4 * 2**20,
        budget_bytes=5 * 2**20,
        routed_bytes=3 * 2**30,
        prefetched=8,
        prefetch_used=7,
        warm_loaded=0,
    )
    assert stats.summary() == (
        "experts: streamed, cache 1.0 MiB of 4.0 MiB (budget 5.0 MiB of 3.00 GiB routed) | "
        "hits 1, misses 3 (25.0% hit), evictions 2 | read 3.0 MiB in 6 reads, 3.15 GB/s | "
        "prefetch 7/8 used | warm 0"
    )
    assert ExpertStats("resident", resident_bytes=3 * 2**30).summary() == (
        "experts: resident, 3.00 GiB"
    )


def test_a_prefetch_hint_routes_the_input_and_its_tokens_to_the_next_layer():
    hinted = []
    layer = SimpleNamespace(prefetch=hinted.append)
    hint = PrefetchHint(lambda x, tokens: ("routed", x, tokens), layer)
    hint("x", "tokens")
    assert hinted == [("routed", "x", "tokens")]
