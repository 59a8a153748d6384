"""What a face needs for ``--distributed``: joining the rank group (``init_group``, a
``RankGroup``, ``DistributedError`` when the process was not started by mlx.launch), and, under
a server or an agent whose input reaches rank 0 alone, rank 0 leading (``lead``, a
``Conductor``) and the other ranks following (``Follower``) its model operations.

A module of its own rather than names in the package's ``__init__``, so that only a face that
runs distributed imports ``ds4mlx.distributed``.
"""

from ds4mlx.distributed.driven import Conductor, Follower, lead
from ds4mlx.distributed.group import DistributedError, RankGroup, init_group

__all__ = ["Conductor", "DistributedError", "Follower", "RankGroup", "init_group", "lead"]
