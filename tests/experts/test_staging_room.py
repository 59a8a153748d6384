"""Hinted (prefetched) expert reads in flight never exceed the staging room, at several cache
shares: reads that are still running after their hint was dropped count until they finish. The
most routed experts are hinted first, an expert already in flight is not read twice, and the
reads on demand in flight at once fit in the budget kept for them.

The reader is held on an event, so every read stays in flight while the test looks; nothing
here depends on timing.
"""

from __future__ import annotations

import threading

from ds4mlx.experts import streamed as streamed_module

import mlx.core as mx
import numpy as np
import pytest
from expert_helpers import TINY, routed_info, streamed

SHARES = (0.5, 0.75, 0.9)


@pytest.fixture(scope="module")
def routed() -> tuple[int, int, int]:
    return routed_info(TINY)


def budget(routed: tuple[int, int, int], share: float) -> float:
    routed_bytes, per_expert, n_used = routed
    return max(routed_bytes * share + 1, per_expert * n_used + 1) / 2**30


def first_layer_experts(store) -> int:
    return store.layers[0].n_experts


@pytest.mark.parametrize("share", SHARES)
def test_hinted_reads_in_flight_stay_within_the_staging_room(routed, share, monkeypatch):
    model = streamed(TINY, budget(routed, share), read_threads=2)
    store = model.experts
    store.finish_loading()
    (pool,) = store.pools
    assert pool.staging > 0, "this share leaves no staging room: choose another"
    # The staging room is part of the budget, and leaves the slab at least one token's experts.
    assert model.expert_stats().capacity_bytes <= model.expert_stats().budget_bytes
    assert pool.capacity >= routed[2] and pool.staging <= first_layer_experts(store)
    release = threading.Event()
    started = threading.Semaphore(0)  # one release per read that reached the file
    reads: list[streamed_module._ExpertRead] = []
    read_tensor = store.reader.read_tensor

    def held_read(tensor, expert):
        started.release()
        assert release.wait(30)
        return read_tensor(tensor, expert)

    class CountedRead(streamed_module._ExpertRead):
        def __init__(self, *args):
            super().__init__(*args)
            reads.append(self)

    monkeypatch.setattr(store.reader, "read_tensor", held_read)
    monkeypatch.setattr(streamed_module, "_ExpertRead", CountedRead)

    def in_flight() -> int:
        return sum(not read.done() for read in reads)

    first, second = store.layers[0], store.layers[1]
    everything = mx.arange(first.n_experts)
    try:
        first.prefetch(everything)
        assert in_flight() == len(pool.inflight) == pool.staging
        first.prefetch(everything)  # hinted again: nothing more is started
        assert in_flight() == pool.staging
        # Both reader threads are inside a read (held): those reads cannot be cancelled.
        assert started.acquire(timeout=30) and started.acquire(timeout=30)
        # The routing wanted none of them: queued reads are cancelled, running ones drain.
        store._drop_unwanted_prefetches(first, pool, np.array([], np.int64))
        assert not pool.inflight and 0 < in_flight() <= pool.staging
        second.prefetch(everything)
        assert in_flight() <= pool.staging
        assert in_flight() == pool.staging  # the room left is used
    finally:
        release.set()
        model.close()


def test_the_most_routed_experts_are_hinted_first(routed):
    model = streamed(TINY, budget(routed, SHARES[0]), read_threads=2)
    store = model.experts
    store.finish_loading()
    (pool,) = store.pools
    layer = store.layers[0]
    room = pool.staging
    assert 0 < room < layer.n_experts, "the staging room must be smaller than a layer"
    hot = list(range(layer.n_experts - room, layer.n_experts))
    try:
        # Every expert routed once, the last ``room`` of them twice more.
        layer.prefetch(mx.array(list(range(layer.n_experts)) + hot * 2))
        assert sorted(pool.inflight) == [layer.key_base + expert for expert in hot]
    finally:
        model.close()


def test_hinting_an_expert_already_in_flight_starts_no_second_read(routed):
    model = streamed(TINY, budget(routed, SHARES[-1]), read_threads=2)
    store = model.experts
    store.finish_loading()
    (pool,) = store.pools
    layer = store.layers[0]
    assert pool.staging >= 2, "this share leaves no room for a second read"
    try:
        layer.prefetch(mx.array([0]))
        read = pool.inflight[layer.key_base]
        layer.prefetch(mx.array([0, 0]))  # the next step hints it again, still in flight
        assert pool.inflight == {layer.key_base: read}
    finally:
        model.close()


@pytest.mark.parametrize("share", [0.3, *SHARES])
def test_demand_reads_in_flight_fit_in_the_room_kept_for_them(routed, share):
    # Each expert read on demand holds about two slots while it converts (its bytes and the
    # result): the reads in flight at once must fit in the budget kept for them.
    model = streamed(TINY, budget(routed, share), read_threads=8)
    try:
        model.experts.finish_loading()
        (pool,) = model.experts.pools
        assert 1 <= pool.window and 2 * pool.window <= pool.reserved
    finally:
        model.close()
