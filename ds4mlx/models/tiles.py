"""Compiled decode-tile functions (see ``models.base.DECODE_TILE``).

A decode or verify tile always has the same shapes, so a function of it traces once per number
of real rows. Compiled, its elementwise chains fuse and later calls replay the graph without
running the Python that built it, which on the CPU is most of a decode step's host time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

from ds4mlx.kernels import inference

import mlx.core as mx

_COMPILING: ContextVar[bool] = ContextVar("ds4mlx_compiling_tiles", default=True)


@contextmanager
def uncompiled() -> Iterator[None]:
    """Within this block tiles run their Python, uncompiled: the same operations, so the same
    values (a profiler attributes primitives to the code that makes them)."""
    token = _COMPILING.set(False)
    try:
        yield
    finally:
        _COMPILING.reset(token)


class CompiledTiles:
    """``mx.compile``d versions of ``tile(..., n_real=n)``, one per real-row count, made on
    first use. Whatever the function reads besides its arguments (the weights) is captured as a
    constant: only inference, which never changes weights, may use tiles (training runs none).
    A plain object, so that the compiled functions stay out of a module's parameter tree."""

    def __init__(self, tile: Callable[..., Any]):
        self.tile = tile
        self.compiled: dict[int, Callable[..., Any]] = {}

    def get(self, n_real: int, compiled: bool = True) -> Callable[..., Any]:
        """The tile of ``n_real`` real rows: compiled unless ``compiled`` is False (inputs
        whose shapes are not steady yet would trace it again and again) or within
        ``uncompiled``."""
        if not compiled or not _COMPILING.get():
            return partial(self._inference_tile, n_real=n_real)
        if n_real not in self.compiled:
            self.compiled[n_real] = mx.compile(partial(self._inference_tile, n_real=n_real))
        return self.compiled[n_real]

    def _inference_tile(self, *args: Any, **kwargs: Any) -> Any:
        # Traced as inference whoever calls first: the compiled graph is kept for every later
        # call, so it must not depend on the caller's context (``kernels.inference``).
        with inference():
            return self.tile(*args, **kwargs)
