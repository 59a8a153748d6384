"""The wheel carries what an installed ds4mlx needs: the shipped models and the Metal sources
(copied into the package by setup.py), the native operations' sources, and no test data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "ds4mlx", "assets", "metal")


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    """The file list of a wheel built from a copy of the source tree (the build writes its
    work folders beside the sources, which stay out of the checkout this way)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(
                path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
            )
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(path, source / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(root / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if built.returncode != 0:
        if "No matching distribution" in built.stderr or "Could not find" in built.stderr:
            pytest.skip("pip could not fetch the build backend (setuptools) to build a wheel")
        raise AssertionError(built.stderr[-2000:])
    (wheel,) = (root / "dist").glob("ds4mlx-*.whl")
    return set(zipfile.ZipFile(wheel).namelist())


def test_the_wheel_carries_the_models_and_kernel_sources(wheel_names):
    for model in sorted((REPO / "assets").glob("*.gguf")):
        assert f"ds4mlx/_data/assets/{model.name}" in wheel_names
    for kernel in sorted((REPO / "metal").glob("*.metal")):
        assert f"ds4mlx/_data/metal/{kernel.name}" in wheel_names
    # Every source the native build needs (the .cpp files, their headers, CMakeLists.txt).
    cpu_ops = sorted((REPO / "ds4mlx/kernels/cpu_ops").iterdir())
    assert {path.suffix for path in cpu_ops} >= {".cpp", ".h", ".txt"}
    for path in cpu_ops:
        assert f"ds4mlx/kernels/cpu_ops/{path.name}" in wheel_names
    assert {"ds4mlx/resources.py", "ds4mlx/py.typed"} <= wheel_names
    assert not any(name.startswith("tests/") for name in wheel_names)


def test_the_source_tree_finds_its_own_folders():
    from ds4mlx.resources import data_dir

    # An editable install (this checkout) reads the top-level folders.
    assert (data_dir("assets") / "ds4-tiny.gguf").is_file()
    assert (data_dir("metal") / "linear.metal").is_file()
