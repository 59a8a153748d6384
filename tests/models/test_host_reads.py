"""Host reads per decode step: a step the device can run ahead of the host reads nothing but
the sampled token, and with streamed experts the routing of each MoE layer (the store needs the
expert ids on the host to find or read their slots). Counted on the CPU and in the Mac's
configuration (``diagnostics.metal_graph``)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import ds4mlx
from ds4mlx.diagnostics.host_reads import counting_host_reads
from ds4mlx.diagnostics.metal_graph import metal_configuration
from ds4mlx.experts import ExpertOptions
from ds4mlx.models.moe import moe_layers

import mlx.core as mx
import numpy as np
import pytest

DS4_TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
PROMPT = [(i * 7919 + 13) % 6144 for i in range(40)]


def test_counter_sees_each_kind_of_read_and_not_queued_work():
    x = mx.arange(3)
    with counting_host_reads() as reads:
        mx.async_eval(x + 1)
        mx.eval(x)
        x[0].item()
        x.tolist()
        int(x[1])
        np.array(x)
        np.array([1, 2])  # not an MLX array: no read
    assert reads == {
        "mx.eval": 1,
        "array.item": 1,
        "array.tolist": 1,
        "array.__int__": 1,
        "np.array": 1,
    }
    x.tolist()  # after the block: the originals are back, counting nothing
    assert sum(reads.values()) == 5


def _step_reads(model, session, token: mx.array) -> tuple[dict[str, int], mx.array]:
    """One queued decode step (as ``generate`` pipelines them) and the read of its sampled
    token, counted."""
    with counting_host_reads() as reads:
        logits = session.feed_lazy(token)
        token = mx.argmax(logits[-1:], axis=-1).astype(mx.int32)
        token.item()
    return dict(reads), token


@pytest.mark.parametrize("backend", ["cpu", "metal"])
@pytest.mark.parametrize("stream", [False, True], ids=["resident", "streamed"])
def test_decode_step_reads_only_the_token_and_streamed_routings(backend, stream):
    experts = ExpertOptions(stream=True, cache_gib=1.0) if stream else None
    with metal_configuration() if backend == "metal" else nullcontext():
        model = ds4mlx.load_model(
            DS4_TINY, weights_dtype="native" if backend == "metal" else "auto", experts=experts
        )
        try:
            session = model.new_session()
            session.feed(PROMPT)
            token = mx.array([5], dtype=mx.int32)
            # Traces the compiled tiles; then a step whose experts are all cached (a miss reads
            # and writes slots, which evaluates the slab: not a step's steady state).
            for _ in range(2):
                _, token = _step_reads(model, session, token)
            misses = model.expert_stats().misses
            reads, token = _step_reads(model, session, token)
            assert model.expert_stats().misses == misses
        finally:
            model.close()
    n_moe = len(moe_layers(model.network, len(model.network.blocks)))
    assert n_moe == 6
    expected = {"array.item": 1}
    if stream:
        expected["np.array"] = n_moe
    assert reads == expected
