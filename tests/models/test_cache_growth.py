"""Caches that grow by rows (``models.cache.append_rows``): a step writes the rows it adds and
copies none of the cache's past, whatever the context; values never change under a holder."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.models import cache as cache_module
from ds4mlx.models.cache import append_rows, keep_rows

import mlx.core as mx
import numpy as np
import pytest

DS4_TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
WIDTH = 512  # DeepSeek-V4-Flash's compressed rows


def bytes_a_step_allocates(rows: int) -> int:
    """Peak bytes allocated by appending one row to a cache of ``rows`` rows, as a decode step
    does (the previous step's cache dropped before evaluation)."""
    cache = append_rows(None, mx.random.normal((rows, WIDTH)))
    new = mx.ones((1, WIDTH))
    mx.eval(cache, new)
    cache = append_rows(cache, new)  # a cache made by appending has room for more
    mx.eval(cache)
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    cache = append_rows(cache, new)
    mx.eval(cache)
    return mx.get_peak_memory() - before


@pytest.mark.parametrize("rows", [1024, 65536])
def test_a_step_copies_no_past_rows(rows):
    # The new row is 2 KiB; a copy of the past would be 2 MiB at 1k rows, 128 MiB at 64k.
    assert bytes_a_step_allocates(rows) < 4 * WIDTH


def test_copies_do_not_grow_with_context():
    assert bytes_a_step_allocates(65536) == bytes_a_step_allocates(1024)


def test_appended_rows_keep_their_values_under_every_holder():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((n, 8)).astype(np.float32) for n in (3, 1, 300, 2)]
    cache, held = None, []
    for part in parts:
        cache = append_rows(cache, mx.array(part))
        held.append(cache)  # snapshots hold every step's cache
    mx.eval(*held)
    for i, snapshot in enumerate(held):
        np.testing.assert_array_equal(np.array(snapshot), np.concatenate(parts[: i + 1]))
    # A rollback stays backed by the buffer, and appending to it leaves the longer cache as it
    # was (the buffer is shared: that update copies, a holder never sees it).
    rolled = keep_rows(cache, 2)
    assert cache_module._buffer_of(rolled) is cache_module._buffer_of(cache)
    other = append_rows(rolled, mx.full((1, 8), 7.0))
    np.testing.assert_array_equal(np.array(cache), np.concatenate(parts))
    np.testing.assert_array_equal(np.array(other)[2], np.full(8, 7.0))
    np.testing.assert_array_equal(np.array(other)[:2], parts[0][:2])
    assert other.shape == (3, 8)


def test_decode_keeps_compressed_caches_in_growing_buffers():
    model = ds4mlx.load_model(DS4_TINY)
    session = model.new_session()
    session.feed([(i * 7919 + 13) % 6144 for i in range(300)])
    for token in (5, 6, 7, 8):
        session.feed([token])
    layers = [c for c in session.state.layers if c.comp is not None]
    assert layers
    for layer in layers:
        assert cache_module._buffer_of(layer.comp) is not None
        assert cache_module._buffer_of(layer.comp).shape[0] > layer.comp.shape[0]
    model.network.truncate(session.state, session.state.pos - 3)
    for layer in session.state.layers:
        if layer.comp is not None:
            assert cache_module._buffer_of(layer.comp) is not None
