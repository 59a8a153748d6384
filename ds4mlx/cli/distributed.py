"""What a command-line front end does with ``--distributed``: join the group and let rank 0 alone
write the output. Under ``ds4`` every rank runs the same generation, so their sampling must be in
step; under a server or an agent only rank 0 samples, and the other ranks follow its model calls
(``ds4mlx.generation.ranks``)."""

from __future__ import annotations

import os
import secrets
import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from ds4mlx.generation import GGUFError, SamplingOptions, TokenizerError
from ds4mlx.generation.ranks import DistributedError, RankGroup, init_group

import mlx.core as mx

if TYPE_CHECKING:
    from ds4mlx.cli.options import ModelOptions


def shared_seed(ranks: RankGroup, seed: int | None) -> int:
    """``seed`` or, without one, a seed rank 0 draws, the same on every rank: ranks that sampled
    differently would feed different tokens into the same collectives and compute garbage."""
    if seed is not None:
        return seed
    mine = secrets.randbelow(2**31) if ranks.rank == 0 else 0
    return int(ranks.all_sum(mx.array(mine, dtype=mx.int32)).item())


def join_ranks(distributed: bool) -> RankGroup | None:
    """The group for ``--distributed`` (None without it). Ranks other than 0 write nothing to
    stdout from here on (errors still go to stderr). Raises DistributedError when the process
    was not started by mlx.launch."""
    if not distributed:
        return None
    ranks = init_group()
    if ranks.rank != 0:
        sys.stdout = open(os.devnull, "w")  # for the rest of the process
    return ranks


def start_ranks(
    distributed: bool, sampling: SamplingOptions
) -> tuple[RankGroup | None, SamplingOptions]:
    """``join_ranks`` for a front end whose ranks all run the same generation (``ds4``): also
    the sampling every rank uses, with a shared seed."""
    ranks = join_ranks(distributed)
    if ranks is None:
        return None, sampling
    return ranks, replace(sampling, seed=shared_seed(ranks, sampling.seed))


def follow_rank_0(front_end: str, options: ModelOptions, ranks: RankGroup) -> int:
    """The whole life of a rank other than 0 under a server or an agent (whose input reaches
    rank 0 alone): load this rank's shard, then replay rank 0's model operations until rank 0
    stops. Returns the exit code; messages go to stderr, prefixed by ``front_end``."""
    from ds4mlx.generation.ranks import Follower
    from ds4mlx.loader import load_model

    def log(text: str) -> None:
        print(f"{front_end}: rank {ranks.rank}: {text}", file=sys.stderr, flush=True)

    try:
        model = load_model(
            options.model, weights_dtype=options.weights_dtype, experts=options.experts, ranks=ranks
        )
    except (GGUFError, TokenizerError, OSError, ValueError, DistributedError) as exc:
        log(f"error: {exc}")
        return 1
    # Ctrl-C in the launcher's terminal reaches every rank: rank 0 ends its front end and
    # then stops the followers, which must not quit first (rank 0 would wait on them).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        operations = Follower(model, ranks).run()
    except RuntimeError as exc:  # the ring backend fails a collective when a peer drops
        log(f"error: rank 0 stopped answering ({exc})")
        return 1
    finally:
        model.close()
    log(f"done after {operations} model operations")
    return 0
