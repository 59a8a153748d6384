"""The streamed expert store built by hand on the tiny model (no model loaded): registering
layers, sizing the slab, staging and read window from a budget, its counters, the hot-list file
it writes and reads, and the batch size of experts decoded before their matmuls."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

from ds4mlx.experts import streamed as streamed_module
from ds4mlx.experts.streamed import HALF_LIFE_STEPS, HOTLIST_FORMAT, TWIN_BATCH_BYTES, _Pool
from ds4mlx.gguf import GGUFError

import mlx.core as mx
import pytest
from expert_helpers import TINY, TINY_EXPERTS, TINY_MOE_LAYERS, expert_names, make_store


@pytest.fixture
def store():
    store = make_store(slots=40)
    yield store
    store.close()


def test_layers_get_their_prefix_and_consecutive_keys(store):
    assert [layer.prefix for layer in store.layers] == [f"blk.{i}" for i in range(TINY_MOE_LAYERS)]
    assert [layer.key_base for layer in store.layers] == [
        TINY_EXPERTS * i for i in range(TINY_MOE_LAYERS)
    ]
    assert store.n_keys == TINY_EXPERTS * TINY_MOE_LAYERS


def test_a_layer_named_after_the_first_use_is_refused(store):
    store.finish_loading()
    with pytest.raises(RuntimeError, match="registered before the first use"):
        store.layer(expert_names(0), None, n_used=2)


@pytest.mark.parametrize("n_used", [0, -1, TINY_EXPERTS + 1])
def test_a_layer_using_no_experts_or_more_than_it_has_is_refused(n_used):
    store = make_store(layers=0)
    with pytest.raises(ValueError, match=f"blk.0: {n_used} experts used of {TINY_EXPERTS}"):
        store.layer(expert_names(0), None, n_used=n_used)
    store.close()


@pytest.mark.parametrize("missing", [0, 2])
def test_a_missing_expert_tensor_is_a_clear_error(missing):
    store = make_store(layers=0)
    wanted = list(expert_names(0))
    wanted[missing] = "blk.0.ffn_none_exps.weight"
    with pytest.raises(GGUFError, match="missing tensor 'blk.0.ffn_none_exps.weight'"):
        store.layer(tuple(wanted), None, n_used=2)
    store.close()


def test_expert_tensors_that_disagree_on_the_number_of_experts_are_refused():
    store = make_store(layers=0)
    tensors = dict(store.gguf.layout.tensors)
    down = tensors[expert_names(0)[2]]
    tensors[down.name] = replace(down, ggml_dims=(256, 256, 4), nbytes=down.nbytes // 2)
    store.gguf = SimpleNamespace(path=store.gguf.path, layout=SimpleNamespace(tensors=tensors))
    with pytest.raises(GGUFError, match="disagree on the number of experts"):
        store.layer(expert_names(0), None, n_used=2)
    store.close()


def test_a_store_without_layers_finishes_loading_empty():
    store = make_store(layers=0)
    store.finish_loading()
    stats = store.stats()
    assert (stats.capacity_bytes, stats.resident_bytes, stats.budget_bytes) == (0, 0, 0)
    store.close()


@pytest.mark.parametrize(
    ("prefetch", "capacity", "staging"),
    [(True, 30, 3), (False, 33, 0)],
)
def test_a_budget_of_40_experts_is_split_into_slots_reads_and_staging(prefetch, capacity, staging):
    """40 slots' worth, 2 experts per token, 2 read threads: a window of 2 reads in flight
    reserves 2 * 2 + 3 slots; an eighth of the rest above the minimum stages hinted reads."""
    store = make_store(slots=40, prefetch=prefetch)
    store.finish_loading()
    (pool,) = store.pools
    assert (pool.capacity, pool.staging, pool.window, pool.reserved) == (capacity, staging, 2, 7)
    assert store.stats().capacity_bytes == 40 * pool.slab.slot_bytes
    assert pool.policy.half_life == HALF_LIFE_STEPS * TINY_MOE_LAYERS
    assert store.layers[0].prefetches is prefetch
    store.layers[0].prefetch(mx.array([[5, 6]]))
    assert store.stats().prefetched == (2 if prefetch else 0)
    store.close()


def test_resident_bytes_count_every_filled_slot_key_zero_included(store):
    list(store.layers[0].batches(mx.array([[0]])))  # key 0: layer 0's expert 0
    stats = store.stats()
    (pool,) = store.pools
    assert stats.resident_bytes == pool.slab.slot_bytes
    assert (stats.misses, stats.hits, stats.routing_steps) == (1, 0, 1)


def test_the_saved_hotlist_names_the_model_format_version_and_rounded_hotness(store, tmp_path):
    list(store.layers[0].batches(mx.array([[0, 1], [0, 3]])))
    store.pools[0].policy.tick()  # one step later: hotness decayed off round numbers
    decay = 2 ** (-1 / (HALF_LIFE_STEPS * TINY_MOE_LAYERS))
    path = tmp_path / "hot.json"
    assert store.save_hotlist(path) == 3
    assert json.loads(path.read_text()) == {
        "format": HOTLIST_FORMAT,
        "version": 1,
        "model": TINY.name,
        "experts": [
            {"layer": "blk.0", "expert": 0, "hotness": round(2 * decay, 6)},
            {"layer": "blk.0", "expert": 1, "hotness": round(decay, 6)},
            {"layer": "blk.0", "expert": 3, "hotness": round(decay, 6)},
        ],
    }


def write_hotlist(path, experts) -> None:
    path.write_text(json.dumps({"format": HOTLIST_FORMAT, "experts": experts}))


def test_warm_loads_add_up_and_an_empty_hotlist_reads_nothing(store, tmp_path):
    path = tmp_path / "hot.json"
    write_hotlist(path, [])
    assert store.load_hotlist(path) == 0
    write_hotlist(path, [{"layer": "blk.2", "expert": e, "hotness": 1.0} for e in (1, 4)])
    assert store.load_hotlist(path) == 2
    assert store.load_hotlist(path) == 0  # already cached
    assert store.stats().warm_loaded == 2


@pytest.mark.parametrize("experts", [{}, "blk.0", None])
def test_a_hotlist_whose_experts_are_not_a_list_is_refused(store, tmp_path, experts):
    path = tmp_path / "hot.json"
    write_hotlist(path, experts)
    with pytest.raises(ValueError, match="'experts' must be a list"):
        store.load_hotlist(path)


@pytest.mark.parametrize("expert", [1.0, "1"])
def test_a_hotlist_expert_must_be_an_integer(store, tmp_path, expert):
    path = tmp_path / "hot.json"
    write_hotlist(path, [{"layer": "blk.0", "expert": expert, "hotness": 1.0}])
    with pytest.raises(ValueError, match="out of range"):
        store.load_hotlist(path)


class _Read:
    def __init__(self, finished: bool):
        self.finished = finished

    def done(self) -> bool:
        return self.finished


def test_staged_reads_are_those_in_flight_and_the_unwanted_still_running():
    pool = _Pool([], inflight={3: _Read(False)}, draining=[_Read(True), _Read(True), _Read(False)])
    assert pool.staged() == 2
    assert len(pool.draining) == 1


def test_packed_experts_decoded_for_the_twins_come_in_batches_of_bounded_bytes(monkeypatch):
    monkeypatch.setattr(streamed_module, "PACKED_KERNELS", "twins")
    monkeypatch.setattr(streamed_module, "cpu_keeps_blocks", lambda: False)
    packed = (SimpleNamespace(kind="packed"), SimpleNamespace(kind="dense"))
    layer = SimpleNamespace(tensors=[SimpleNamespace(expert_shape=(256, 1024))] * 3)
    decoded = 3 * 4 * 256 * 1024  # float32 gate, up and down
    assert streamed_module._decode_batch(packed, layer) == TWIN_BATCH_BYTES // decoded
    dense = (SimpleNamespace(kind="dense"),) * 3
    assert streamed_module._decode_batch(dense, layer) is None
    huge = SimpleNamespace(tensors=[SimpleNamespace(expert_shape=(2**16, 2**16))] * 3)
    assert streamed_module._decode_batch(packed, huge) == 1
    monkeypatch.setattr(streamed_module, "cpu_keeps_blocks", lambda: True)
    assert streamed_module._decode_batch(packed, layer) is None


def test_dropping_the_page_cache_is_the_readers(store, monkeypatch):
    monkeypatch.setattr(store.reader, "drop_page_cache", lambda: "dropped")
    assert store.drop_page_cache() == "dropped"
