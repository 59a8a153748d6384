"""A KDA layer's ring of states (``models.kda.KDACache``): a steady decode step writes its new
state into the ring in place and copies none of the states before it; a rollback moves the
newest slot back without copying; the values are those of a cache that never rolled."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx import kernels
from ds4mlx.kernels import twins
from ds4mlx.models.kda import KDA, KDACache, ring_slots
from ds4mlx.models.tiles import uncompiled

import mlx.core as mx
import numpy as np
import pytest

GLM_TINY = Path(__file__).resolve().parents[2] / "assets" / "glm-tiny.gguf"
# GLM-5.3-Flash's KDA layers as assumed here (its shapes are not documented in this project):
# 64 heads of 128 channels, glm's rollback of 7 (a ring of 8 states).
FLASH_HEADS, FLASH_DIM, RING = 64, 128, 8
FIRST = mx.array([0], dtype=mx.int32)


def address(a: mx.array) -> int:
    """Where ``a``'s data lies (the same after a step: the step wrote into it in place)."""
    return np.frombuffer(memoryview(a), dtype=np.uint8).__array_interface__["data"][0]


@pytest.fixture(scope="module")
def glm_tiny():
    return ds4mlx.load_model(GLM_TINY, weights_dtype="native")


def kda_caches(session) -> list[KDACache]:
    return [c for c in session.state.layers if isinstance(c, KDACache)]


def test_a_steady_decode_step_writes_the_ring_in_place(glm_tiny):
    session = glm_tiny.new_session()
    session.feed(list(range(4, 20)))  # a prefill chunk, then steady decode rows
    for token in range(20, 32):
        session.feed([token])
    before = kda_caches(session)
    assert before and all(c.ssm.shape[0] == RING for c in before)
    rings = [address(c.ssm) for c in before]
    newest = [c.newest for c in before]
    del before  # as a decode loop holds only the current caches
    session.feed([32])
    after = kda_caches(session)
    assert [address(c.ssm) for c in after] == rings
    assert [c.newest for c in after] == [(n + 1) % RING for n in newest]


def test_a_rollback_restores_the_state_without_copying(glm_tiny):
    session = glm_tiny.new_session()
    session.feed(list(range(4, 20)))
    for token in range(20, 24):
        session.feed([token])
    was = [np.array(c.state) for c in kda_caches(session)]
    pos = session.state.pos
    session.feed([24, 25, 26])  # a verify tile
    rings = [address(c.ssm) for c in kda_caches(session)]
    glm_tiny.network.truncate(session.state, pos)
    rolled = kda_caches(session)
    assert [address(c.ssm) for c in rolled] == rings
    for state, cache in zip(was, rolled, strict=True):
        np.testing.assert_array_equal(np.array(cache.state), state)


def flash_step_allocates(steps: int = 2) -> int:
    """Peak bytes a steady decode step allocates for one KDA layer of GLM-5.3-Flash's (assumed)
    shape: its tile's arrays and the ring's update, the ring itself made beforehand."""
    heads, dim, inner = FLASH_HEADS, FLASH_DIM, FLASH_HEADS * FLASH_DIM
    weights = kernels.KDAWeights(
        dt_bias=mx.zeros((inner,)),
        a=-mx.ones((heads,)),
        conv=mx.ones((3, inner, 4)) * 0.1,
        norm_weight=mx.ones((dim,)),
        eps=1e-5,
        lower_bound=-5.0,
        keep_rows=3 + RING - 1,
    )
    rows = mx.zeros((3, 3 + RING - 1, inner))
    ring = mx.random.normal((RING, heads, dim, dim)) * 0.01  # a buffer (zeros are broadcast)
    qkv = [mx.random.normal((8, inner)) for _ in range(3)]
    beta, decay, gate = mx.zeros((8, heads)), mx.zeros((8, inner)), mx.zeros((8, inner))
    mx.eval(weights.dt_bias, weights.a, weights.conv, weights.norm_weight, rows, ring, qkv)
    mx.eval(beta, decay, gate)
    current = mx.random.normal((1, heads, dim, dim)) * 0.01
    mx.eval(current)
    cache = KDACache(conv=rows, ssm=ring, newest=RING - 1, depth=RING - 1, current=current)
    del rows, ring, current
    peak = 0
    for _ in range(steps):
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        with kernels.inference():
            _, conv, states = kernels.kda_tile(
                weights, qkv, beta, decay, gate, cache.conv, cache.current, FIRST, 1
            )
        ring = mx.put_along_axis(cache.ssm, ring_slots(cache.newest, 1, RING), states, axis=0)
        cache = cache.advanced(conv, ring, states[-1:], 1)
        del ring, conv, states
        mx.eval(cache.ssm, cache.conv, cache.current)
        peak = max(peak, mx.get_peak_memory() - before)
    return peak


def test_a_flash_shaped_step_allocates_one_new_state_not_the_ring():
    state = FLASH_HEADS * FLASH_DIM * FLASH_DIM * 4  # 4 MiB
    # The new state and the tile's rows; the whole ring (32 MiB) again would be a copy.
    assert flash_step_allocates() < 2 * state


def test_the_twin_computes_what_the_native_body_puts_in_the_ring(glm_tiny, monkeypatch):
    """Each call of the native body, as the model makes it while verify tiles and decode rows
    wrap the ring around more than once (continuing from the state the cache hands it), gives
    the outputs and the states the twin gives for the same inputs. Call by call, not by
    comparing two whole runs' rings: the two bodies' last-bit differences pass through the
    model's top-k choices (experts, attended positions), where a near tie can flip one run's
    choice and not the other's, and such a flip changed a later layer's states by 1.5e-4 on
    an AVX2 machine with the same two bodies."""
    native_tile = kernels.kda_tile
    calls = []

    def recorded(*args):
        outputs = native_tile(*args)
        calls.append((args, outputs))
        return outputs

    monkeypatch.setattr(kernels, "kda_tile", recorded)
    with uncompiled():  # the wrapper sees every call's arrays (a compiled tile replays a trace)
        session = glm_tiny.new_session()
        session.feed(list(range(4, 20)))
        for tile in ([20, 21, 22], [23], [24, 25, 26, 27, 28], [29], [30, 31]):
            session.feed(tile)
    kda_layers = sum(isinstance(b.mixer, KDA) for b in glm_tiny.network.blocks)
    assert len(calls) == 5 * kda_layers  # the prefill runs the chunked path, not the tile
    for args, outputs in calls:
        for native, twin in zip(outputs, twins.kda_tile(*args), strict=True):
            assert native.shape == twin.shape
            np.testing.assert_allclose(np.array(native), np.array(twin), rtol=1e-4, atol=1e-5)
