"""DS4MLX_KERNELS picks the packed-weight implementation once, at import."""

from __future__ import annotations

import os

from ds4mlx import kernels
from ds4mlx.kernels import metal, select_kernel_backend

import pytest


@pytest.mark.parametrize(
    ("choice", "metal_is_available", "expected"),
    [
        ("auto", True, "metal"),
        ("auto", False, "mlx"),
        ("", False, "mlx"),
        (" MLX ", True, "mlx"),
        ("metal", True, "metal"),
        ("mlx", False, "mlx"),
    ],
)
def test_select_kernel_backend(choice: str, metal_is_available: bool, expected: str):
    assert select_kernel_backend(choice, metal_is_available) == expected


def test_metal_without_metal_is_refused():
    with pytest.raises(ValueError, match="Metal is not available"):
        select_kernel_backend("metal", metal_is_available=False)


def test_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="expected one of auto, metal, mlx"):
        select_kernel_backend("cuda", metal_is_available=True)


def test_import_time_choice_follows_the_environment():
    choice = os.environ.get("DS4MLX_KERNELS", "auto")
    assert kernels.PACKED_KERNELS == select_kernel_backend(choice, metal.metal_available())
