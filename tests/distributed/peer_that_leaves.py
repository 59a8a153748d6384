"""Rank 1 of a ``ds4 --distributed`` group that takes part in the start-up collectives (seed,
model fingerprint) and then exits, as a crashed machine would: the test checks that rank 0
reports it instead of hanging."""

from __future__ import annotations

import os
import sys

from ds4mlx.cli.distributed import shared_seed
from ds4mlx.distributed import check_same_model, init_group

ranks = init_group("ring")
shared_seed(ranks, None)
check_same_model(ranks, sys.argv[1])
os._exit(0)  # no clean shutdown of the group: the sockets just close
