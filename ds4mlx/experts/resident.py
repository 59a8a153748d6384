"""The resident expert store: every routed expert loaded as an MLX weight."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ds4mlx.experts.store import ExpertBatch, ExpertStats, ExpertStore, LayerExperts, weight_nbytes
from ds4mlx.kernels import Weight

import mlx.core as mx


class ResidentLayer(LayerExperts):
    """Stacked [E, out, in] weights in memory: one batch, the routing as it is (lazy)."""

    def __init__(self, gate: Weight, up: Weight, down: Weight):
        self.gate, self.up, self.down = gate, up, down

    def batches(self, indices: mx.array) -> Iterator[ExpertBatch]:
        yield ExpertBatch(self.gate, self.up, self.down, indices)


class ResidentStore(ExpertStore):
    def __init__(self) -> None:
        self._bytes = 0

    def layer(
        self, names: tuple[str, str, str], load: Callable[[str], Weight], n_used: int
    ) -> LayerExperts:
        gate, up, down = (load(name) for name in names)
        self._bytes += sum(weight_nbytes(w) for w in (gate, up, down))
        return ResidentLayer(gate, up, down)

    def stats(self) -> ExpertStats:
        return ExpertStats(
            "resident",
            resident_bytes=self._bytes,
            capacity_bytes=self._bytes,
            budget_bytes=self._bytes,
            routed_bytes=self._bytes,
        )
