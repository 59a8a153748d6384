"""The streamed expert store at the edges the fourth fresh mutation run found untested (issue
37, ``scripts/mutation_sets/fresh4.py``): a cache of exactly the minimum budget, routing
indices and hot-list entries one past the last expert, a routing step that drops only its own
layer's hinted reads, and the hot-list's order; from fresh9's first pass, the count of hinted
reads used and a hot-list only read, not saved.

Each test was checked against the mutation it is named after in that set.
"""

from __future__ import annotations

import json

from ds4mlx.experts.policy import SlotPolicy
from ds4mlx.experts.streamed import HOTLIST_FORMAT

import mlx.core as mx
import numpy as np
import pytest
from expert_helpers import TINY, routed_info, streamed
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def routed() -> tuple[int, int, int]:
    return routed_info(TINY)


def test_a_cache_of_exactly_the_minimum_streams_and_one_byte_less_is_refused(routed):
    _, per_expert, n_used = routed
    minimum = per_expert * n_used
    model = streamed(TINY, minimum / 2**30)
    try:
        assert model.logits([1, 2, 3]).shape[0] == 3
        assert model.expert_stats().capacity_bytes == minimum
    finally:
        model.close()
    with pytest.raises(ValueError, match="below the minimum"):
        streamed(TINY, (minimum - 1) / 2**30).logits([1])


@pytest.fixture(scope="module")
def store(routed):
    model = streamed(TINY, routed[0] * 0.9 / 2**30, read_threads=2)
    model.experts.finish_loading()
    yield model.experts
    model.close()


@pytest.mark.parametrize("past", [0, 1, 7])
def test_a_routing_index_past_the_last_expert_is_refused(store, past):
    layer = store.layers[0]
    for bad in (layer.n_experts + past, -1 - past):
        with pytest.raises(ValueError, match="out of range"):
            list(layer.batches(mx.array([[0, bad]])))
    assert len(list(layer.batches(mx.array([[0, layer.n_experts - 1]])))) >= 1


def test_a_routing_step_drops_only_its_own_layers_hinted_reads(routed):
    model = streamed(TINY, routed[0] * 0.9 / 2**30, read_threads=2)
    try:
        _drops_only_its_own(model.experts)
    finally:
        model.close()


def _drops_only_its_own(store) -> None:
    store.finish_loading()
    first, second = store.layers[0], store.layers[1]
    assert first.pool is second.pool, "both layers must share one staging room"
    pool = first.pool
    assert pool.staging >= 2
    spare = first.n_experts - 1
    second.prefetch(mx.array([spare]))
    first.prefetch(mx.array([spare]))
    assert {first.key_base + spare, second.key_base + spare} <= set(pool.inflight)
    list(first.batches(mx.array([[0]])))  # the first layer's routing did not want its hint
    assert first.key_base + spare not in pool.inflight
    assert second.key_base + spare in pool.inflight


@pytest.mark.parametrize("offset", [0, 1])
def test_a_hotlist_naming_an_expert_past_the_last_is_refused(store, tmp_path, offset):
    layer = store.layers[0]
    expert = layer.n_experts - 1 + offset
    entry = {"layer": layer.prefix, "expert": expert, "hotness": 1.0}
    hotlist = tmp_path / "hot.json"
    hotlist.write_text(json.dumps({"format": HOTLIST_FORMAT, "experts": [entry]}))
    if offset:
        with pytest.raises(ValueError, match="out of range"):
            store.load_hotlist(hotlist)
    else:
        assert store.load_hotlist(hotlist) in (0, 1)


@given(st.lists(st.integers(1, 50), min_size=1, max_size=12), st.integers(1, 12))
def test_the_hottest_experts_come_first(uses, limit):
    policy = SlotPolicy(len(uses), 4, half_life=1e9)
    for key, count in enumerate(uses):
        policy.record_use(np.array([key]), count)
    keys, hot = policy.hottest(limit)
    assert list(hot) == sorted(uses, reverse=True)[:limit]
    assert [uses[key] for key in keys] == list(hot)


# fresh6's first-pass survivors in the streamed store (each test names its mutation).


def test_evicting_the_expert_of_key_zero_counts(routed):
    """(streamed_eviction_of_key_zero_not_counted) The first layer's expert 0 is key 0."""
    model = streamed(TINY, (routed[1] * routed[2] + 1) / 2**30)
    try:
        store = model.experts
        store.finish_loading()
        first = store.layers[0]
        assert first.key_base == 0 and first.pool.capacity == 2
        list(first.batches(mx.array([[0, 1]])))
        assert model.expert_stats().evictions == 0  # empty slots filled
        list(first.batches(mx.array([[2, 3]])))
        assert model.expert_stats().evictions == 2  # keys 0 and 1 went
    finally:
        model.close()


def write_hotlist(path, entries) -> None:
    path.write_text(json.dumps({"format": HOTLIST_FORMAT, "experts": entries}))


def test_a_hotlist_fills_at_most_the_slots_there_are(routed, tmp_path):
    """(streamed_hotlist_reads_past_the_capacity, streamed_hotlist_zero_hotness_refused) A
    hot-list longer than the slots reads only its hottest experts; hotness 0 is allowed (an
    expert the last run loaded but never used)."""
    model = streamed(TINY, (routed[1] * routed[2] + 1) / 2**30)
    try:
        store = model.experts
        first = store.layers[0]
        entries = [
            {"layer": first.prefix, "expert": e, "hotness": h}
            for e, h in ((5, 1.0), (6, 4.0), (7, 0.0), (4, 2.0))
        ]
        write_hotlist(tmp_path / "hot.json", entries)
        assert store.load_hotlist(tmp_path / "hot.json") == first.pool.capacity == 2
        cached = first.pool.policy.lookup(np.arange(8) + first.key_base)
        assert sorted(np.flatnonzero(cached >= 0).tolist()) == [4, 6]  # the two hottest
    finally:
        model.close()


def hotlist_of_one_expert(path, routed) -> str:
    """Writes a hot-list naming the first layer's expert 3 at ``path``; returns its text."""
    model = streamed(TINY, (routed[1] * routed[2] + 1) / 2**30)
    first = model.experts.layers[0]
    write_hotlist(path, [{"layer": first.prefix, "expert": 3, "hotness": 7.0}])
    model.close()
    return path.read_text()


def test_a_run_that_routed_nothing_leaves_the_hotlist_alone(routed, tmp_path):
    """(streamed_idle_run_overwrites_the_hotlist) A run that failed or did nothing has no
    hotness to save: the hot-list it started from stays as it was."""
    hotlist = tmp_path / "hot.json"
    before = hotlist_of_one_expert(hotlist, routed)
    idle = streamed(TINY, (routed[1] * routed[2] + 1) / 2**30, hotlist=hotlist, save_hotlist=True)
    idle.close()
    assert hotlist.read_text() == before


def test_each_hinted_read_a_routing_step_takes_is_counted(routed):
    """(fresh9 ``streamed_prefetch_use_not_counted``) Two experts hinted, then routed: two
    prefetches used."""
    model = streamed(TINY, routed[0] * 0.9 / 2**30, read_threads=2)
    try:
        store = model.experts
        store.finish_loading()
        first = store.layers[0]
        spare = [first.n_experts - 2, first.n_experts - 1]
        assert first.pool.policy.lookup(np.array(spare) + first.key_base).tolist() == [-1, -1]
        first.prefetch(mx.array(spare))
        list(first.batches(mx.array([spare])))
        stats = model.expert_stats()
        assert (stats.prefetched, stats.prefetch_used) == (2, 2)
    finally:
        model.close()


def test_a_hotlist_not_asked_to_be_saved_is_left_as_it_was(routed, tmp_path):
    """(fresh9 ``streamed_hotlist_written_without_being_asked``) ``--expert-hotlist`` alone
    reads the file: a run that routed tokens does not rewrite it."""
    hotlist = tmp_path / "hot.json"
    before = hotlist_of_one_expert(hotlist, routed)
    reader = streamed(TINY, (routed[1] * routed[2] + 1) / 2**30, hotlist=hotlist)
    try:
        reader.logits([1, 2, 3])
        assert reader.expert_stats().routing_steps > 0
    finally:
        reader.close()
    assert hotlist.read_text() == before
