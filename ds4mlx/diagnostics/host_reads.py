"""Counting the host reads of MLX computation: the points where the host waits for the device.

A decode step the device can run ahead of the host makes none; each read is a sync that stalls
the host until everything the array depends on has run (on a GPU, an idle device meanwhile). While
``counting_host_reads`` is active, each ``mx.eval``, each ``item``/``tolist``/``int``/``float``/
``bool``/``__index__`` of an MLX array and each ``np.array``/``np.asarray`` of one counts as one
read, under the name of the way it was made. ``mx.async_eval`` queues work and is not a read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import numpy as np

_ARRAY_READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")


@contextmanager
def counting_host_reads() -> Iterator[Counter[str]]:
    """Within the block, count host reads by kind (see the module doc)."""
    reads: Counter[str] = Counter()
    saved: list[tuple[Any, str, Any]] = []

    def swap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, make(original))

    def counted(name: str) -> Callable[[Any], Any]:
        def make(original: Any) -> Any:
            def read(*args: Any, **kwargs: Any) -> Any:
                reads[name] += 1
                return original(*args, **kwargs)

            return read

        return make

    def counted_if_mlx(name: str) -> Callable[[Any], Any]:
        def make(original: Any) -> Any:
            def convert(value: Any, *args: Any, **kwargs: Any) -> Any:
                if isinstance(value, mx.array):
                    reads[name] += 1
                return original(value, *args, **kwargs)

            return convert

        return make

    try:
        swap(mx, "eval", counted("mx.eval"))
        for name in _ARRAY_READS:
            swap(mx.array, name, counted(f"array.{name}"))
        swap(np, "array", counted_if_mlx("np.array"))
        swap(np, "asarray", counted_if_mlx("np.asarray"))
        yield reads
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
