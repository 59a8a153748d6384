"""Expert stores: where a MoE layer's routed experts are when the layer runs.

``ExpertStore.layer`` hands each MoE layer a ``LayerExperts``; for a routing (expert indices
[T, k]) it yields ``ExpertBatch``es: stacked weights plus the index of each (token, expert) pair
into them, which ``models.moe.RoutedExperts`` feeds to the same gathered matmuls whatever the
store. This module is the interface; the two stores are:

- ``experts.resident.ResidentStore``: every expert loaded as an MLX weight; one batch, the
  routing unchanged, no synchronisation (the graph stays lazy and differentiable).
- ``experts.streamed.StreamedStore``: experts stay in the GGUF file and are read on demand into
  a bounded slab cache; results are bit-identical to resident ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

from ds4mlx.kernels import QuantizedWeight, Weight
from ds4mlx.memory import format_size

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class ExpertBatch:
    """Stacked expert weights and, per (token, expert) pair, the matrix index into them.

    ``pairs`` None: every pair, ``indices`` shaped like the routing [T, k]. Else the flat
    positions (token * k + j) of this batch's pairs, ``indices`` [P] (sorted ascending).
    """

    gate: Weight
    up: Weight
    down: Weight
    indices: mx.array
    pairs: np.ndarray | None = None


@dataclass
class ExpertStats:
    """Counters of an expert store. A hit or miss counts once per expert a layer's routing step
    needs (a k-row verify needs each expert once); read GB/s is per read (reads overlap)."""

    kind: str
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    reads: int = 0
    read_seconds: float = 0.0
    evictions: int = 0
    resident_bytes: int = 0  # routed-expert bytes held now (filled slots, or all if resident)
    capacity_bytes: int = 0  # slab + staging allocated (the budget used)
    budget_bytes: int = 0
    routed_bytes: int = 0  # every routed expert, in the form the model computes with
    prefetched: int = 0  # hinted reads started
    prefetch_used: int = 0  # of which a layer then needed
    warm_loaded: int = 0  # experts read by a hot-list warm start
    routing_steps: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 1.0

    @property
    def read_gbps(self) -> float:
        return self.bytes_read / self.read_seconds / 1e9 if self.read_seconds else 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {f.name: getattr(self, f.name) for f in fields(self)}
        return out | {"hit_rate": self.hit_rate, "read_gbps": self.read_gbps}

    def summary(self) -> str:
        if self.kind == "resident":
            return f"experts: resident, {format_size(self.resident_bytes)}"
        return (
            f"experts: streamed, cache {format_size(self.resident_bytes)} of "
            f"{format_size(self.capacity_bytes)} (budget {format_size(self.budget_bytes)}"
            f" of {format_size(self.routed_bytes)} routed) | hits {self.hits}, misses "
            f"{self.misses} ({self.hit_rate:.1%} hit), evictions {self.evictions} | read "
            f"{self.bytes_read / 2**20:.1f} MiB in {self.reads} reads, "
            f"{self.read_gbps:.2f} GB/s | prefetch {self.prefetch_used}/{self.prefetched} "
            f"used | warm {self.warm_loaded}"
        )


class LayerExperts(ABC):
    """One MoE layer's routed experts, as ``RoutedExperts`` uses them."""

    #: whether ``prefetch`` does anything (a resident layer has nothing to read)
    prefetches: bool = False

    @abstractmethod
    def batches(self, indices: mx.array) -> Iterator[ExpertBatch]:
        """The batches covering every pair of the routing ``indices`` [T, k] (int32).

        The store may refill a batch's slots once the next batch is asked for when the batch
        has ``pairs``; ``map_batches`` evaluates each such result first."""

    def map_batches(
        self, indices: mx.array, compute: Callable[[ExpertBatch], mx.array]
    ) -> Iterator[tuple[ExpertBatch, mx.array]]:
        """``compute`` over the batches of the routing ``indices``: each batch with its result.
        A result that reads slots the store may refill is evaluated before the next batch."""
        for batch in self.batches(indices):
            result = compute(batch)
            if batch.pairs is not None:
                mx.eval(result)
            yield batch, result

    def prefetch(self, indices: mx.array) -> None:  # noqa: B027 (optional hook)
        """Hint: ``indices`` will probably be this layer's routing next; start reading."""


class PrefetchHint:
    """Starts reading the experts a layer will probably need next: ``route`` maps a layer's
    input (and token ids, for hash routing) to a guessed routing [T, k], which ``layer`` (a
    store's view of the next MoE layer) is asked to prefetch. The guess is the model's
    business (``models.moe.link_expert_prefetch`` routes through the next layer's router);
    when to read is the store's."""

    def __init__(self, route: Callable[[mx.array, mx.array | None], mx.array], layer: LayerExperts):
        self.route = route
        self.layer = layer

    def __call__(self, x: mx.array, tokens: mx.array | None) -> None:
        self.layer.prefetch(self.route(x, tokens))


class ExpertStore(ABC):
    """Where routed experts live; one per loaded model."""

    @abstractmethod
    def layer(
        self, names: tuple[str, str, str], load: Callable[[str], Weight], n_used: int
    ) -> LayerExperts:
        """The layer whose stacked gate/up/down tensors are ``names`` (already shape-checked);
        ``load`` loads a tensor as a resident weight; ``n_used`` experts route each token."""

    def finish_loading(self) -> None:  # noqa: B027 (optional hook)
        """Every layer is registered: size caches, warm-start."""

    @abstractmethod
    def stats(self) -> ExpertStats: ...

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release files and threads (and save the hot-list where asked)."""


def weight_nbytes(w: Weight) -> int:
    if isinstance(w, mx.array):
        return w.nbytes
    if isinstance(w, QuantizedWeight):
        return sum(a.nbytes for a in (w.packed, w.scales, w.biases) if a is not None)
    return w.data.nbytes
