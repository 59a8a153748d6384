"""The one-line machine description every benchmark prints above its numbers."""

from __future__ import annotations

import os
import platform

from ds4mlx import _blas

import mlx.core as mx


def machine_description() -> str:
    return (
        f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, mlx {mx.__version__} ({mx.default_device()}), "
        f"BLAS {_blas.loaded_blas}"
    )
