"""The failure modes seen in ds4's expert cache: budget exceeded under load (#802), a smaller
cache faster than a larger one (#810), re-reading experts already cached (#629)."""

from __future__ import annotations

import ds4mlx
from ds4mlx.experts import ExpertOptions

import mlx.core as mx
import pytest
from expert_helpers import TINY, budget_gib, routed_info, streamed

TOKENS = list(range(3, 120))


def test_cached_experts_are_not_read_again():
    model = streamed(TINY, budget_gib(TINY, 1.0))
    model.logits(TOKENS)
    first = model.expert_stats()
    model.logits(TOKENS)  # everything fits: the second pass reads nothing
    second = model.expert_stats()
    assert second.bytes_read == first.bytes_read and second.misses == first.misses
    assert second.hits > first.hits
    model.close()


def test_verify_rows_read_each_expert_once():
    # A 7-row verify chunk with no cache to speak of: every expert it needs is read exactly
    # once (not once per row), and each miss is one expert's bytes.
    model = streamed(TINY, budget_gib(TINY, "min"))
    session = model.new_session()
    session.feed(TOKENS[:20])
    before = model.expert_stats()
    session.feed(TOKENS[20:27])
    after = model.expert_stats()
    misses = after.misses - before.misses
    expert_file_bytes = sum(
        t.expert_nbytes for layer in model.experts.layers[:1] for t in layer.tensors
    )
    assert after.bytes_read - before.bytes_read == misses * expert_file_bytes
    assert after.reads - before.reads == 3 * misses  # gate, up, down per expert
    layers, experts, rows, k = 6, 8, 7, 2
    assert 0 < misses <= layers * min(experts, rows * k) < layers * rows * k
    model.close()


def test_budget_holds_under_load():
    # A long prefill needing every expert of every layer through a quarter-size cache: the slab
    # is allocated once and MLX's memory never grows past it plus the rest of the model. In
    # float32 weights, where the experts outweigh the activations this bound allows for (the
    # file's own blocks are 8x smaller than this prefill's activations).
    resident = ds4mlx.load_model(TINY, weights_dtype="f32")
    routed = resident.expert_stats().routed_bytes
    del resident
    mx.synchronize()
    gib = budget_gib(TINY, 0.25, "f32")
    model = streamed(TINY, gib, "f32")
    mx.reset_peak_memory()
    baseline = mx.get_active_memory()
    model.logits(TOKENS)
    model.logits(TOKENS[::-1])
    stats = model.expert_stats()
    assert stats.capacity_bytes <= stats.budget_bytes == int(gib * 2**30)
    assert stats.evictions > 0 and stats.resident_bytes <= stats.capacity_bytes
    growth = mx.get_peak_memory() - baseline
    # The slab is in the baseline; what grows is activations and one expert being written.
    assert growth < 0.25 * routed, growth
    model.close()


@pytest.mark.parametrize("pattern", ["decode", "prefill"])
def test_larger_cache_never_reads_more(pattern):
    reads = []
    for share in ("min", 0.25, 0.5, 1.0):
        model = streamed(TINY, budget_gib(TINY, share), prefetch=False)
        session = model.new_session()
        if pattern == "prefill":
            session.feed(TOKENS[:60])
            session.feed(TOKENS[60:])
        else:
            session.feed(TOKENS[:10])
            for t in TOKENS[10:40]:
                session.feed([t])
        reads.append(model.expert_stats().bytes_read)
        model.close()
    assert reads == sorted(reads, reverse=True), reads


def test_budget_below_minimum_is_a_clear_error():
    routed, per_expert, n_used = routed_info(TINY)
    with pytest.raises(ValueError, match="below the minimum"):
        streamed(TINY, per_expert * n_used / 2 / 2**30)
    with pytest.raises(ValueError, match="positive"):
        ExpertOptions(stream=True, cache_gib=0)
