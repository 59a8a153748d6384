"""The disk tier's folder: the names it gives its files, what else it finds there and leaves
alone, and a save whose file came out larger than the whole budget."""

from __future__ import annotations

import re

from ds4mlx.engine.kvcache import DiskTier
from ds4mlx.engine.session import Snapshot

import mlx.core as mx
from test_prompt_cache_guards5b import estimate
from test_prompt_cache_order import FINGERPRINT, A, B, state


def test_a_snapshot_file_is_named_by_160_bits_of_its_digest(tmp_path):
    disk = DiskTier(tmp_path, 1 << 30, FINGERPRINT)
    for tokens in (A, B, ()):
        name = disk.path_for(tokens).name
        assert re.fullmatch(r"kv-[0-9a-f]{40}\.safetensors", name), name
    assert disk.path_for(A).parent == tmp_path


def test_a_folder_named_like_a_snapshot_is_left_alone(tmp_path):
    lookalike = tmp_path / DiskTier(tmp_path / "probe", 1, FINGERPRINT).path_for(B).name
    lookalike.mkdir()
    warnings: list[str] = []
    disk = DiskTier(tmp_path, 1 << 30, FINGERPRINT, warnings.append)
    assert len(disk) == 0 and warnings == [] and disk.usage() == 0
    assert disk.save(state(A)) and disk.keys() == [A]
    assert disk.usage() == disk.path_for(A).stat().st_size
    assert lookalike.is_dir()


def test_a_file_larger_than_the_whole_budget_once_written_is_not_kept(tmp_path):
    # The estimate (arrays, tokens, 64 KiB of header) fits the budget; the file, with a long
    # text in its state, does not: it is evicted right away and the save says so.
    wordy = Snapshot([mx.zeros((256,), mx.float32), "x" * 100_000], B)
    warnings: list[str] = []
    disk = DiskTier(tmp_path, estimate(wordy), FINGERPRINT, warnings.append)
    assert disk.save(wordy) is False
    assert disk.keys() == [] and disk.usage() == 0 and warnings == []
    assert disk.save(state(A)) is True and disk.keys() == [A]
