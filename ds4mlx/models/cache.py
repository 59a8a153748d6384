"""Per-sequence model state: the next position and one immutable cache object per layer.

Layers never mutate a cache: they return a new one built from new arrays (MLX arrays are never
updated in place here). That makes ``ModelState.copy()`` a cheap shallow copy that shares arrays
with the original, which is what Session snapshots rely on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx


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


def append_rows(cached: mx.array | None, new: mx.array) -> mx.array:
    """``cached`` followed by ``new`` along axis 0 (a new array)."""
    if cached is None or cached.shape[0] == 0:
        return new
    return mx.concatenate([cached, new], axis=0)


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
