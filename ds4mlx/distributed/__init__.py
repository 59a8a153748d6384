"""Tensor and expert parallel inference over ``mx.distributed`` (ranks started by mlx.launch).

See ``plan`` for what each rank holds and ``model`` for how the ranks combine their parts.
"""

from ds4mlx.distributed.group import (
    DistributedError,
    RankGroup,
    check_same_model,
    init_group,
    model_fingerprint,
    watchdog,
)
from ds4mlx.distributed.plan import ShardError, ShardPlan, TensorSlice

__all__ = [
    "DistributedError",
    "RankGroup",
    "ShardError",
    "ShardPlan",
    "TensorSlice",
    "check_same_model",
    "init_group",
    "model_fingerprint",
    "watchdog",
]
