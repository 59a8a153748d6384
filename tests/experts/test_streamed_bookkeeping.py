"""The streamed store's bookkeeping, built by hand on the tiny model: how a budget is sized when
every expert fits or layers route different numbers of experts, which pairs each batch of a
routing step carries and where they point, the reads it starts (cached experts first, demand reads
within their window), its counters and their snapshot, and the hinted reads it drops."""

from __future__ import annotations

from types import SimpleNamespace

from ds4mlx.experts import ExpertOptions
from ds4mlx.experts import streamed as streamed_module
from ds4mlx.experts.streamed import MLX_CACHE_SLOTS, _ExpertRead, _Slab
from ds4mlx.gguf.quants import HostWeight

import mlx.core as mx
import numpy as np
import pytest
from expert_helpers import TINY_EXPERTS, TINY_MOE_LAYERS, expert_names, make_store
from gguf import GGMLQuantizationType as T

ALL_EXPERTS = TINY_EXPERTS * TINY_MOE_LAYERS


def slot_bytes(store) -> int:
    return sum(store.reader.read_tensor(t, 0).nbytes for t in store.layers[0].tensors)


def loaded(slots: int):
    """A store of ``slots`` experts' budget, sized, its reader's counters from zero (sizing read
    one expert as the slab's template)."""
    store = make_store(slots=slots)
    store.finish_loading()
    # Batches index the slab's own slots (the Metal and CPU block kernels' path) wherever the
    # tests run, so that each pair's index names a slot.
    store.pools[0].decode_batch = None
    store.reader.reads = store.reader.bytes_read = 0
    store.reader.read_seconds = 0.0
    return store


@pytest.fixture
def roomy():
    """40 slots' worth of budget: 30 slots, 3 staged reads, a window of 2 demand reads."""
    store = loaded(40)
    yield store
    store.close()


@pytest.fixture
def tight():
    """The minimum budget: 2 slots (one token's experts), one demand read at a time."""
    store = loaded(2)
    yield store
    store.close()


# -- sizing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("slots", [ALL_EXPERTS, ALL_EXPERTS + 12])
def test_a_budget_holding_every_expert_caches_them_all_and_reserves_nothing(slots):
    store = make_store(slots=slots)
    try:
        store.finish_loading()
        (pool,) = store.pools
        # Nothing is ever read on demand past the first use: no reserve, no staging, and the
        # demand reads of a cold start use every reader thread.
        assert (pool.capacity, pool.staging, pool.reserved, pool.window) == (ALL_EXPERTS, 0, 0, 2)
        assert store.stats().routed_bytes == ALL_EXPERTS * pool.slab.slot_bytes
        assert store.stats().budget_bytes == slots * pool.slab.slot_bytes
    finally:
        store.close()


def test_the_minimum_budget_is_the_widest_layers_top_k():
    """Layers routing 2 and 3 experts a token: the slab needs 3 slots, not 2."""
    store = make_store(layers=0)
    store.layer(expert_names(0), None, n_used=2)
    store.layer(expert_names(1), None, n_used=3)
    per_expert = slot_bytes(store)
    store.options = ExpertOptions(stream=True, read_threads=2, cache_gib=3 * per_expert / 2**30)
    try:
        store.finish_loading()
        assert store.pools[0].capacity == 3
    finally:
        store.close()
    store = make_store(layers=0)
    store.layer(expert_names(0), None, n_used=3)
    store.layer(expert_names(1), None, n_used=2)
    store.options = ExpertOptions(
        stream=True, read_threads=2, cache_gib=(3 * per_expert - 1) / 2**30
    )
    try:
        with pytest.raises(ValueError, match=r"below the minimum .* \(one layer's top-3 experts\)"):
            store.finish_loading()
    finally:
        store.close()


def test_mlx_keeps_at_most_a_few_slots_of_freed_buffers():
    previous = mx.set_cache_limit(2**40)
    stores = [make_store(slots=40), make_store(slots=40)]
    try:
        stores[0].finish_loading()
        limit = MLX_CACHE_SLOTS * stores[0].pools[0].slab.slot_bytes
        assert mx.set_cache_limit(1) == limit
        stores[1].finish_loading()  # a limit already below the slots' worth is kept
        assert mx.set_cache_limit(previous) == 1
    finally:
        mx.set_cache_limit(previous)
        for store in stores:
            store.close()


# -- routing steps -----------------------------------------------------------------------------


def check_pairs(store, layer, routing: list[list[int]]) -> list:
    """The batches of ``routing``, checking as each is handed out that its pairs cover the
    routing's once in all and that each pair's index names the slot holding its expert."""
    pool = layer.pool
    flat = np.array(routing).reshape(-1)
    covered = []
    batches = []
    for batch in layer.batches(mx.array(routing, dtype=mx.int32)):
        pairs = np.arange(flat.size) if batch.pairs is None else batch.pairs
        slots = np.array(batch.indices).reshape(-1)
        assert (pool.policy.slot_key[slots] - layer.key_base).tolist() == flat[pairs].tolist()
        covered += pairs.tolist()
        batches.append(batch)
    assert sorted(covered) == list(range(flat.size))
    return batches


def test_each_pair_points_at_the_slot_holding_its_expert(roomy):
    layer = roomy.layers[1]
    check_pairs(roomy, layer, [[0, 1], [2, 0], [5, 3]])  # four experts read in one step
    check_pairs(roomy, layer, [[3, 6], [6, 0]])  # cached and missing ones mixed


def test_a_routing_of_exactly_the_slots_there_are_is_one_batch(tight):
    layer = tight.layers[0]
    (batch,) = check_pairs(tight, layer, [[0, 1], [1, 0]])
    assert batch.pairs is None and np.array(batch.indices).shape == (2, 2)
    batches = check_pairs(tight, layer, [[0, 1], [2, 1]])  # one expert more: two batches
    assert len(batches) == 2 and all(b.pairs is not None for b in batches)


def test_a_split_routing_step_takes_its_cached_experts_first(tight):
    """Experts 0 and 1 cached, then 0, 2, 3 routed in two slots: 0 goes in the first batch with
    2 (evicting 1), so only 2 and 3 are read; taking 0 last would evict and re-read it."""
    layer = tight.layers[0]
    check_pairs(tight, layer, [[0, 1]])
    check_pairs(tight, layer, [[0, 2], [3, 0]])
    stats = tight.stats()
    assert stats.reads == 4 * len(layer.tensors)
    assert (stats.hits, stats.misses, stats.evictions) == (1, 4, 2)


def test_an_empty_routing_reads_nothing(roomy):
    (batch,) = roomy.layers[0].batches(mx.zeros((0, 2), mx.int32))
    assert np.array(batch.indices).shape == (0, 2)
    assert roomy.stats().reads == 0


def test_demand_reads_in_flight_never_exceed_the_window(roomy, tight, monkeypatch):
    live: list[int] = [0]
    most: list[int] = [0]

    class CountedRead(_ExpertRead):
        def __init__(self, *args):
            super().__init__(*args)
            live[0] += 1
            most[0] = max(most[0], live[0])

        def result(self):
            live[0] -= 1
            return super().result()

    monkeypatch.setattr(streamed_module, "_ExpertRead", CountedRead)
    for store in (roomy, tight):
        most[0] = 0
        layer = store.layers[2]
        list(layer.batches(mx.array([[0, 1], [2, 3], [4, 5]])))
        assert most[0] == store.pools[0].window == (2 if store is roomy else 1)


def test_the_newest_layer_result_is_kept_until_a_slot_is_written(roomy):
    layer = roomy.layers[0]
    ((_, result),) = layer.map_batches(mx.array([[0, 1]]), lambda batch: batch.indices + 1)
    assert roomy.newest_result is result
    list(layer.batches(mx.array([[1]])))  # a hit writes nothing: kept
    assert roomy.newest_result is result
    list(layer.batches(mx.array([[1, 4]])))  # a miss: evaluated before the write
    assert roomy.newest_result is None


# -- counters ----------------------------------------------------------------------------------


def test_hits_add_up_and_the_slot_zero_expert_is_a_hit(roomy):
    layer = roomy.layers[0]
    list(layer.batches(mx.array([[0]])))  # key 0 goes to slot 0
    assert layer.pool.policy.lookup(np.array([0])).tolist() == [0]
    list(layer.batches(mx.array([[0]])))
    list(layer.batches(mx.array([[0, 1]])))
    stats = roomy.stats()
    assert (stats.hits, stats.misses, stats.routing_steps) == (2, 2, 3)


def test_read_counters_are_the_readers_and_stats_are_a_snapshot(roomy):
    layer = roomy.layers[0]
    list(layer.batches(mx.array([[0, 3]])))
    before = roomy.stats()
    reader = roomy.reader
    assert before.reads == reader.reads == 2 * len(layer.tensors)
    assert before.bytes_read == reader.bytes_read == 2 * sum(t.expert_nbytes for t in layer.tensors)
    assert before.read_seconds == reader.read_seconds > 0
    per_slot = roomy.pools[0].slab.slot_bytes
    assert before.routed_bytes == ALL_EXPERTS * per_slot
    assert before.budget_bytes == roomy.budget_bytes >= 40 * per_slot - 1
    assert before.budget_bytes < 41 * per_slot
    list(layer.batches(mx.array([[5]])))
    assert (before.misses, before.reads, before.routing_steps) == (2, 2 * len(layer.tensors), 1)
    assert roomy.stats().misses == 3


# -- reads in flight ---------------------------------------------------------------------------


class _Future:
    def __init__(self, done: bool = False, cancels: bool = True):
        self._done, self._cancels = done, cancels

    def done(self) -> bool:
        return self._done

    def cancel(self) -> bool:
        return self._cancels


def read_of(*futures: _Future) -> _ExpertRead:
    read = object.__new__(_ExpertRead)
    read.parts = list(futures)
    return read


def test_a_read_is_done_when_all_its_tensors_are():
    assert not read_of(_Future(done=True), _Future(done=False), _Future(done=True)).done()
    assert read_of(_Future(done=True), _Future(done=True), _Future(done=True)).done()


def test_a_read_is_cancelled_only_when_none_of_its_tensors_started():
    assert read_of(_Future(), _Future()).cancel()
    assert not read_of(_Future(), _Future(cancels=False)).cancel()


def test_unwanted_hinted_reads_that_cancel_do_not_drain(roomy):
    layer = roomy.layers[0]
    pool = layer.pool
    queued, running = read_of(_Future()), read_of(_Future(cancels=False))
    pool.inflight = {layer.key_base + 1: queued, layer.key_base + 2: running}
    roomy._drop_unwanted_prefetches(layer, pool, np.array([], np.int64))
    assert pool.inflight == {} and pool.draining == [running]
    pool.draining = []


def test_metal_kernels_compute_packed_experts_from_the_whole_slab(monkeypatch):
    monkeypatch.setattr(streamed_module, "PACKED_KERNELS", "metal")
    monkeypatch.setattr(streamed_module, "cpu_keeps_blocks", lambda: False)
    packed = (SimpleNamespace(kind="packed"),) * 3
    layer = SimpleNamespace(tensors=[SimpleNamespace(expert_shape=(256, 1024))] * 3)
    assert streamed_module._decode_batch(packed, layer) is None


def test_bfloat16_experts_are_written_bit_for_bit_into_their_slot():
    """numpy has no bfloat16: such experts travel as uint16 bits, which MLX writes in place."""
    bits = np.arange(3 * 2 * 4, dtype=np.uint16).reshape(3, 2, 4) * 257
    template = tuple(HostWeight("bf16", (np.zeros((2, 4), np.uint16),), T.BF16) for _ in bits)
    slab = _Slab(template, capacity=3)
    slab.write(1, tuple(HostWeight("bf16", (b,), T.BF16) for b in bits))
    for arrays, written in zip(slab.parts, bits, strict=True):
        (array,) = arrays
        assert array.dtype == mx.bfloat16
        stored = np.array(array.view(mx.uint16))
        assert stored[1].tolist() == written.tolist()
        assert not stored[0].any() and not stored[2].any()
