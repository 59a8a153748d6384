"""The prompt cache's fixed limits and one-time warnings, on small stand-in states."""

from __future__ import annotations

from ds4mlx.engine.kvcache import DiskTier, PromptCache
from ds4mlx.engine.kvcache import prompt_cache as prompt_cache_module
from ds4mlx.engine.kvcache.prompt_cache import common_prefix
from ds4mlx.engine.session import Snapshot

import mlx.core as mx
import pytest

FINGERPRINT = "e" * 64


def state(tokens: tuple[int, ...]) -> Snapshot:
    return Snapshot([mx.full((64,), float(sum(tokens)), mx.float32)], tokens)


def test_one_token_sequences_share_what_they_hold():
    assert common_prefix([5], [5]) == 1
    assert common_prefix([5], [5, 6]) == 1
    assert common_prefix([5], [6]) == 0
    assert common_prefix([], []) == 0


@pytest.mark.parametrize(("extra", "usable"), [(3, True), (4, True), (5, False), (8, False)])
def test_an_entry_may_hold_four_tokens_past_the_prompt(extra, usable):
    # Both architectures roll a restored state back over at least four decode steps.
    cache = PromptCache(1 << 20)
    prompt = list(range(10, 30))
    entry = tuple(prompt[:10]) + tuple(range(100, 100 + extra))
    cache.remember(state(entry))
    found = cache.candidates(prompt, 0)
    assert [(c.tokens, c.share, c.cut) for c in found] == ([(entry, 10, extra)] if usable else [])


def test_a_disk_folder_is_made_with_its_parents(tmp_path):
    folder = tmp_path / "a" / "b" / "kv"
    disk = DiskTier(folder, 1 << 30, FINGERPRINT)
    assert folder.is_dir() and disk.save(state((1, 2, 3)))


def test_a_failing_disk_warns_once_until_a_write_succeeds(tmp_path, monkeypatch):
    warnings: list[str] = []
    disk = DiskTier(tmp_path, 1 << 30, FINGERPRINT, warn=warnings.append)
    real_write = prompt_cache_module.write_snapshot

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prompt_cache_module, "write_snapshot", full_disk)
    assert not disk.save(state((1, 2)))
    assert not disk.save(state((3, 4)))
    assert len(warnings) == 1 and "could not save a snapshot of 2 tokens" in warnings[0]
    monkeypatch.setattr(prompt_cache_module, "write_snapshot", real_write)
    assert disk.save(state((5, 6)))
    monkeypatch.setattr(prompt_cache_module, "write_snapshot", full_disk)
    assert not disk.save(state((7, 8)))
    assert len(warnings) == 2


def test_a_snapshot_over_the_disk_budget_is_refused_with_a_warning(tmp_path):
    warnings: list[str] = []
    disk = DiskTier(tmp_path, 65536, FINGERPRINT, warn=warnings.append)
    assert not disk.save(state((1, 2)))
    assert len(disk) == 0 and "exceeds the disk budget" in warnings[0]
