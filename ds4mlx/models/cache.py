"""Per-sequence model state: the next position and one immutable cache object per layer.

Layers never mutate a cache: they return a new one built from new arrays (MLX arrays are never
updated in place here). That makes ``ModelState.copy()`` a cheap shallow copy that shares arrays
with the original, which is what Session snapshots rely on.

Caches that grow by rows (``append_rows``) are views of the first rows of a preallocated buffer
that grows geometrically: appending writes the new rows with ``mx.slice_update``, which MLX
does in place when nothing else holds the old buffer (the previous step's cache is gone by the
time the step is evaluated), so a step copies the rows it adds, not the cache's past. Where a
snapshot still holds the old rows, the update copies them first: values never change under a
holder.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

# A row buffer's first size, and how much bigger than its rows it is made when it must grow:
# geometric growth makes the copies of a cache's past O(1) per appended row, amortised.
MIN_CAPACITY = 256
GROWTH = 1.5

# The buffer behind each array ``append_rows`` (or ``keep_rows``) returned, by the id of that
# array; an entry leaves with its array (a weak reference's callback).
_BUFFERS: dict[int, tuple[weakref.ref, mx.array]] = {}


@dataclass
class ModelState:
    """Caches of one sequence; ``forward`` advances it in place (by replacing its fields)."""

    layers: list[Any]
    pos: int = 0

    def copy(self) -> ModelState:
        return ModelState(list(self.layers), self.pos)

    def arrays(self) -> list[mx.array]:
        """Every array the layer caches hold (for evaluating them together)."""
        out: list[mx.array] = []
        for layer in self.layers:
            out.extend(_arrays(layer))
        return out


def append_rows(cached: mx.array | None, new: mx.array, take: int | None = None) -> mx.array:
    """``cached`` followed by ``new[:take]`` (all of ``new`` by default) along axis 0: a view
    of the first rows of a buffer with room to grow (see the module doc). ``cached`` keeps its
    values. All of ``new`` is written, the rows past ``take`` beyond the view (a decode tile's
    padding rows, overwritten by the next append): one primitive fewer than slicing them off."""
    count = 0 if cached is None else cached.shape[0]
    total = count + (new.shape[0] if take is None else take)
    room = count + new.shape[0]
    buffer = None if cached is None else _buffer_of(cached)
    if buffer is None or buffer.shape[0] < room or buffer.dtype != new.dtype:
        capacity = max(MIN_CAPACITY, math.ceil(room * GROWTH))
        buffer = mx.zeros((capacity, *new.shape[1:]), new.dtype)
        if count:
            buffer = _write(buffer, cached.astype(new.dtype), 0)
    return _view(_write(buffer, new, count), total)


def keep_rows(cached: mx.array, count: int) -> mx.array:
    """The first ``count`` rows of a cache (a rollback), still backed by its buffer so that
    appending to them does not copy them."""
    buffer = _buffer_of(cached)
    return cached[:count] if buffer is None else _view(buffer, count)


def _write(buffer: mx.array, rows: mx.array, start: int) -> mx.array:
    return mx.slice_update(buffer, rows, mx.array([start]), axes=(0,))


def _buffer_of(rows: mx.array) -> mx.array | None:
    entry = _BUFFERS.get(id(rows))
    return entry[1] if entry is not None and entry[0]() is rows else None


def _view(buffer: mx.array, count: int) -> mx.array:
    view = buffer[:count]
    key = id(view)
    _BUFFERS[key] = (weakref.ref(view, lambda _: _BUFFERS.pop(key, None)), buffer)
    return view


def _arrays(obj: Any) -> list[mx.array]:
    if obj is None:
        return []
    if isinstance(obj, mx.array):
        return [obj]
    if hasattr(obj, "__dataclass_fields__"):
        out: list[mx.array] = []
        for name in obj.__dataclass_fields__:
            out.extend(_arrays(getattr(obj, name)))
        return out
    return []
