"""The one-line machine description every benchmark prints above its numbers."""

from __future__ import annotations

import os
import platform
import resource
import sys

from ds4mlx import _blas
from ds4mlx.experts.options import proc_kib_bytes

import mlx.core as mx


def machine_description() -> str:
    return (f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, mlx {mx.__version__} ({mx.default_device()}), "
            f"BLAS {_blas.loaded_blas}")


def peak_rss_bytes() -> int:
    """This process's peak RSS. Linux: VmHWM, because ``ru_maxrss`` survives execve, so a child
    that a large process starts would report its parent's peak (the full ``ds4 bench`` showed
    its own 459 MiB for every experts run). Elsewhere ``ru_maxrss`` (bytes on macOS)."""
    peak = proc_kib_bytes("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
