"""The rank group (``mx.distributed``) and the checks every rank runs before sharing work.

MLX's collectives have no timeout: a rank that waits for a dead peer would wait forever, unless
the transport notices. The ring backend runs over TCP, so a peer that exits closes its sockets
and the survivors' collective fails. ``mlx.launch`` then reports the dead rank and stops the
others. A rank that hangs without exiting is not detected; ``watchdog`` turns that into an
error message and an exit after a bound the caller chooses.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import numpy as np

# Bytes hashed from the start and from the end of a model file for its fingerprint: the header
# (metadata, tensor table) and the last tensors; with the size this tells different files apart
# without reading gigabytes on every rank.
_FINGERPRINT_SPAN = 1 << 20


class DistributedError(RuntimeError):
    """The ranks cannot work together (no group, different model files, ...)."""


class RankGroup:
    """This process's place in the group: the MLX group, its rank and the world size."""

    def __init__(self, group: mx.distributed.Group):
        self.group = group
        # Bytes this rank has handed to all_sum (the payload; a ring all-reduce puts
        # 2 (size - 1) / size times that on each rank's link): the bench's traffic model.
        self.summed_bytes = 0

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def all_sum(self, x: mx.array) -> mx.array:
        """The elementwise sum of ``x`` over the ranks (the same bits on every rank)."""
        if self.size == 1:
            return x
        self.summed_bytes += x.nbytes
        return mx.distributed.all_sum(x, group=self.group)

    def share_ints(self, values: Sequence[int] | np.ndarray | None, n: int) -> np.ndarray:
        """Rank 0's ``n`` int32 ``values`` on every rank (the other ranks pass None and add
        zeros to the sum)."""
        if self.rank == 0:
            if values is None or len(values) != n:
                raise ValueError(f"rank 0 shares exactly {n} values")
            x = mx.array(np.asarray(values, np.int32))
        else:
            x = mx.zeros((n,), mx.int32)
        return np.array(self.all_sum(x))

    def all_gather_rows(self, row: np.ndarray) -> np.ndarray:
        """Every rank's ``row`` (1-D, same length on all ranks), stacked by rank: [size, n]."""
        x = mx.array(row)[None]
        if self.size > 1:
            x = mx.distributed.all_gather(x, group=self.group)
        return np.array(x)


def init_group(backend: str = "any") -> RankGroup:
    """Joins the group ``mlx.launch`` set up; raises DistributedError when there is none
    (the process was started without ``mlx.launch``, or the backend is unavailable)."""
    if not mx.distributed.is_available():
        raise DistributedError("this MLX build has no distributed backend")
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as exc:
        raise DistributedError(
            f"no distributed group ({exc}); start every rank with mlx.launch, e.g. "
            f"'mlx.launch --backend ring -n 2 --hosts 127.0.0.1 -- ds4 --distributed ...'"
        ) from None
    return RankGroup(group)


def model_fingerprint(path: str | Path) -> np.ndarray:
    """A 256-bit fingerprint of a model file as uint32 [8]: its size and a SHA-256 of its first
    and last MiB."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(size.to_bytes(8, "little"))
    with path.open("rb") as f:
        digest.update(f.read(_FINGERPRINT_SPAN))
        f.seek(max(0, size - _FINGERPRINT_SPAN))
        digest.update(f.read(_FINGERPRINT_SPAN))
    return np.frombuffer(digest.digest(), dtype=np.uint32).copy()


def check_same_model(ranks: RankGroup, path: str | Path) -> None:
    """Raises DistributedError on every rank unless all ranks opened the same model file (by
    fingerprint: the same path may hold different files on different machines)."""
    prints = ranks.all_gather_rows(model_fingerprint(path))
    differ = [r for r in range(ranks.size) if not np.array_equal(prints[r], prints[0])]
    if differ:
        raise DistributedError(
            f"ranks {differ} opened a different model file than rank 0 (this rank, "
            f"{ranks.rank}, has {Path(path)}); copy the same GGUF to every machine"
        )


def watchdog(seconds: float, what: str) -> threading.Event:
    """Starts a timer that prints a message and ends the process unless the returned event is
    set within ``seconds``: bounds a collective on a peer that hangs without exiting."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            sys.stderr.write(
                f"ds4: distributed: {what} did not finish in {seconds:.0f}s "
                f"(a rank is stuck or gone); exiting\n"
            )
            sys.stderr.flush()
            os._exit(3)

    threading.Thread(target=watch, daemon=True, name="ds4-watchdog").start()
    return done
