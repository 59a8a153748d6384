"""Routed-expert stores: resident, or streamed from the GGUF through a bounded slab cache.

``store`` is the interface the models use, ``resident`` and ``streamed`` the two stores,
``open_expert_store`` picks one from the options.
"""

from __future__ import annotations

from ds4mlx.experts.options import ExpertOptions, parse_cache_budget
from ds4mlx.experts.policy import SlotPolicy
from ds4mlx.experts.reader import ExpertReader, ExpertTensor
from ds4mlx.experts.resident import ResidentLayer, ResidentStore
from ds4mlx.experts.store import (
    ExpertBatch,
    ExpertStats,
    ExpertStore,
    LayerExperts,
    PrefetchHint,
)
from ds4mlx.experts.streamed import StreamedStore
from ds4mlx.gguf import GGUFFile


def open_expert_store(
    gguf: GGUFFile, mode: str | None, options: ExpertOptions | None
) -> ExpertStore:
    """The store ``options`` ask for (resident when None or not streaming)."""
    if options is None or not options.stream:
        return ResidentStore()
    return StreamedStore(gguf, mode, options)


__all__ = [
    "ExpertBatch",
    "ExpertOptions",
    "ExpertReader",
    "ExpertStats",
    "ExpertStore",
    "ExpertTensor",
    "LayerExperts",
    "PrefetchHint",
    "ResidentLayer",
    "ResidentStore",
    "SlotPolicy",
    "StreamedStore",
    "open_expert_store",
    "parse_cache_budget",
]
