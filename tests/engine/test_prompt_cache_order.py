"""The prompt cache's bookkeeping, on small stand-in states: least-recently-*used* eviction in
memory and on disk, file names that tell model fingerprints apart, the budget at its exact
bound, and which cached prefixes a prompt may use.

Each test here was checked against a one-character mutation of the code it guards (see
``scripts/mutation_run.py``, the ``kvcache_*`` mutations).
"""

from __future__ import annotations

import os
from pathlib import Path

from ds4mlx.engine.kvcache import DiskTier, PromptCache
from ds4mlx.engine.kvcache.prompt_cache import MAX_CUT, MemoryTier, common_prefix
from ds4mlx.engine.kvcache.snapshot_file import snapshot_nbytes
from ds4mlx.engine.session import Snapshot

import mlx.core as mx
import pytest

FINGERPRINT = "f" * 64


def state(tokens: tuple[int, ...]) -> Snapshot:
    """A snapshot of 1 KiB whose array says which tokens it was made for."""
    return Snapshot([mx.full((256,), float(sum(tokens)), mx.float32)], tokens)


A, B, C = (1, 2, 3), (4, 5, 6), (7, 8, 9)
ENTRY_BYTES = snapshot_nbytes(state(A))


# ------------------------------------------------------------------ memory


def test_memory_evicts_the_least_recently_used_entry():
    memory = MemoryTier(2 * ENTRY_BYTES)
    memory.put(state(A))
    memory.put(state(B))
    assert memory.get(A) is not None  # A is now more recent than B
    memory.put(state(C))
    assert memory.keys() == [A, C] and memory.used == 2 * ENTRY_BYTES


def test_memory_holds_entries_up_to_its_exact_budget():
    memory = MemoryTier(3 * ENTRY_BYTES)
    for tokens in (A, B, C):
        memory.put(state(tokens))
    assert memory.keys() == [A, B, C] and memory.used == 3 * ENTRY_BYTES
    memory.put(state(A))  # a second put replaces, and refreshes
    assert memory.keys() == [B, C, A] and memory.used == 3 * ENTRY_BYTES
    exact = MemoryTier(ENTRY_BYTES)
    exact.put(state(A))
    assert exact.keys() == [A]
    too_big = MemoryTier(ENTRY_BYTES - 1)
    too_big.put(state(A))
    assert len(too_big) == 0 and too_big.used == 0


def test_a_prompt_cache_read_refreshes_the_memory_entry():
    cache = PromptCache(2 * ENTRY_BYTES)
    cache.remember(state(A))
    cache.remember(state(B))
    (candidate,) = cache.candidates([*A, 99], 0)
    assert cache.load(candidate).tokens == A
    cache.remember(state(C))
    assert cache.memory.keys() == [A, C]


# ------------------------------------------------------------------ disk


def disk_for_two_and_a_half(folder: Path) -> DiskTier:
    """A disk tier where one more save keeps room for one earlier file, not two: a save
    reserves its estimate (arrays + 16 bytes a token + 64 KiB) and evicts to fit it."""
    probe = DiskTier(folder.parent / "probe", 1 << 30, FINGERPRINT)
    probe.save(state(A))
    (written,) = probe.folder.iterdir()
    estimate = ENTRY_BYTES + 16 * len(A) + 65536
    return DiskTier(folder, estimate + int(1.5 * written.stat().st_size), FINGERPRINT)


def age(tier: DiskTier, tokens: tuple[int, ...], seconds_ago: float) -> None:
    moment = os.stat(tier.path_for(tokens)).st_mtime - seconds_ago
    os.utime(tier.path_for(tokens), (moment, moment))


def test_disk_evicts_the_least_recently_used_file(tmp_path):
    tier = disk_for_two_and_a_half(tmp_path / "cache")
    tier.save(state(A))
    tier.save(state(B))
    age(tier, A, 20)
    age(tier, B, 10)
    assert tier.load(A).tokens == A  # read: A becomes the most recent
    tier.save(state(C))
    assert sorted(tier.keys()) == [A, C]
    assert not tier.path_for(B).exists()


def test_the_disk_budget_holds_when_a_file_comes_out_larger_than_estimated(tmp_path):
    """The estimate counts arrays and tokens; a state tree with a long text in it makes a
    header past the estimate's 64 KiB slack: the save then evicts again to keep the budget."""
    wordy = Snapshot([mx.zeros((256,), mx.float32), "x" * 100_000], B)
    probe = DiskTier(tmp_path / "probe", 1 << 30, FINGERPRINT)
    probe.save(state(A))
    probe.save(wordy)
    wordy_file = probe.path_for(B).stat().st_size
    assert wordy_file > snapshot_nbytes(wordy) + 16 * len(B) + 65536  # the estimate falls short
    # Room for both files by the estimate, one byte short of both as written.
    disk = DiskTier(tmp_path / "cache", probe.usage() - 1, FINGERPRINT)
    disk.save(state(A))
    age(disk, A, 10)
    assert disk.save(wordy)
    assert disk.usage() <= disk.budget and disk.keys() == [B]


def test_two_fingerprints_never_share_a_file_name(tmp_path):
    one = DiskTier(tmp_path, 1 << 30, "1" * 64)
    other = DiskTier(tmp_path, 1 << 30, "2" * 64)
    for tokens in (A, (1,), ()):
        assert one.path_for(tokens) != other.path_for(tokens)
        assert one.path_for(tokens) == DiskTier(tmp_path, 1, "1" * 64).path_for(tokens)
    assert one.path_for(A) != one.path_for(B)
    # Both models' snapshots of the same tokens are kept side by side, each readable by its own.
    one.save(state(A))
    other.save(state(A))
    assert len(list(tmp_path.glob("kv-*"))) == 2
    assert one.load(A) is not None and other.load(A) is not None


def test_a_restart_finds_only_its_own_models_files(tmp_path):
    DiskTier(tmp_path, 1 << 30, "1" * 64).save(state(A))
    DiskTier(tmp_path, 1 << 30, "2" * 64).save(state(B))
    warnings: list[str] = []
    again = DiskTier(tmp_path, 1 << 30, "1" * 64, warnings.append)
    assert again.keys() == [A] and len(warnings) == 1 and "another model" in warnings[0]


# ------------------------------------------------------------------ usable prefixes


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([5], [1]) == 0
    assert common_prefix([], [1]) == 0


def test_an_entry_is_usable_up_to_the_prompt_less_its_last_token():
    cache = PromptCache(1 << 20)
    prompt = list(range(10, 30))
    for length in (5, 19, 20):
        cache.remember(state(tuple(prompt[:length])))
    found = {c.tokens: (c.share, c.cut) for c in cache.candidates(prompt, 0)}
    # The whole prompt is cut back to all but its last token (a token must be left to feed).
    assert found == {
        tuple(prompt[:19]): (19, 0),
        tuple(prompt[:20]): (19, 1),
        tuple(prompt[:5]): (5, 0),
    }
    order = [c.tokens for c in cache.candidates(prompt, 0)]
    assert order == [tuple(prompt[:19]), tuple(prompt[:20]), tuple(prompt[:5])]
    assert [c.tokens for c in cache.candidates(prompt, 5)] == order[:2]


def test_an_entry_past_the_prompt_is_usable_only_within_the_rollback():
    cache = PromptCache(1 << 20)
    prompt = list(range(10, 30))
    within = tuple(prompt[:10]) + tuple(range(100, 100 + MAX_CUT))
    beyond = tuple(prompt[:10]) + tuple(range(200, 201 + MAX_CUT))
    cache.remember(state(within))
    cache.remember(state(beyond))
    (candidate,) = cache.candidates(prompt, 0)
    assert candidate.tokens == within and candidate.share == 10 and candidate.cut == MAX_CUT


def test_a_one_token_state_is_not_cached():
    cache = PromptCache(1 << 20)
    cache.remember(state((7,)))
    cache.remember(state((7, 8)))
    assert cache.memory.keys() == [(7, 8)]


@pytest.mark.parametrize("on_disk_first", [False, True])
def test_memory_wins_a_tie_with_disk(tmp_path, on_disk_first):
    cache = PromptCache(1 << 20, DiskTier(tmp_path, 1 << 30, FINGERPRINT))
    if on_disk_first:
        cache.persist(state(A))
        cache.remember(state(A))
    else:
        cache.remember(state(A))
        cache.persist(state(A))
    (candidate,) = cache.candidates([*A, 1], 0)
    assert not candidate.on_disk


def test_an_entry_needing_no_rollback_comes_before_one_that_does_on_a_tie(tmp_path):
    """Two entries share as much of the prompt: the one that holds nothing past it is tried
    first, from disk too, ahead of a memory entry that must be rolled back."""
    disk = DiskTier(tmp_path, 1 << 30, FINGERPRINT)
    disk.save(state((1, 2, 3)))
    cache = PromptCache(1 << 20, disk)
    cache.remember(state((1, 2, 3, 4, 5)))
    found = cache.candidates([1, 2, 3, 9, 9], longer_than=0)
    assert [(c.tokens, c.cut, c.on_disk) for c in found] == [
        ((1, 2, 3), 0, True),
        ((1, 2, 3, 4, 5), 2, False),
    ]


def test_only_stale_temporary_files_are_removed_at_start(tmp_path):
    stale = tmp_path / ".kv-interrupted.1234.tmp.safetensors"
    fresh = tmp_path / ".kv-writing.5678.tmp.safetensors"
    for path in (stale, fresh):
        path.write_bytes(b"partial")
    old = stale.stat().st_mtime - 601
    os.utime(stale, (old, old))
    DiskTier(tmp_path, 1 << 30, FINGERPRINT)
    assert not stale.exists() and fresh.exists()  # another process may still be writing it


def test_a_file_removed_behind_the_caches_back_is_written_again(tmp_path):
    disk = DiskTier(tmp_path / "kv", 1 << 30, FINGERPRINT)
    assert disk.save(state(A))
    path = disk.path_for(A)
    path.unlink()  # another process evicted it, or a person cleaned the folder
    assert disk.save(state(A)) and path.exists()
    assert disk.load(A).tokens == A


def test_putting_an_entry_again_replaces_it_without_evicting_another():
    memory = MemoryTier(3 * ENTRY_BYTES)
    for tokens in (A, B, C):
        memory.put(state(tokens))
    memory.put(state(B))  # not the least recently used: nothing need go
    assert memory.keys() == [A, C, B] and memory.used == 3 * ENTRY_BYTES


def test_a_state_read_from_disk_is_kept_in_memory(tmp_path):
    DiskTier(tmp_path / "kv", 1 << 30, FINGERPRINT).save(state(A))
    cache = PromptCache(4 * ENTRY_BYTES, DiskTier(tmp_path / "kv", 1 << 30, FINGERPRINT))
    (candidate,) = cache.candidates([*A, 99], 0)
    assert candidate.on_disk and cache.load(candidate).tokens == A
    assert cache.memory.keys() == [A]
    (again,) = cache.candidates([*A, 99], 0)
    assert not again.on_disk  # the next request finds it in memory


def test_a_memory_entry_loads_from_memory_when_there_is_a_disk_tier_too(tmp_path):
    """An entry only in memory (never persisted) is found and loaded as it is: the disk tier,
    which does not hold it, is not asked; an entry held by both comes from memory too."""
    cache = PromptCache(4 * ENTRY_BYTES, DiskTier(tmp_path / "kv", 1 << 30, FINGERPRINT))
    kept = state(A)
    cache.remember(kept)
    (candidate,) = cache.candidates([*A, 99], 0)
    assert not candidate.on_disk and cache.load(candidate) is kept
    both = state(B)
    cache.remember(both)
    cache.persist(both)
    (candidate,) = cache.candidates([*B, 99], 0)
    assert cache.load(candidate) is both
