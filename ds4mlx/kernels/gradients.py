"""Derivatives for fused operations: a kernel computes the values, its twin the gradient.

Metal kernels and native CPU primitives have no automatic derivative, and training runs through
the same functions as inference; each has a pure-MLX twin with the same semantics, so the twin's
vector-Jacobian product is the fused operation's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx


def _as_list(values: mx.array | Sequence[mx.array]) -> list[mx.array]:
    return [values] if isinstance(values, mx.array) else list(values)


def with_twin_gradient(
    kernel_call: Callable[..., object],
    twin_call: Callable[..., object],
    constants: tuple[int, ...] = (),
) -> Callable[..., object]:
    """``kernel_call`` for values, differentiated through ``twin_call``; either may return one
    array or a tuple of them. The inputs at positions ``constants`` (integer ranges and indices)
    get zero cotangents."""
    function = mx.custom_function(kernel_call)

    @function.vjp
    def _vjp(primals, cotangents, _outputs):
        # MLX passes a lone primal (and cotangent) as itself and expects its cotangent likewise.
        lone = isinstance(primals, mx.array)
        primals = _as_list(primals)
        varying = [i for i in range(len(primals)) if i not in constants]

        def twin_of_varying(*values: mx.array) -> list[mx.array]:
            full = list(primals)
            for i, value in zip(varying, values, strict=True):
                full[i] = value
            return _as_list(twin_call(*full))

        grads = iter(
            mx.vjp(twin_of_varying, [primals[i] for i in varying], _as_list(cotangents))[1]
        )
        result = tuple(
            mx.zeros_like(p) if i in constants else next(grads) for i, p in enumerate(primals)
        )
        return result[0] if lone else result

    return function
