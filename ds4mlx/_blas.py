"""Load an optimised BLAS before ``mlx.core`` so the CPU backend's fp32 GEMM uses it.

The Linux ``mlx[cpu]`` wheel links a reference BLAS (~6 GFLOPS on our machines); preloading
OpenBLAS with ``RTLD_GLOBAL`` makes MLX resolve ``sgemm`` from it instead (10-30x faster).
This module is the documented exception to "flags are parsed once": it reads ``DS4MLX_BLAS``
at import, because the choice must be made before MLX is loaded.

OpenBLAS's idle threads spin for about 2^28 cycles after each call by default. Between the small
GEMMs of decode they never sleep and take the cores that the streamed expert store's reader
threads (and the server's, the agent's) need. Measured here: 1.9x the CPU time of decode for
the same speed, and expert conversions 1.6x slower in wall time than in CPU time. A 2^14-cycle
spin (``OPENBLAS_THREAD_TIMEOUT``, unless the user sets it) costs prefill nothing measurable.
"""

from __future__ import annotations

import ctypes
import os
import sys

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)

loaded_blas: str | None = None


def load_optimised_blas() -> str | None:
    """Preload a BLAS on Linux; returns its path, or None (with a one-line notice) if none."""
    global loaded_blas
    if not sys.platform.startswith("linux"):
        return None  # macOS MLX uses Accelerate/Metal already.
    choice = os.environ.get("DS4MLX_BLAS", "").strip()
    if choice.lower() == "none":
        return None
    if "mlx.core" in sys.modules:
        print("ds4mlx: mlx was imported before ds4mlx; cannot preload an optimised BLAS",
              file=sys.stderr)
        return None
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "14")  # read when the library loads
    paths = (choice,) if choice else _CANDIDATES
    for path in paths:
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, os.RTLD_GLOBAL)
            except OSError as exc:
                print(f"ds4mlx: could not load BLAS {path}: {exc}", file=sys.stderr)
                continue
            loaded_blas = path
            return path
    if choice:
        print(f"ds4mlx: DS4MLX_BLAS={choice} not found; using MLX's bundled BLAS (slow)",
              file=sys.stderr)
    else:
        print("ds4mlx: no optimised BLAS found (apt-get install libopenblas0-pthread); "
              "CPU matmuls will be slow", file=sys.stderr)
    return None
