"""A decode step's graph as a Mac builds it, counted on any machine (``bench_graph --backend
metal``).

On Apple silicon the default device is the GPU: the native CPU operations are off
(``kernels.dispatch.native_cpu_ops`` answers None), packed weights take the Metal kernels,
attention takes ``mx.fast.scaled_dot_product_attention``, and the ``mx.fast`` operations are
one GPU primitive each, where the CPU runs a composed fallback of several.
``metal_configuration`` makes this process build exactly that graph: the model code is
unchanged; only the device it is told it runs on, the packed-weight backend, and the primitives
MLX has no CPU counterpart for are replaced.

Each ``mx.fast.metal_kernel`` call, and each ``mx.fast`` operation and ``mx.dequantize``, becomes
one stand-in primitive (a ``Depends`` of zeros of the real output's shape and dtype on the call's
inputs): one dispatch, as on the GPU. The values are zeros, so only the graph means anything;
this is a measuring tool, never a runtime path. Every kernel call is recorded (``KernelCall``)
so that tests can check the stand-ins receive what the Metal path sends.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ds4mlx import kernels
from ds4mlx.gguf import quants
from ds4mlx.kernels import dispatch, metal, native

import mlx.core as mx
import numpy as np

#: Primitives that only change how an array is viewed: on Metal none is a kernel dispatch
#: (a reshape of a non-contiguous array does copy; counted as a view all the same).
VIEW_PRIMITIVES = frozenset(
    {
        "AsStrided",
        "Broadcast",
        "ExpandDims",
        "Flatten",
        "Reshape",
        "Slice",
        "Split",
        "Squeeze",
        "StopGradient",
        "Transpose",
        "Unflatten",
    }
)

#: The MLX operations that are one primitive on a GPU stream and a composed fallback on the CPU.
FAST_OPERATIONS = (
    (mx.fast, "rms_norm"),
    (mx.fast, "layer_norm"),
    (mx.fast, "rope"),
    (mx.fast, "scaled_dot_product_attention"),
    (mx, "dequantize"),
)


def dispatches(names: Sequence[str]) -> int:
    """How many of the primitives ``names`` are kernel dispatches on Metal (not views)."""
    return sum(name not in VIEW_PRIMITIVES for name in names)


@dataclass(frozen=True)
class KernelCall:
    """One call of an ``mx.fast.metal_kernel``: what the Metal path launches."""

    name: str
    template: tuple[tuple[str, Any], ...]
    inputs: tuple[tuple[tuple[int, ...], mx.Dtype], ...]
    outputs: tuple[tuple[tuple[int, ...], mx.Dtype], ...]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]


# Zeros by (shape, dtype): made on the host, so making one is no primitive, even inside a
# compiled function's trace.
_ZEROS: dict[tuple[tuple[int, ...], mx.Dtype], mx.array] = {}


def _zeros(shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    key = (shape, dtype)
    if key not in _ZEROS:
        _ZEROS[key] = mx.array(np.zeros(shape, np.float32), dtype=dtype)
    return _ZEROS[key]


def stand_in(
    inputs: Sequence[Any], shapes: Sequence[Sequence[int]], dtypes: Sequence[mx.Dtype]
) -> list[mx.array]:
    """Arrays of ``shapes`` and ``dtypes`` (zeros) made by one primitive that reads ``inputs``."""
    outputs = [_zeros(tuple(s), d) for s, d in zip(shapes, dtypes, strict=True)]
    arrays = [a for a in inputs if isinstance(a, mx.array)]
    return mx.depends(outputs, arrays) if arrays else outputs


class StandInKernel:
    """What ``mx.fast.metal_kernel(...)`` returns in the Metal configuration: a callable with the
    real kernel's signature that records each call and answers with one stand-in primitive."""

    def __init__(
        self,
        calls: list[KernelCall],
        name: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
        source: str,
        header: str = "",
        **_: Any,
    ):
        if not source:
            raise ValueError(f"kernel {name}: empty source")
        code = "\n".join(line.partition("//")[0] for line in source.splitlines())
        for output in output_names:
            # MLX declares the shape, strides and ndim of inputs only: on a Mac such a name
            # would not compile.
            if re.search(rf"\b{output}_(shape|strides|ndim)\b", code):
                raise ValueError(f"kernel {name}: reads the shape of its output {output}")
        self.calls = calls
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)

    def __call__(self, *, inputs: Sequence[Any], **launch: Any) -> list[mx.array]:
        arrays = self.record(inputs, **launch)
        return stand_in(arrays, launch["output_shapes"], launch["output_dtypes"])

    def record(
        self,
        inputs: Sequence[Any],
        *,
        output_shapes: Sequence[Sequence[int]],
        output_dtypes: Sequence[mx.Dtype],
        grid: tuple[int, int, int],
        threadgroup: tuple[int, int, int],
        template: Sequence[tuple[str, Any]] = (),
        **_: Any,
    ) -> list[mx.array]:
        """Check a call against the kernel's signature and record it; its inputs as arrays."""
        if len(inputs) != len(self.input_names) or len(output_shapes) != len(self.output_names):
            raise ValueError(
                f"kernel {self.name}: {len(inputs)} inputs and {len(output_shapes)} outputs for "
                f"{self.input_names} -> {self.output_names}"
            )
        arrays = [a if isinstance(a, mx.array) else mx.array(a) for a in inputs]
        self.calls.append(
            KernelCall(
                self.name,
                tuple(template),
                tuple((tuple(a.shape), a.dtype) for a in arrays),
                tuple((tuple(s), d) for s, d in zip(output_shapes, output_dtypes, strict=True)),
                tuple(grid),
                tuple(threadgroup),
            )
        )
        return arrays


class RecordingKernel(StandInKernel):
    """A real ``mx.fast.metal_kernel`` (``make`` builds it) whose calls are recorded as
    ``StandInKernel``'s are: what runs on a Mac, seen as the stand-ins see it."""

    def __init__(self, calls: list[KernelCall], make: Callable[..., Any], **spec: Any):
        super().__init__(calls, **spec)
        self.real = make(**spec)

    def __call__(self, *, inputs: Sequence[Any], **launch: Any) -> list[mx.array]:
        self.record(inputs, **launch)
        return self.real(inputs=inputs, **launch)


@contextmanager
def recorded_kernels() -> Iterator[list[KernelCall]]:
    """On a Mac: every Metal kernel runs as it does, and each call is recorded (as
    ``metal_configuration`` records its stand-ins' calls)."""
    calls: list[KernelCall] = []
    real = mx.fast.metal_kernel
    _clear_cached_factories()
    mx.fast.metal_kernel = functools.partial(RecordingKernel, calls, real)
    try:
        yield calls
    finally:
        mx.fast.metal_kernel = real
        _clear_cached_factories()


def _fast_stand_in(real: Callable[..., Any]) -> Callable[..., Any]:
    """``real`` as one stand-in primitive of the same output shapes (read off the lazy result
    of ``real``, which is then dropped unevaluated)."""

    @functools.wraps(real)
    def one_primitive(*args: Any, **kwargs: Any) -> Any:
        shaped = real(*args, **kwargs)
        many = isinstance(shaped, (list, tuple))
        outs = list(shaped) if many else [shaped]
        made = stand_in([*args, *kwargs.values()], [o.shape for o in outs], [o.dtype for o in outs])
        return made if many else made[0]

    return one_primitive


def _clear_cached_factories() -> None:
    """Drop what ds4mlx's cached factories made (compiled functions, kernels): those made in
    one configuration must not serve the other. The native extension stays loaded."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("ds4mlx.") or module is None:
            continue
        for value in list(vars(module).values()):
            clear = getattr(value, "cache_clear", None)
            if callable(clear) and getattr(value, "__module__", None) != native.__name__:
                clear()


@contextmanager
def metal_configuration() -> Iterator[list[KernelCall]]:
    """While active, model code builds the graph a Mac would (see the module doc); yields the
    list that records each Metal kernel call. Load a model inside the block: its compiled tiles
    trace on first use, and a trace made in one configuration is replayed in the other."""
    calls: list[KernelCall] = []
    saved: list[tuple[Any, str, Any]] = []

    def swap(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    _clear_cached_factories()
    try:
        swap(mx, "default_device", lambda: mx.Device(mx.gpu))
        swap(dispatch, "backend", metal)
        swap(kernels, "PACKED_KERNELS", "metal")
        # A Mac loads "native" matrices into MLX's quantized layouts, never the CPU's blocks.
        swap(quants, "cpu_keeps_blocks", lambda: False)
        swap(mx.fast, "metal_kernel", functools.partial(StandInKernel, calls))
        for owner, name in FAST_OPERATIONS:
            swap(owner, name, _fast_stand_in(getattr(owner, name)))
        yield calls
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
        _clear_cached_factories()
