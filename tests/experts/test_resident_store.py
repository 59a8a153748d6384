"""The resident expert store's counters and the byte size of each kind of weight."""

from __future__ import annotations

from ds4mlx.experts import ResidentStore
from ds4mlx.experts.store import ExpertStats, weight_nbytes
from ds4mlx.kernels import PackedWeight, QuantizedWeight

import mlx.core as mx
from gguf import GGMLQuantizationType as T

NAMES = ("blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight")


def test_every_kind_of_weight_counts_all_its_arrays():
    dense = mx.zeros((2, 3, 4), mx.float32)
    assert weight_nbytes(dense) == 96
    packed = mx.zeros((2, 3, 1), mx.uint32)
    scales = mx.zeros((2, 3, 1), mx.float16)
    assert weight_nbytes(QuantizedWeight(packed, scales, scales, 4, 32, "affine")) == 24 + 12 + 12
    assert weight_nbytes(QuantizedWeight(packed, scales, None, 4, 32, "mxfp4")) == 24 + 12
    assert weight_nbytes(PackedWeight(mx.zeros((2, 3, 84), mx.uint8), T.Q2_K)) == 504


def test_resident_stats_count_every_layer_in_every_field():
    store = ResidentStore()
    for _ in range(2):
        store.layer(NAMES, lambda name: mx.zeros((2, 3, 4), mx.float32), n_used=1)
    assert store.stats() == ExpertStats(
        "resident",
        resident_bytes=2 * 3 * 96,
        capacity_bytes=2 * 3 * 96,
        budget_bytes=2 * 3 * 96,
        routed_bytes=2 * 3 * 96,
    )


def test_stats_as_a_dict_hold_every_counter_and_both_rates():
    stats = ExpertStats("streamed", hits=1, misses=3, bytes_read=10**9, read_seconds=2.0)
    as_dict = stats.as_dict()
    assert as_dict["kind"] == "streamed" and as_dict["routing_steps"] == 0
    assert (as_dict["hit_rate"], as_dict["read_gbps"]) == (0.25, 0.5)
    assert len(as_dict) == 17
