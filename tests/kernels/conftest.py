"""Import ds4mlx before any test module imports mlx.core, so its BLAS preload takes effect;
the native CPU operations as a fixture."""

import os
import shutil

import ds4mlx  # noqa: F401
from ds4mlx.kernels import native

import pytest


@pytest.fixture(scope="module")
def ops():
    """The native CPU operations module (kernels/cpu_ops), built here; skips where it cannot be."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler: the native CPU operations cannot be built here")
    if os.environ.get("DS4MLX_KERNELS", "").lower() == "mlx":
        pytest.skip("DS4MLX_KERNELS=mlx turns the native operations off")
    module = native.native_ops()
    assert module is not None, "the native CPU operations failed to build (see stderr)"
    return module
