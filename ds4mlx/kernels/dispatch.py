"""Which body of a fused operation runs: the native CPU operation (``kernels.native``), a Metal
kernel (``kernels.metal``) or the MLX twin (``kernels.twins``), and whether inference-only code
runs (``inference``). Every operation module of the package asks here, so that one swap of
``backend`` (``diagnostics.metal_graph``) makes this machine build a Mac's graph.

``DS4MLX_KERNELS=metal|mlx|auto`` (default auto: Metal where available) picks the packed-weight
implementation; like the BLAS switch it is read once, at import.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import ModuleType

from ds4mlx.kernels import metal, twins
from ds4mlx.kernels.native import native_ops

import mlx.core as mx

KERNEL_CHOICES = ("auto", "metal", "mlx")


def select_kernel_backend(choice: str, metal_is_available: bool) -> str:
    """'metal' or 'mlx' for a DS4MLX_KERNELS value; raises ValueError for an unusable choice."""
    choice = choice.strip().lower() or "auto"
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"DS4MLX_KERNELS={choice!r}: expected one of {', '.join(KERNEL_CHOICES)}")
    if choice == "metal" and not metal_is_available:
        raise ValueError("DS4MLX_KERNELS=metal, but Metal is not available on this machine")
    if choice == "auto":
        return "metal" if metal_is_available else "mlx"
    return choice


PACKED_KERNELS = select_kernel_backend(
    os.environ.get("DS4MLX_KERNELS", "auto"), metal.metal_available()
)


#: The packed-weight kernels' module: ``metal`` or the MLX ``twins`` (Macs' graph on another
#: machine: ``diagnostics.metal_graph`` swaps it).
backend: ModuleType = metal if PACKED_KERNELS == "metal" else twins


# Set while inference-only code runs (``inference``): no gradient will be asked for, so the
# native primitives are called bare, without the wrapper that differentiates them through their
# twins (a CustomTransforms primitive more on every call).
_INFERENCE: ContextVar[bool] = ContextVar("ds4mlx_kernels_inference", default=False)


@contextmanager
def inference() -> Iterator[None]:
    """Within this block no gradient is taken of what the kernels compute (decode tiles, which
    by contract only inference runs: ``models.tiles``)."""
    token = _INFERENCE.set(True)
    try:
        yield
    finally:
        _INFERENCE.reset(token)


#: Whether inference-only code is running (``inference``): the context variable's own getter,
#: called on every kernel dispatch of a decode step, so no wrapper frame on top of it.
in_inference: Callable[[], bool] = _INFERENCE.get


def native_cpu_ops() -> ModuleType | None:
    """The native CPU operations when computing on the CPU (``kernels.native``)."""
    if mx.default_device() != mx.cpu:
        return None
    return native_ops()


def metal_kernels() -> bool:
    """Whether the fused Metal kernels run: Metal is the packed-weight backend (``PACKED_KERNELS``)
    and the default device is the GPU."""
    return backend is metal and mx.default_device() != mx.cpu


def inference_ops() -> ModuleType | None:
    """The native CPU operations where inference-only ones may run (``inference``)."""
    return native_cpu_ops() if in_inference() else None


def row_count(rows: int | None) -> int:
    """A native operation's real-row count: -1 for every row."""
    return -1 if rows is None else rows
