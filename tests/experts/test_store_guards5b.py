"""ExpertStats' derived numbers and summary, from plain counters."""

from __future__ import annotations

from ds4mlx.experts.store import ExpertStats


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
