"""Without the Metal kernels or the CPU's block kernels, streamed packed experts (decoded to
float32 before their matmuls, ``kernels.twins``) run in batches of a bounded number of experts,
each batch holding copies of exactly its experts: a prefill routed to many experts must not decode
them all at once (DeepSeek-V4-Flash: 96 MiB an expert in float32), nor one copy per routed pair.
The block kernels compute on the slab's blocks where they lie: one batch, the whole slab, no
copies. Results stay bit-identical to resident either way."""

from __future__ import annotations

import ds4mlx
from ds4mlx.experts import streamed as streamed_store
from ds4mlx.gguf.quants import cpu_keeps_blocks
from ds4mlx.kernels import PACKED_KERNELS

import numpy as np
import pytest
from expert_helpers import TINY, budget_gib, feed_patterns, streamed

pytestmark = pytest.mark.skipif(
    PACKED_KERNELS == "metal", reason="Metal kernels compute packed experts without decoding"
)


def expert_f32_bytes(model) -> int:
    layer = model.experts.layers[0]
    return sum(4 * int(np.prod(t.expert_shape)) for t in layer.tensors)


TOKENS = list(range(3, 60, 3))


@pytest.fixture(scope="module")
def resident_logits() -> list[np.ndarray]:
    return feed_patterns(ds4mlx.load_model(TINY, weights_dtype="native"), TOKENS)


def slab_uses(monkeypatch) -> list[int | None]:
    """Records each batch's slots (None: the whole slab, no copies) as ``_Slab.weights`` hands
    them out."""
    sizes: list[int | None] = []
    weights = streamed_store._Slab.weights

    def spy(slab, slots=None):
        sizes.append(None if slots is None else len(slots))
        return weights(slab, slots)

    monkeypatch.setattr(streamed_store._Slab, "weights", spy)
    return sizes


def test_batches_hold_at_most_the_decode_budget(monkeypatch, resident_logits):
    # The twins' path (no block kernels built): batches of copied slots.
    monkeypatch.setattr(streamed_store, "cpu_keeps_blocks", lambda: False)
    probe = streamed(TINY, budget_gib(TINY, 1.0, "native"), "native")
    per_expert = expert_f32_bytes(probe)
    probe.close()
    monkeypatch.setattr(streamed_store, "TWIN_BATCH_BYTES", 2 * per_expert)
    sizes = slab_uses(monkeypatch)
    model = streamed(TINY, budget_gib(TINY, 1.0, "native"), "native")
    try:
        assert all(pool.decode_batch == 2 for pool in model.experts.pools)
        got = feed_patterns(model, TOKENS)
    finally:
        model.close()
    for i, (a, b) in enumerate(zip(resident_logits, got, strict=True)):
        assert np.array_equal(a, b), f"chunk {i} differs"
    assert sizes and None not in sizes and max(sizes) == 2
    assert len(sizes) > len(TOKENS)  # prefill layers ran in several batches


@pytest.mark.skipif(not cpu_keeps_blocks(), reason="the CPU's block kernels are not built")
def test_block_kernels_use_the_slab_in_place(monkeypatch, resident_logits):
    # A copy of every used slot per batch was an extra ~30 MiB of a streamed prefill's peak
    # (tests/experts/test_rss.py) and split a decode step into several synchronised batches.
    sizes = slab_uses(monkeypatch)
    model = streamed(TINY, budget_gib(TINY, 1.0, "native"), "native")
    try:
        assert all(pool.decode_batch is None for pool in model.experts.pools)
        got = feed_patterns(model, TOKENS)
    finally:
        model.close()
    for i, (a, b) in enumerate(zip(resident_logits, got, strict=True)):
        assert np.array_equal(a, b), f"chunk {i} differs"
    assert sizes and set(sizes) == {None}


def test_dense_experts_use_the_whole_slab():
    # f32 experts go to the fused CPU kernel, which gathers what it needs itself.
    model = streamed(TINY, budget_gib(TINY, 0.5, "f32"), "f32")
    try:
        model.logits([3, 4, 5])
        assert all(pool.decode_batch is None for pool in model.experts.pools)
    finally:
        model.close()
