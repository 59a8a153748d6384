"""Routed-expert stores: resident, or streamed from the GGUF through a bounded slab cache."""

from ds4mlx.experts.options import ExpertOptions, parse_cache_budget
from ds4mlx.experts.policy import SlotPolicy
from ds4mlx.experts.reader import ExpertReader, ExpertTensor
from ds4mlx.experts.store import (
    ExpertBatch,
    ExpertStats,
    ExpertStore,
    LayerExperts,
    ResidentLayer,
    ResidentStore,
    StreamedStore,
    open_expert_store,
)

__all__ = [
    "ExpertBatch",
    "ExpertOptions",
    "ExpertReader",
    "ExpertStats",
    "ExpertStore",
    "ExpertTensor",
    "LayerExperts",
    "ResidentLayer",
    "ResidentStore",
    "SlotPolicy",
    "StreamedStore",
    "open_expert_store",
    "parse_cache_budget",
]
