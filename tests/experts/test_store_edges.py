"""The streamed expert store at the edges the fourth fresh mutation run found untested (issue
37, ``scripts/mutation_sets/fresh4.py``): a cache of exactly the minimum budget, routing
indices and hot-list entries one past the last expert, a routing step that drops only its own
layer's hinted reads, and the hot-list's order.

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
