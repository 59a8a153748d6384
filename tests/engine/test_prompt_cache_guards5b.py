"""Prompt-cache edges: a one-token shared prefix, the disk budget met exactly, memory before disk
on a tie between different entries."""

from __future__ import annotations

from ds4mlx.engine.kvcache import DiskTier, PromptCache
from ds4mlx.engine.kvcache.prompt_cache import common_prefix
from ds4mlx.engine.kvcache.snapshot_file import snapshot_nbytes
from ds4mlx.engine.session import Snapshot

import mlx.core as mx

FINGERPRINT = "e" * 64


def state(tokens: tuple[int, ...]) -> Snapshot:
    return Snapshot([mx.full((256,), float(sum(tokens)), mx.float32)], tokens)


def estimate(snapshot: Snapshot) -> int:
    """DiskTier.save's own size estimate (arrays, a header the size of the token list)."""
    return snapshot_nbytes(snapshot) + 16 * len(snapshot.tokens) + 65536


def test_one_equal_token_is_a_shared_prefix_of_one():
    assert common_prefix([5], [5]) == 1
    assert common_prefix([5], [6]) == 0
    assert common_prefix([], [5]) == 0


def test_a_file_that_fits_the_disk_budget_exactly_is_kept(tmp_path):
    first = DiskTier(tmp_path, 1 << 30, FINGERPRINT)
    assert first.save(state((1, 2, 3)))
    kept = first.usage()
    second = state((4, 5, 6))
    disk = DiskTier(tmp_path, estimate(second) + kept, FINGERPRINT)
    assert disk.save(second)
    assert sorted(disk.keys()) == [(1, 2, 3), (4, 5, 6)]


def test_one_byte_less_of_disk_budget_evicts_the_older_file(tmp_path):
    first = DiskTier(tmp_path, 1 << 30, FINGERPRINT)
    first.save(state((1, 2, 3)))
    second = state((4, 5, 6))
    disk = DiskTier(tmp_path, estimate(second) + first.usage() - 1, FINGERPRINT)
    assert disk.save(second)
    assert disk.keys() == [(4, 5, 6)]


def test_memory_comes_before_disk_for_different_entries_that_tie(tmp_path):
    disk = DiskTier(tmp_path, 1 << 30, FINGERPRINT)
    disk.save(state((1, 2, 3, 5)))
    cache = PromptCache(1 << 20, disk)
    cache.remember(state((1, 2, 3, 4)))
    found = cache.candidates([1, 2, 3, 9, 9], longer_than=0)
    assert [(c.tokens, c.share, c.on_disk) for c in found] == [
        ((1, 2, 3, 4), 3, False),
        ((1, 2, 3, 5), 3, True),
    ]


def test_a_snapshot_as_large_as_the_whole_disk_budget_is_saved(tmp_path):
    snapshot = state((1, 2, 3))
    warnings: list[str] = []
    disk = DiskTier(tmp_path, estimate(snapshot), FINGERPRINT, warnings.append)
    assert disk.save(snapshot) and disk.keys() == [(1, 2, 3)] and warnings == []
    assert not DiskTier(
        tmp_path / "small", estimate(snapshot) - 1, FINGERPRINT, warnings.append
    ).save(snapshot)
    assert "exceeds the disk budget" in warnings[0]
