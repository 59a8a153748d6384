"""Load an optimised BLAS before ``mlx.core`` so the CPU backend's fp32 GEMM uses it.

The Linux ``mlx[cpu]`` wheel links a reference BLAS (~1-6 GFLOPS on our machines); preloading
an optimised one with ``RTLD_GLOBAL`` makes MLX resolve ``cblas_sgemm`` (and LAPACK's
``sgetrf_``...) from it instead, 10-40x faster. Where it comes from, first found first:
``DS4MLX_BLAS`` (a path), the system's OpenBLAS (``apt-get install libopenblas0-pthread``),
then a PyPI wheel that ships the unprefixed symbols: ``mkl`` (``pip install 'ds4mlx[blas]'``,
x86_64) or ``cmeel-openblas`` (which also needs the system's ``libgfortran.so.5``).
``scipy-openblas32/64`` cannot serve: their symbols are prefixed (``scipy_cblas_sgemm``), and
MLX calls the plain names.

This module is the documented exception to "flags are parsed once": it reads ``DS4MLX_BLAS``
at import, because the choice must be made before MLX is loaded. What it has to say (no fast
BLAS, a path that would not load) waits for ``report_blas()``, which a model load calls: once
per process, and only when the model runs on the CPU, never on ``--help`` or a bare import.

Idle BLAS threads spin after each call by default: OpenBLAS for about 2^28 cycles, MKL's
OpenMP runtime for 200 ms. Between the small GEMMs of decode they never sleep and take the cores
that the streamed expert store's reader threads (and the server's, the agent's) need. Measured
here: 1.9x the CPU time of decode for the same speed, and expert conversions 1.6x slower in
wall time than in CPU time. A 2^14-cycle spin (``OPENBLAS_THREAD_TIMEOUT``) and no OpenMP spin
(``KMP_BLOCKTIME=0``), unless the user sets them, cost prefill nothing measurable.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import platform
import sys
from collections.abc import Iterator

_SYSTEM = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)
#: PyPI distributions whose library exports the plain CBLAS/LAPACK names MLX calls, and the
#: library's file name up to its version suffix.
_WHEELS = (("mkl", "libmkl_rt.so"), ("cmeel-openblas", "libopenblas.so"))

loaded_blas: str | None = None
_pending_notice: str | None = None


def _wheel_libraries() -> Iterator[str]:
    """The libraries of the installed BLAS wheels, as files on disk."""
    from importlib import metadata

    for distribution, stem in _WHEELS:
        try:
            files = metadata.files(distribution) or []
        except metadata.PackageNotFoundError:
            continue
        for file in files:
            if file.name.startswith(stem):
                yield str(file.locate().resolve())
                break


def _missing_notice() -> str:
    wheel = "pip install 'ds4mlx[blas]' or " if platform.machine() in ("x86_64", "AMD64") else ""
    return (
        f"ds4mlx: no optimised BLAS found ({wheel}apt-get install libopenblas0-pthread); "
        "CPU matmuls will be slow"
    )


def load_optimised_blas() -> str | None:
    """Preload a BLAS on Linux; returns its path, or None (with a notice for ``report_blas``)
    if none could be loaded."""
    global loaded_blas, _pending_notice
    if not sys.platform.startswith("linux"):
        return None  # macOS MLX uses Accelerate/Metal already.
    choice = os.environ.get("DS4MLX_BLAS", "").strip()
    if choice.lower() == "none":
        return None
    if "mlx.core" in sys.modules:
        _pending_notice = "ds4mlx: mlx was imported before ds4mlx; cannot preload an optimised BLAS"
        return None
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "14")  # read when the library loads
    failures = []
    # Lazily: the wheels are looked up (importlib.metadata, ~50 ms) only without a system BLAS.
    paths = (choice,) if choice else itertools.chain(_SYSTEM, _wheel_libraries())
    for path in paths:
        if not os.path.exists(path):
            continue
        if "mkl" in os.path.basename(path):
            os.environ.setdefault("KMP_BLOCKTIME", "0")  # read when its OpenMP runtime loads
        try:
            ctypes.CDLL(path, os.RTLD_GLOBAL)
        except OSError as exc:
            failures.append(f"ds4mlx: could not load BLAS {path}: {exc}")
            continue
        loaded_blas = path
        return path
    if choice:
        _pending_notice = (
            failures[0]
            if failures
            else (f"ds4mlx: DS4MLX_BLAS={choice} not found; using MLX's bundled BLAS (slow)")
        )
    else:
        _pending_notice = "\n".join([*failures, _missing_notice()])
    return None


def report_blas() -> None:
    """Print what the BLAS preload had to say, if anything: once per process, and only when
    MLX computes on the CPU (a GPU backend does not use this BLAS for its matmuls)."""
    global _pending_notice
    if _pending_notice is None:
        return
    import mlx.core as mx

    if mx.default_device().type != mx.DeviceType.cpu:
        return
    print(_pending_notice, file=sys.stderr, flush=True)
    _pending_notice = None
