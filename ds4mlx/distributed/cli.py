"""What a command-line front end does with ``--distributed``: join the group, keep every rank's
sampling in step, and let rank 0 alone write the output."""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import replace

from ds4mlx.distributed.group import RankGroup, init_group
from ds4mlx.engine.sampling import SamplingOptions

import mlx.core as mx


def shared_seed(ranks: RankGroup, seed: int | None) -> int:
    """``seed`` or, without one, a seed rank 0 draws, the same on every rank: ranks that sampled
    differently would feed different tokens into the same collectives and compute garbage."""
    if seed is not None:
        return seed
    mine = secrets.randbelow(2**31) if ranks.rank == 0 else 0
    return int(ranks.all_sum(mx.array(mine, dtype=mx.int32)).item())


def start_ranks(distributed: bool, sampling: SamplingOptions
                ) -> tuple[RankGroup | None, SamplingOptions]:
    """(the group, the sampling every rank uses) for ``--distributed``; (None, sampling)
    without it. Ranks other than 0 write nothing to stdout from here on (errors still go to
    stderr). Raises DistributedError when the process was not started by mlx.launch."""
    if not distributed:
        return None, sampling
    ranks = init_group()
    sampling = replace(sampling, seed=shared_seed(ranks, sampling.seed))
    if ranks.rank != 0:
        sys.stdout = open(os.devnull, "w")  # for the rest of the process
    return ranks, sampling
